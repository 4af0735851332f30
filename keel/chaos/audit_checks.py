"""`keel audit`'s findings, and the checks that make them.

Each check turns what it looked at into findings: one line each, with its fix and a stable
`code`. Those that cannot run here (no database, no tokens set) say so as `Skipped`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, cast

from langchain_core.runnables import RunnableConfig

from keel.chaos.audit_code import AnyEffect, Reader, registered_without_version
from keel.core.effects.calls import token_keyword
from keel.core.effects.outbox import OutboxEffect
from keel.core.errors import KeelError
from keel.core.waits import DEFAULT_WAIT_TIMEOUT
from keel.core.workflows import Workflow
from keel.langgraph.graphs import checkpoint_misfits, compile_graph
from keel.runtime import preflight
from keel.runtime.app import App
from keel.runtime.runtime import Runtime


class Level(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


LEVELS = (Level.ERROR, Level.WARNING, Level.INFO)

IN_FLIGHT = ("queued", "running", "waiting")
RECENT_RUNS = 20
"""Most recent runs per workflow version whose checkpoints are compared with its graph."""
GRAPH_CHANGED = "version.graph-changed"


@dataclass(frozen=True)
class Finding:
    """One problem: what, where, and the one-line fix."""

    level: Level
    workflow: str | None
    """`name@version`, or None for the App as a whole (its lease, its API tokens)."""
    subject: str
    """The effect, node, run or token the finding is about."""
    code: str
    message: str
    fix: str

    def as_dict(self) -> dict[str, Any]:
        found = asdict(self)
        found["level"] = self.level.value
        return found


@dataclass(frozen=True)
class Skipped:
    """A check that could not run here, and why."""

    check: str
    reason: str


@dataclass
class AuditReport:
    app: str
    database: str | None
    workflows: list[str]
    findings: list[Finding] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def count(self, level: Level) -> int:
        return sum(1 for f in self.findings if f.level == level)

    def failed(self, strict: bool = False) -> bool:
        """Errors fail the audit; with `strict`, warnings too."""
        return bool(self.count(Level.ERROR) or (strict and self.count(Level.WARNING)))

    def by_workflow(self) -> Iterator[tuple[str | None, list[Finding]]]:
        """The findings grouped: each workflow in registration order, then the App's own."""
        for key in [*self.workflows, None]:
            found = [f for f in self.findings if f.workflow == key]
            if found:
                yield key, found

    def summary(self) -> str:
        e, w, i = (self.count(level) for level in LEVELS)
        what = "no findings" if not self.findings else f"{len(self.findings)} finding(s)"
        return (
            f"{what}: {e} error(s), {w} warning(s), {i} info in {len(self.workflows)} "
            f"workflow(s)" + (f"; {len(self.skipped)} check(s) skipped" if self.skipped else "")
        )

    def as_dict(self, strict: bool = False) -> dict[str, Any]:
        return {
            "app": self.app,
            "database": self.database,
            "workflows": self.workflows,
            "ok": not self.failed(strict),
            "strict": strict,
            "counts": {level.value: self.count(level) for level in LEVELS},
            "findings": [f.as_dict() for f in self.findings],
            "skipped": [asdict(s) for s in self.skipped],
        }


# -- a workflow's registration, its nodes and their effects -----------------------------------


def version_findings(workflow: Workflow) -> list[Finding]:
    if not registered_without_version(workflow):
        return []
    return [
        Finding(
            Level.WARNING,
            workflow.key,
            workflow.name,
            "version.unpinned",
            f"workflow {workflow.name!r} is registered without version=, so it is version "
            f"{workflow.version!r} whatever its graph: a changed graph would resume runs "
            "checkpointed by the old one",
            f'pin it: @app.workflow("{workflow.name}", version="{workflow.version}"), and '
            "register a new version beside it when the graph changes",
        )
    ]


def node_findings(key: str, node: str, reader: Reader) -> list[Finding]:
    """The network calls outside effects and the waits without a deadline `reader` found."""
    findings: list[Finding] = []
    uses: dict[str, list[str]] = {}
    for client in reader.clients:
        # `smtplib` then `smtplib.SMTP`: one use, named by its longest spelling.
        named = uses.setdefault(client.client, [])
        spelled = f"{client.named} in {client.where}"
        named[:] = [n for n in named if not spelled.startswith(n.split(" in ")[0] + ".")]
        if not any(n.startswith(client.named + ".") for n in named) and spelled not in named:
            named.append(spelled)
    for used, named in uses.items():
        findings.append(
            Finding(
                Level.WARNING,
                key,
                node,
                "effect.outside-ledger",
                f"node {node!r} uses {used} ({', '.join(named)}) outside any effect: a "
                "crash or retry re-runs the node and repeats the call",
                "move the call into a @keel.effect function and call that from the node "
                "(a read-only call may stay)",
            )
        )
    for wait in reader.waits:
        if wait.kind == "approval":
            label = f"keel.approval({wait.name!r})" if wait.name else "keel.approval()"
            findings.append(
                Finding(
                    Level.WARNING,
                    key,
                    node,
                    "wait.approval-no-timeout",
                    f"node {node!r} calls {label} in {wait.where} without timeout=: it relies on "
                    "the default deadline (24h, then on_timeout)",
                    "say how long a person has: keel.approval(..., timeout='24h', "
                    "on_timeout='escalate'|'reject'|'cancel')",
                )
            )
        else:
            days = DEFAULT_WAIT_TIMEOUT / 86400
            findings.append(
                Finding(
                    Level.WARNING,
                    key,
                    node,
                    "wait.interrupt-no-deadline",
                    f"node {node!r} pauses on LangGraph's interrupt() in {wait.where}, which "
                    f"declares no deadline: Keel applies its default ({days:g} days, then the "
                    "run fails)",
                    "use keel.approval(name, timeout=..., on_timeout=...) for a decision with "
                    "a deadline and a policy",
                )
            )
    return findings


def effect_findings(
    key: str, effect: AnyEffect, lease_ttl: float, default_timeout: float
) -> list[Finding]:
    """An effect's protection against a second call, and its timeout against the lease TTL."""
    name = str(effect.name)
    kind = "outbox effect" if isinstance(effect, OutboxEffect) else "effect"
    idempotent, reconcile = effect.options.provider_idempotent, effect.options.reconcile
    findings: list[Finding] = []
    if reconcile is not None and not idempotent and token_keyword(effect.fn) is None:
        findings.append(
            Finding(
                Level.WARNING,
                key,
                name,
                "effect.reconcile-only",
                f"{kind} {name!r} relies on its reconciler alone: a provider that commits late, "
                "after its client gave up, can still make it happen twice",
                "for money, use provider_idempotent=True (send idempotency_key to the "
                "provider) or take fencing_token and pass it to a provider that refuses stale "
                "writers",
            )
        )
    elif reconcile is None and not idempotent:
        findings.append(
            Finding(
                Level.INFO,
                key,
                name,
                "effect.in-doubt-on-crash",
                f"{kind} {name!r} has no reconciler and its provider does not dedupe: a crash "
                "mid-call leaves it in_doubt until a person resolves it",
                "give it reconcile= (look the key up at the provider) or "
                "provider_idempotent=True if the provider dedupes by idempotency_key",
            )
        )
    if effect.options.timeout is None:
        findings.append(
            Finding(
                Level.WARNING,
                key,
                name,
                "effect.no-timeout",
                f"{kind} {name!r} declares no timeout (the App's default, {default_timeout:g}s): "
                "its caller never abandons a call, so one that outlives that deadline while "
                "its run changes owner (a partition, a deploy) can be made twice",
                f'declare the longest a call may take: @keel.effect("{name}", timeout=SECONDS)',
            )
        )
    elif effect.timeout > lease_ttl:
        findings.append(
            Finding(
                Level.WARNING,
                key,
                name,
                "lease.shorter-than-effect",
                f"the lease TTL ({lease_ttl:g}s) is shorter than the timeout of {kind} "
                f"{name!r} ({effect.timeout:g}s): a call can outlive its lease, and the run's "
                "new owner must wait the effect's deadline anyway",
                f"raise the lease TTL above {effect.timeout:g}s (keel.App(lease_ttl=...) or "
                "$KEEL_LEASE_TTL) or shorten the effect's timeout",
            )
        )
    return findings


# -- graphs changed under the same version (a database) ---------------------------------------


def drift_findings(
    app: App, workflows: list[Workflow], url: str, skipped: list[Skipped]
) -> list[Finding]:
    """Recorded runs whose checkpoint the graph registered under their version no longer fits;
    the database at `url` is read, never written."""
    if not workflows:
        return []
    try:
        preflight.check_database(url, existing=True)
    except KeelError as exc:
        skipped.append(Skipped(GRAPH_CHANGED, f"{exc} (pass --db URL to compare recorded runs)"))
        return []
    own = url == app.url
    target = app if own else App(url)
    try:
        state = preflight.schema_state(target, timeout=10.0)
        if not state.ready:
            skipped.append(Skipped(GRAPH_CHANGED, f"{state.database}: {state.reason}"))
            return []
        runtime = target.aio.runtime
        return runtime.portal.call(_drift_of(runtime, workflows))
    except Exception as exc:
        if not _unavailable(exc):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        skipped.append(
            Skipped(GRAPH_CHANGED, f"the database did not answer: {preflight.redact(first)}")
        )
        return []
    finally:
        if not own:
            target.close()


def _unavailable(exc: BaseException) -> bool:
    """A database that cannot answer (not a bug in the audit)."""
    module = type(exc).__module__ or ""
    return isinstance(exc, KeelError | OSError | sqlite3.Error) or module.startswith(
        ("psycopg", "psycopg_pool")
    )


async def _drift_of(runtime: Runtime, workflows: list[Workflow]) -> list[Finding]:
    await runtime.open()
    saver = runtime.fencing()
    findings: list[Finding] = []
    for workflow in workflows:
        graph = compile_graph(workflow, checkpointer=saver)
        channels = set(graph.channels)
        runs: dict[str, dict[str, Any]] = {}
        for status in IN_FLIGHT:
            for row in await runtime.store.browse_runs(
                status=status, workflow=workflow.name, limit=200
            ):
                runs[str(row["run_id"])] = row
        for row in await runtime.store.browse_runs(workflow=workflow.name, limit=RECENT_RUNS):
            runs.setdefault(str(row["run_id"]), row)
        lacking: dict[str, list[str]] = {}
        for run_id, row in runs.items():
            if str(row["workflow_version"]) != workflow.version:
                continue
            if row["status"] in IN_FLIGHT:
                problems = await checkpoint_misfits(graph, saver, run_id)
                if problems:
                    findings.append(
                        Finding(
                            Level.ERROR,
                            workflow.key,
                            run_id,
                            GRAPH_CHANGED,
                            f"run {run_id} ({row['status']}) was checkpointed by another graph "
                            f"under {workflow.key}: its checkpoint does not fit this one "
                            f"({'; '.join(problems)})",
                            "register the changed graph as a new version beside the old one "
                            "(version=...), so this run finishes on the graph it started on",
                        )
                    )
                    continue
            missing = await _unknown_channels(saver, run_id, channels)
            if missing:
                lacking[run_id] = missing
        if lacking:
            run_id, missing = next(iter(lacking.items()))
            more = f" (and {len(lacking) - 1} other run(s))" if len(lacking) > 1 else ""
            findings.append(
                Finding(
                    Level.WARNING,
                    workflow.key,
                    workflow.name,
                    GRAPH_CHANGED,
                    f"the graph registered as {workflow.key} changed under the same version: "
                    f"run {run_id}'s checkpoint{more} names {', '.join(missing)}, which this "
                    "graph lacks",
                    "give a changed graph a new version (version=...) and keep the old one "
                    "registered while its runs finish",
                )
            )
    return findings


async def _unknown_channels(saver: Any, run_id: str, channels: set[str]) -> list[str]:
    """The nodes and state keys the run's latest checkpoint names and the graph lacks."""
    config = cast(RunnableConfig, {"configurable": {"thread_id": run_id}})
    saved = await saver.aget_tuple(config)
    if saved is None:
        return []
    names = set(saved.checkpoint.get("channel_versions", {})) - channels
    missing = []
    for name in sorted(names):
        if name.startswith("__"):
            continue
        if name.startswith("branch:to:"):
            missing.append(f"node {name.removeprefix('branch:to:')!r}")
        elif ":" not in name:
            missing.append(f"state key {name!r}")
    return missing


# -- API tokens -------------------------------------------------------------------------------


def token_findings(env: Mapping[str, str], skipped: list[Skipped]) -> list[Finding]:
    """Weak or unreadable tokens in $KEEL_API_TOKENS, a weak $KEEL_TOKEN_SECRET."""
    # Imported here: keel.service brings FastAPI, which the rest of the audit does not need.
    from keel.service import auth

    findings: list[Finding] = []
    text = env.get(auth.ENV, "")
    if not text.strip():
        skipped.append(
            Skipped(
                "token.weak",
                f"${auth.ENV} is not set here: set it as in production to check its tokens",
            )
        )
    else:
        try:
            tokens = auth.parse_tokens(text)
        except KeelError as exc:
            tokens = {}
            findings.append(
                Finding(
                    Level.ERROR,
                    None,
                    f"${auth.ENV}",
                    "token.invalid",
                    str(exc),
                    "write it as TOKEN=SCOPE[,SCOPE...] entries separated by ';' "
                    "(see docs/http.md)",
                )
            )
        for number, (token, scopes) in enumerate(tokens.items(), start=1):
            reason = auth.weak_token_reason(token)
            if reason is None:
                continue
            shown = ",".join(sorted(scopes)) or "no scopes"
            findings.append(
                Finding(
                    Level.ERROR,
                    None,
                    f"token {number} of {len(tokens)} ({shown})",
                    "token.weak",
                    f"${auth.ENV}: token {number} of {len(tokens)} ({shown}) is too weak: {reason}",
                    f"replace it with a random one: {auth.MAKE_ONE}",
                )
            )
    secret = env.get(auth.SECRET_ENV, "")
    if secret:
        reason = auth.weak_token_reason(secret)
        if reason is not None:
            findings.append(
                Finding(
                    Level.ERROR,
                    None,
                    f"${auth.SECRET_ENV}",
                    "token.weak",
                    f"${auth.SECRET_ENV} is too weak: {reason}",
                    f"replace it with a random one: {auth.MAKE_ONE}",
                )
            )
    return findings
