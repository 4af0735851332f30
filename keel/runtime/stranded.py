"""Runs that wait for a workflow version no live worker executes: found for `stranded_runs`
and the console, and said once per run by the worker that serves their workflow."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from keel.core import versions
from keel.core.store.base import Row
from keel.core.store.store import Store

log = logging.getLogger("keel.runtime.worker")
LIVE_HEARTBEATS = 3
"""Heartbeat intervals since its last within which a worker counts as live."""


DEAD_LEASES = 3
"""Lease TTLs since its last heartbeat past which a silent worker is shown dead."""


def live_window(heartbeat_interval: float) -> float:
    """Seconds since its last heartbeat within which a worker counts as live."""
    return LIVE_HEARTBEATS * heartbeat_interval


def dead_after(lease_ttl: float, heartbeat_interval: float) -> float:
    """Seconds of silence past which a worker counts as dead. By then every lease it held has
    lapsed, free for other workers to take over; one merely cut off from its database that
    long has lost its runs all the same (it comes back live and finds them taken), so "dead"
    is what it is to the cluster. Never inside the live window, whatever the settings."""
    return max(DEAD_LEASES * lease_ttl, live_window(heartbeat_interval))


@dataclass(frozen=True)
class Serving:
    """What the workers serve: versions by workflow name, and the versions they refuse (key ->
    what differs from the graph the version was first served with); see keel.core.versions."""

    versions: dict[str, set[str]]
    refused: dict[str, str]

    def is_stranded(self, run: Row) -> bool:
        return versions.is_stranded(run, self.versions)

    def reason(self, run: Row) -> str | None:
        """Why the run is stranded, in one line (None: it is not)."""
        return versions.stranded_reason(run, self.versions, self.refused)


async def served(store: Store, live_window: float) -> Serving:
    """What live workers serve (the last one seen, for a workflow none serves now)."""
    workers = await store.served_workflows(live_window)
    return Serving(versions.served_versions(workers), versions.refusals(workers))


async def stranded_runs(
    store: Store, live_window: float, names: list[str] | None, limit: int = 100
) -> list[Row]:
    """Stranded runs of workflows `names` (None: all), oldest first, each with its
    `stranded_reason`."""
    serving = await served(store, live_window)
    names = sorted(serving.versions) if names is None else names
    keys = sorted(f"{name}@{v}" for name, vs in serving.versions.items() for v in vs)
    rows = await store.other_versions(names, keys, limit)
    found = [row for row in rows if serving.is_stranded(row)]
    for row in found:
        row["stranded"], row["stranded_reason"] = True, serving.reason(row)
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
            "run %s (%s) is stranded: %s; this worker serves %s",
            run["run_id"],
            run["status"],
            run["stranded_reason"],
            ", ".join(keys) or "none",
        )
