"""Runs that wait for a workflow version no live worker executes: said once per run."""

from __future__ import annotations

import logging

from keel.runtime.runtime import Runtime

log = logging.getLogger("keel.runtime.worker")


async def report_stranded(rt: Runtime, logged: set[str]) -> None:
    """Say once per run (`logged` holds those said) when a run of one of the runtime's
    workflows waits for a version that no worker serves: it would otherwise look merely
    queued, forever."""
    keys = rt.workflows.keys()
    names = sorted({key.rpartition("@")[0] for key in keys})
    try:
        stranded = await rt.stranded_runs_of(names)
    except Exception:
        log.exception("looking for stranded runs failed; the next pass retries")
        return
    for run in stranded:
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
