"""The invariants checked after every cell, against the clean run."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import keel
from keel.chaos.world import Delivery, World


@dataclass
class Outcome:
    status: str
    decision: str
    termination_reason: str | None
    effects: dict[str, int]
    """Per effect name, how many keys ended sent or confirmed."""
    unsettled: list[str]
    """Keys left pending, in doubt or failed."""
    world: dict[str, int]
    """What the outside world received (SMTP messages, HTTP deliveries) during the run."""
    artifacts: dict[str, str]
    """Artifact name -> 'ok', 'empty' or 'unparseable JSON' (content may legitimately differ
    between runs, e.g. a Date header; completeness and parseability may not)."""
    stale_writes: list[str]
    killed: bool = False
    killed_running: bool = False
    takeover: bool = False
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    """The run's error, if it failed."""
    deliveries: list[Delivery] = field(default_factory=list)
    """What the outside world received, in order."""
    keys: dict[str, int] = field(default_factory=dict)
    """Per effect name, how many ledger keys it has in any status."""
    fault_problems: list[str] = field(default_factory=list)
    """What the fault kind saw break while it held the worker (keel.chaos.kinds)."""


def observe(
    app: keel.App, run_id: str, world: World, killed: bool, killed_running: bool
) -> Outcome:
    details = app.get_run(run_id)
    done = Counter(e["name"] for e in details.effects if e["status"] in ("sent", "confirmed"))
    unsettled = [
        f"{e['idempotency_key']} ({e['status']})"
        for e in details.effects
        if e["status"] not in ("sent", "confirmed")
    ]
    # Outbox intents count as effects too: each delivered once, none left undelivered.
    done.update(f"outbox:{i['effect']}" for i in details.intents if i["status"] == "delivered")
    unsettled += [
        f"{i['intent_id']} ({i['status']})" for i in details.intents if i["status"] != "delivered"
    ]
    artifacts = {}
    for info in details.artifacts:
        data = info.path.read_bytes()
        state = "ok" if data else "empty"
        if info.name.endswith(".json"):
            try:
                json.loads(data)
            except ValueError:
                state = "unparseable JSON"
        artifacts[info.name] = state
    return Outcome(
        status=details.status,
        decision=details.decision,
        termination_reason=details.termination_reason,
        effects=dict(done),
        unsettled=unsettled,
        world=world.counts(),
        artifacts=artifacts,
        stale_writes=stale_writes(details.timeline),
        killed=killed,
        killed_running=killed_running,
        takeover=any(e["kind"] == "lease.takeover" for e in details.timeline),
        error=details.run.get("error"),
        deliveries=world.deliveries(),
        keys=dict(Counter(e["name"] for e in details.effects)),
    )


def stale_writes(timeline: list[dict[str, Any]]) -> list[str]:
    """Events written under a lease token older than one that already wrote."""
    highest, found = 0, []
    for event in timeline:
        token = event["lease_token"]
        if token is None:
            continue
        if token < highest:
            found.append(f"{event['kind']} under token {token} after token {highest}")
        highest = max(highest, token)
    return found


def compare(clean: Outcome, cell: Outcome) -> list[str]:
    problems = []
    for what in ("status", "decision", "termination_reason"):
        if getattr(cell, what) != getattr(clean, what):
            problems.append(f"{what} {getattr(cell, what)!r}, clean run {getattr(clean, what)!r}")
    if cell.unsettled:
        problems.append("ledger keys not settled: " + ", ".join(cell.unsettled))
    if cell.effects != clean.effects:
        problems.append(f"effects performed {cell.effects}, clean run {clean.effects}")
    for probe, count in clean.world.items():
        if cell.world.get(probe, 0) != count:
            problems.append(f"{probe}: {cell.world.get(probe, 0)}, clean run {count}")
    if cell.artifacts != clean.artifacts:
        problems.append(f"artifacts {cell.artifacts}, clean run {clean.artifacts}")
    problems.extend(f"stale write: {w}" for w in cell.stale_writes)
    problems.extend(cell.fault_problems)
    if cell.killed_running and not cell.takeover:
        problems.append("the worker died holding the run but the timeline shows no takeover")
    return problems
