"""Retention: delete finished runs older than a cut-off, with everything they left behind.

A run's rows live in Keel's tables (the run, its timeline, ledger, waits, outbox intents) and in
LangGraph's checkpoint tables; its files in its artifacts folder. `prune` deletes them in
batches, one short transaction each, so workers keep claiming and writing between batches (on
SQLite a batch holds the write lock for milliseconds, on PostgreSQL it skips rows a writer
holds). Only finished runs (completed, failed, cancelled) are ever candidates: a queued,
running or waiting run is never touched, whatever its age. A failed run can still be resumed
until it is pruned: `keep_failed` keeps them all. Two kinds of row outlive their run: an outbox
intent not yet delivered, and the ledger row of a `key=` effect on a thread, which the thread's
later runs are served for as long as the thread exists (it goes with the thread).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from keel.core.artifacts import RunArtifacts
from keel.core.clock import LONGEST
from keel.core.errors import UsageError
from keel.core.faults import fault_point
from keel.core.lifecycle import FINISHED, Status
from keel.core.services import Services

log = logging.getLogger("keel.retention")
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str | float) -> float:
    """Seconds from `30d`, `12h`, `90m`, `3600` (seconds) or a number."""
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        found = _AGE.match(text)
        if not found:
            raise UsageError(
                f"age {text!r} is not a number followed by s, m, h, d or w (e.g. 30d, 12h)"
            )
        seconds = float(found.group(1)) * _UNIT[found.group(2)]
    if not seconds > 0:  # NaN included
        raise UsageError(f"age {text!r} must be more than zero")
    if seconds > LONGEST:
        raise UsageError(f"age {str(text)[:40]!r} is longer than a century")
    return seconds


def _finite(seconds: float, given: object) -> float:
    # `nan` dropped the filter (every run listed), `1e400` read as the end of time.
    if not math.isfinite(seconds):
        raise UsageError(
            f"time {str(given)[:40]!r} is not a moment (epoch seconds, 2h, an ISO date)"
        )
    return seconds


def parse_moment(text: str | float | None, now: float) -> float | None:
    """A moment (epoch seconds) from `2h`, `7d` (that long before `now`), an ISO date or time
    (`2026-08-07`, `2026-08-07T09:30`; UTC unless it says otherwise) or epoch seconds."""
    if text is None:
        return None
    if isinstance(text, int | float):
        return _finite(float(text), text)
    text = text.strip()
    if not text:
        return None
    if _AGE.match(text) and not text.replace(".", "", 1).isdigit():
        return now - parse_age(text)
    try:
        return _finite(float(text), text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"time {text!r} is neither an age (2h, 7d) nor an ISO date or time "
            "(2026-08-07T09:30, UTC unless it says otherwise)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def finished_statuses(statuses: list[str] | None, keep_failed: bool) -> list[str]:
    """The statuses a prune may delete: finished ones only, whatever was asked."""
    wanted = statuses or [s.value for s in FINISHED]
    for status in wanted:
        if status not in {s.value for s in Status}:
            raise UsageError(f"unknown status {status!r}")
        if status not in {s.value for s in FINISHED}:
            raise UsageError(
                f"only finished runs can be pruned (completed, failed, cancelled), not {status!r}"
            )
    return sorted(s for s in set(wanted) if not (keep_failed and s == Status.FAILED))


@dataclass
class PruneReport:
    """What a prune deleted (or, for a dry run, would delete: `runs` only)."""

    dry_run: bool
    before: float
    statuses: list[str]
    runs: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    folders: int = 0
    batches: int = 0
    run_ids: list[str] = field(default_factory=list)
    """The pruned (or, dry, the would-be pruned) runs' ids, at most the first 1000."""


async def prune(
    services: Services,
    *,
    older_than: str | float,
    statuses: list[str] | None = None,
    keep_failed: bool = False,
    dry_run: bool = False,
    batch_size: int = 200,
    pause: float = 0.01,
) -> PruneReport:
    """Delete finished runs that finished more than `older_than` ago (see the module doc)."""
    if batch_size < 1:
        raise UsageError("batch_size must be at least 1")
    age = parse_age(older_than)
    wanted = finished_statuses(statuses, keep_failed)
    store = services.store
    # The database's clock wrote `finished_at` and judges the cut-off, as it judges leases.
    before = await store.database_now() - age
    report = PruneReport(dry_run=dry_run, before=before, statuses=wanted)
    if not wanted:
        return report
    started = time.monotonic()
    if dry_run:
        rows = await store.prune_candidates(wanted, age, 1_000_000)
        report.runs = len(rows)
        report.run_ids = [r["run_id"] for r in rows[:1000]]
        return report
    report.folders += await _remove_folders(services, batch_size)  # a crashed prune's leftovers
    while True:
        async with store.transaction() as tx:
            ids, counts = await store.prune_batch(tx, wanted, age, batch_size)
        if not ids:
            break
        fault_point("prune.after_commit")
        report.batches += 1
        report.runs += len(ids)
        for table, n in counts.items():
            report.rows[table] = report.rows.get(table, 0) + n
        if len(report.run_ids) < 1000:
            report.run_ids += ids[: 1000 - len(report.run_ids)]
        report.folders += await _remove_folders(services, batch_size)
        if len(ids) < batch_size:
            break
        await asyncio.sleep(pause)  # let workers' transactions in between batches
    log.info(
        "pruned %d runs finished before %s in %d batches (%d artifact folders)",
        report.runs,
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(before)),
        report.batches,
        report.folders,
        extra={"event": "prune", "duration": round(time.monotonic() - started, 6)},
    )
    return report


async def _remove_folders(services: Services, batch_size: int) -> int:
    """Remove the artifact folders of pruned runs; return how many existed.

    The batch that deleted a run's rows recorded its folder in the same transaction, and the
    record goes only once the folder is gone: a prune killed in between leaves no orphan folder
    that no later prune could find (the run's rows that named it are gone).
    """
    removed = 0
    while run_ids := await services.store.pruned_folders(batch_size):
        for run_id in run_ids:
            folder = RunArtifacts(services.artifacts_root, run_id).folder
            if folder.exists():
                await asyncio.to_thread(shutil.rmtree, folder, True)
                removed += 1
        await services.store.forget_pruned_folders(run_ids)
    return removed
