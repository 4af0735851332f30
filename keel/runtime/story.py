"""Where a run's time went, and where its story turned: the summary's time split and marks.

Time is split four ways, in total and per node: queued (admitted or given back, no worker yet),
running (held by a worker), waiting for a person, and lost (from a dead or crashed attempt's
last record to the takeover that resumed it). Queued and lost time go to the node the next
attempt ran first (the one that waited for a worker), waiting time to the node that asked.
A pure function of the timeline, like the rest of keel.runtime.summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Nodes LangGraph adds around the user's graph: their writes are not the user's steps.
_INTERNAL = frozenset({"__start__", "__end__"})


@dataclass
class NodeTime:
    """Seconds one node (namespace/node in a subgraph) spent in each state, over the run."""

    node: str
    queued: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    lost: float = 0.0
    executions: int = 0

    @property
    def total(self) -> float:
        return self.queued + self.running + self.waiting + self.lost


@dataclass(frozen=True)
class Mark:
    """A crash, a takeover, a resume: where the run's story turned."""

    at: float
    kind: str  # crash, infrastructure, takeover, lease_lost, resumed, failed
    text: str
    worker_id: str | None = None
    lease_token: int | None = None


def story(
    timeline: list[dict[str, Any]], run: dict[str, Any], now: float, held: float
) -> tuple[NodeTime, list[NodeTime], list[Mark]]:
    """The run's time split four ways, in total and per node, and the marks of its turns;
    `held` is how long its attempts held a lease, in all."""
    total = NodeTime("(run)")
    nodes: dict[str, NodeTime] = {}
    marks: list[Mark] = []
    queued_since: float | None = run["created_at"]
    waiting_since: float | None = None
    waiting_node: str | None = None
    cursor: float | None = None
    last_node: str | None = None
    carry_queued = carry_lost = 0.0  # for the next attempt's first node
    claims = 0
    resumes_waiter = False  # the next claim resumes the node that waited for a person

    def node(label: str) -> NodeTime:
        return nodes.setdefault(label, NodeTime(label))

    for event in timeline:
        kind, at = event["kind"], float(event["at"])
        token, worker = event["lease_token"], event["worker_id"]
        data = event["data"] or {}
        if kind in ("lease.claimed", "lease.takeover"):
            if queued_since is not None:
                total.queued += at - queued_since
                carry_queued += at - queued_since
                queued_since = None
            if kind == "lease.takeover" and cursor is not None:
                total.lost += at - cursor
                carry_lost += at - cursor
            claims += 1
            if kind == "lease.takeover" or claims > 1:
                # A resume after a wait goes on in the node that asked; any other, after the
                # last node whose writes were recorded.
                where = f" {'in' if resumes_waiter else 'after'} {last_node}" if last_node else ""
                text = (
                    f"{worker} took the run over{where}: the previous lease expired"
                    if kind == "lease.takeover"
                    else f"{worker} resumed the run{where}"
                )
                marks.append(
                    Mark(
                        at,
                        "takeover" if kind == "lease.takeover" else "resumed",
                        text,
                        worker,
                        token,
                    )
                )
            cursor, resumes_waiter = at, False
        elif kind == "step":
            label = str(data.get("node", "?"))
            label = f"{data['namespace']}/{label}" if data.get("namespace") else label
            if data.get("node") not in _INTERNAL and cursor is not None:
                n = node(label)
                n.running += at - cursor
                n.executions += 1
                n.queued += carry_queued
                n.lost += carry_lost
                carry_queued = carry_lost = 0.0
                last_node = label
            cursor = at
        elif kind in ("attempt.crashed", "attempt.interrupted", "attempt.failed", "lease.lost"):
            where = f" after {last_node}" if last_node else ""
            error = str(data.get("error") or "").splitlines()
            detail = f": {error[-1][:200]}" if error else ""
            what = {
                "attempt.crashed": ("crash", f"the attempt crashed{where}{detail}"),
                "attempt.interrupted": (
                    "infrastructure",
                    f"an infrastructure fault{where}{detail}",
                ),
                "attempt.failed": (
                    "failed",
                    f"gave up after {data.get('attempt')} attempts{detail}",
                ),
                "lease.lost": ("lease_lost", f"{worker} found its lease taken over and stopped"),
            }[kind]
            marks.append(Mark(at, what[0], what[1], worker, token))
        elif kind == "status.waiting":
            waiting_since, waiting_node, cursor = at, last_node, None
            resumes_waiter = True
        elif kind.startswith("status."):
            if waiting_since is not None:
                total.waiting += at - waiting_since
                if waiting_node is not None:
                    node(waiting_node).waiting += at - waiting_since
                waiting_since = None
            if kind == "status.queued":
                queued_since = at
            if kind != "status.running":
                cursor = None
    if queued_since is not None and run["status"] == "queued":
        total.queued += now - queued_since
    if waiting_since is not None:
        total.waiting += now - waiting_since
        if waiting_node is not None:
            node(waiting_node).waiting += now - waiting_since
    total.running = max(0.0, held - total.lost)
    total.executions = sum(n.executions for n in nodes.values())
    return total, list(nodes.values()), marks
