"""Workflow versions: a run resumes on the version it started on; moving it is explicit.

Workers say which workflow keys (`name@version`) they execute when they heartbeat. A run is
*stranded* when it still needs a worker (queued, running or waiting) but the workers that serve
its workflow serve other versions: the live ones, or, when none of them is live, the last one
seen (the deployment that is down now). A workflow no worker ever served is not stranded, only
not started. Stranded is derived when a run is read, never stored: it ends by itself when a
worker of that version comes back, or when `upgrade()` moves the run to a served version.
"""

from __future__ import annotations

from collections.abc import Iterable

from keel.core.codec import loads
from keel.core.errors import RunFinished, RunNotFound, UsageError
from keel.core.lifecycle import Status
from keel.core.store.base import Row
from keel.core.store.store import Store

NEEDS_A_WORKER = (Status.QUEUED, Status.RUNNING, Status.WAITING)
UPGRADABLE = (Status.QUEUED, Status.WAITING)


def served_versions(workers: Iterable[Row]) -> dict[str, set[str]]:
    """Workflow name -> the versions its workers serve, from `served_workflows` rows (most
    recently seen first): the live workers' versions, else the last worker's. A worker that
    refuses a version (its graph differs from the one the version was first served with) counts
    for the workflow's name and serves none of it."""
    live: dict[str, set[str]] = {}
    last: dict[str, set[str]] = {}
    for worker in workers:
        by_name: dict[str, set[str]] = {}
        for key in [*loads(worker["workflows"]), *refusals([worker])]:
            by_name.setdefault(str(key).rpartition("@")[0], set())
        for key in loads(worker["workflows"]):
            name, _, version = str(key).rpartition("@")
            by_name[name].add(version)
        for name, versions in by_name.items():
            if worker["live"]:
                live.setdefault(name, set()).update(versions)
            else:
                last.setdefault(name, versions)
    return {name: live[name] if name in live else last[name] for name in live.keys() | last.keys()}


def refusals(workers: Iterable[Row]) -> dict[str, str]:
    """Workflow key -> why a worker refuses it (the first worker that says so, most recently
    seen first), from `served_workflows` rows."""
    found: dict[str, str] = {}
    for worker in workers:
        for key, why in loads(worker.get("refused") or "{}").items():
            found.setdefault(str(key), str(why))
    return found


def is_stranded(run: Row, served: dict[str, set[str]]) -> bool:
    """Whether the run needs a worker of a version that no worker serves."""
    if run["status"] not in NEEDS_A_WORKER:
        return False
    versions = served.get(str(run["workflow"]))
    return versions is not None and str(run["workflow_version"]) not in versions


def stranded_reason(run: Row, served: dict[str, set[str]], refused: dict[str, str]) -> str | None:
    """Why the run is stranded, in one line (None: it is not)."""
    if not is_stranded(run, served):
        return None
    key = f"{run['workflow']}@{run['workflow_version']}"
    if key in refused:
        return (
            f"workers refuse {key}: its graph differs from the one version "
            f"{run['workflow_version']} was first served with ({refused[key]}); serve the "
            f"original graph, or give the edited one a new version and `keel runs upgrade`"
        )
    others = ", ".join(sorted(served.get(str(run["workflow"]), ()))) or "none"
    return (
        f"no live worker executes {key} (they serve versions: {others}); move it with "
        f"`keel runs upgrade {run['run_id']} --to VERSION`"
    )


async def upgrade(
    store: Store,
    run_id: str,
    to_version: str,
    *,
    seen: Row,
    by: str | None,
) -> Row:
    """Move a queued or waiting run to `to_version` of its workflow, with a `run.upgraded`
    event; `seen` is the run as the caller checked its checkpoint against the new version, and
    the move is refused if the run changed since (claimed, resumed, decided)."""
    async with store.transaction() as tx:
        run = await store.lock_run(tx, run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        if Status(run["status"]) not in UPGRADABLE:
            raise _not_upgradable(run)
        if run["updated_at"] != seen["updated_at"] or run["status"] != seen["status"]:
            raise UsageError(
                f"run {run_id} changed while its checkpoint was checked ({seen['status']} -> "
                f"{run['status']}): upgrade it again"
            )
        moved = await store.set_run_version(tx, run_id, to_version)
        assert moved is not None
        await store.add_event(
            tx,
            run_id,
            "run.upgraded",
            {"from": run["workflow_version"], "to": to_version, "by": by},
        )
        await store.notify_wake(tx, run_id)
    return moved


def check_upgradable(run: Row, to_version: str) -> None:
    """UsageError/RunFinished unless the run may move to `to_version` at all."""
    if Status(run["status"]) not in UPGRADABLE:
        raise _not_upgradable(run)
    if str(run["workflow_version"]) == to_version:
        raise UsageError(f"run {run['run_id']} is already on version {to_version}")


def _not_upgradable(run: Row) -> Exception:
    status = Status(run["status"])
    if status.finished:
        return RunFinished(f"run {run['run_id']} is {status.value}: there is nothing to upgrade")
    return UsageError(
        f"run {run['run_id']} is {status.value}: only a queued or waiting run can be upgraded "
        "(a running run is mid-step on its version; stop its worker or wait for it to pause)"
    )
