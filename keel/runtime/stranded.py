"""Runs that wait for a workflow version no live worker executes: found for `stranded_runs`
and the console, and said once per run by the worker that serves their workflow."""

from __future__ import annotations

import logging

from keel.core import versions
from keel.core.store.base import Row
from keel.core.store.store import Store

log = logging.getLogger("keel.runtime.worker")
LIVE_HEARTBEATS = 3
"""Heartbeat intervals since its last within which a worker counts as live."""


def live_window(heartbeat_interval: float) -> float:
    """Seconds since its last heartbeat within which a worker counts as live."""
    return LIVE_HEARTBEATS * heartbeat_interval


async def served(store: Store, live_window: float) -> dict[str, set[str]]:
    """Workflow name -> the versions its live workers serve (see `keel.core.versions`)."""
    return versions.served_versions(await store.served_workflows(live_window))


async def stranded_runs(
    store: Store, live_window: float, names: list[str] | None, limit: int = 100
) -> list[Row]:
    """Stranded runs of workflows `names` (None: all), oldest first."""
    by_name = await served(store, live_window)
    names = sorted(by_name) if names is None else names
    keys = sorted(f"{name}@{v}" for name, vs in by_name.items() for v in vs)
    rows = await store.other_versions(names, keys, limit)
    found = [row for row in rows if versions.is_stranded(row, by_name)]
    for row in found:
        row["stranded"] = True
    return found


async def report_stranded(
    store: Store, live_window: float, keys: list[str], logged: set[str]
) -> None:
    """Say once per run (`logged` holds those said) when a run of one of the worker's workflows
    (`keys`) waits for a version that no worker serves: it would otherwise look merely queued,
    forever."""
    names = sorted({key.rpartition("@")[0] for key in keys})
    try:
        found = await stranded_runs(store, live_window, names)
    except Exception:
        log.exception("looking for stranded runs failed; the next pass retries")
        return
    for run in found:
        if run["run_id"] in logged:
            continue
        logged.add(run["run_id"])
        log.warning(
            "run %s (%s) is stranded on %s@%s: no live worker executes that version (this "
            "one has %s); move it with `keel runs upgrade %s --to VERSION`",
            run["run_id"],
            run["status"],
            run["workflow"],
            run["workflow_version"],
            ", ".join(keys),
            run["run_id"],
        )
