"""A scheduler's pass: the due schedules claimed, their ticks fired in one transaction.

Most due schedules are plain: no thread, no tick held back by `overlap="enqueue"`. Their ticks
are planned here from the claimed rows alone (the claim reads each one's last run's status, all
`overlap` needs) and written for the whole batch in two statements (`Store.fire_ticks`): a
thousand ticks due at once cost a few round trips per `CLAIM_BATCH` schedules, not four per
tick. The others (a schedule on a thread, or holding queued ticks) take the general path,
`fire_schedule`, in the same transaction. Either way a tick's record is keyed by (schedule,
tick) and its run's id derives from them: the database still refuses a second of either.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

from keel.core.codec import dumps
from keel.core.ids import input_hash, run_id
from keel.core.schedules import (
    CLAIM_BATCH,
    MAX_QUEUED,
    PRUNE_CHANCE,
    UNFINISHED,
    Tick,
    Timing,
    TimingOf,
    at_or_before,
    due_ticks,
    fire_schedule,
    missed_ticks,
    policy_ticks,
    tick_done,
    tick_job_id,
)
from keel.core.store.base import Row, Tx
from keel.core.store.store import Store

log = logging.getLogger("keel.schedules")


@dataclass
class Batch:
    """The writes of a batch of plain schedules' due ticks, as `Store.fire_ticks` takes them."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    ticks: list[dict[str, Any]] = field(default_factory=list)
    moves: list[dict[str, Any]] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    """Schedule id -> name, for what the pass reports."""


def plain(row: Row) -> bool:
    """Whether a claimed schedule's ticks can be planned from its row alone."""
    return row["thread_id"] is None and int(row["queued"]) == 0


def plan(batch: Batch, row: Row, version: str, timing: Timing) -> None:
    """Add a plain schedule's due ticks to `batch`, decided as `fire_schedule` decides them."""
    now, was = float(row["now"]), float(row["next_tick"])
    if was > now:
        return  # claimed for queued ticks it no longer holds: nothing to do
    sid, workflow, input_json = str(row["schedule_id"]), str(row["workflow"]), str(row["input"])
    catch_up, overlap = str(row["catch_up"]), str(row["overlap"])
    busy = row["last_run_id"] is not None and row["last_status"] in UNFINISHED
    following = timing.after(was)
    if following > now:
        # The usual case, a single tick due: one computation of the timing, not six.
        next_tick, due, missed = following, policy_ticks(timing, was, now, was, catch_up), []
    else:
        next_tick = timing.after(now)
        due = due_ticks(timing, was, now, catch_up)
        missed = missed_ticks(timing, was, now, due)
    if not due and not missed:
        missed = [was]  # `none`, a single tick passed too long ago
    batch.names[sid] = str(row["name"])
    for tick in missed:
        batch.ticks.append({"schedule_id": sid, "tick": tick, "outcome": "missed", "run_id": None})
    queued, last_run, fired_last = 0, None, None
    for tick in due:
        outcome = None
        if overlap == "enqueue" and (queued > 0 or busy):
            outcome = "queued" if queued < MAX_QUEUED else "skipped"
        elif overlap == "skip" and busy:
            outcome = "skipped"
        if outcome is not None:
            queued += outcome == "queued"
            batch.ticks.append(
                {"schedule_id": sid, "tick": tick, "outcome": outcome, "run_id": None}
            )
            continue
        job_id = tick_job_id(sid, tick)
        rid = run_id(job_id, workflow, version, input_json)
        event = {
            "workflow": workflow,
            "version": version,
            "job_id": job_id,
            "attempt": 1,
            "schedule": row["name"],
            "tick": tick,
        }
        batch.runs.append(
            {
                "run_id": rid,
                "job_id": job_id,
                "workflow": workflow,
                "workflow_version": version,
                "input_hash": input_hash(workflow, version, input_json),
                "input": input_json,
                "event": dumps(event),
            }
        )
        batch.ticks.append({"schedule_id": sid, "tick": tick, "outcome": "fired", "run_id": rid})
        last_run, fired_last, busy = rid, tick, True  # the run just admitted is unfinished
    batch.moves.append(
        {
            "schedule_id": sid,
            "was": was,
            "next_tick": next_tick,
            "last_tick": fired_last,
            "last_run_id": last_run,
            "queued": queued,
        }
    )


async def write(store: Store, tx: Tx, batch: Batch) -> list[Tick]:
    """The batch written in `tx`: what was done with each tick recorded now."""
    if not batch.moves:
        return []
    moved, recorded = await store.fire_ticks(tx, batch.runs, batch.ticks, batch.moves)
    if moved != len(batch.moves):
        raise RuntimeError("a schedule moved under its claim")  # the claim holds its row
    done = [
        tick_done(batch.names[r["schedule_id"]], float(r["tick"]), r["outcome"], r["run_id"], r)
        for r in recorded
    ]
    order = {name: i for i, name in enumerate(batch.names.values())}
    done.sort(key=lambda t: (order[t.schedule], t.tick))  # as claimed, each oldest first
    for sid in {r["schedule_id"] for r in recorded}:
        if random.random() < PRUNE_CHANCE:
            await store.prune_ticks(tx, sid)
    return done


async def fire_due(
    store: Store, versions: dict[str, str], timing_of: TimingOf, limit: int = CLAIM_BATCH
) -> list[Tick]:
    """Fire the due ticks of the schedules of these workflows (name -> the version a run is
    admitted with), in one transaction; what was done with each tick."""
    claimed: list[str] = []
    try:
        done: list[Tick] = []
        async with store.transaction() as tx:
            batch = Batch()
            for row in await store.claim_due_schedules(tx, sorted(versions), limit):
                claimed.append(str(row["schedule_id"]))
                version = versions[row["workflow"]]
                if plain(row):
                    plan(batch, row, version, timing_of(row))
                else:
                    done += await fire_schedule(store, tx, row, version, timing_of(row))
            done += await write(store, tx, batch)
            await _wake(store, tx, done)
    except Exception as exc:
        if store.is_infrastructure(exc) or not claimed:
            raise
        # One schedule failed the batch: fire them again a transaction each, so that it holds
        # no other back.
        done = []
        for sid in claimed:
            done += await _fire_alone(store, sid, versions, timing_of)
    for tick in done:
        log.log(
            logging.ERROR if tick.outcome == "failed" else logging.INFO,
            "schedule %s: tick %s %s%s",
            tick.schedule,
            f"{tick.tick:.3f}",
            tick.outcome,
            f" as run {tick.run_id}" if tick.run_id else "",
            extra={
                "event": f"schedule.{tick.outcome}",
                "schedule": tick.schedule,
                "run_id": tick.run_id,
                "duration": tick.lateness,
            },
        )
    return done


async def _wake(store: Store, tx: Tx, done: list[Tick]) -> None:
    """One wake-up for the runs a transaction admitted: any one wakes every idle worker."""
    admitted = [t.run_id for t in done if t.run_id]
    if admitted:
        await store.notify_wake(tx, admitted[-1])


async def _fire_alone(
    store: Store, sid: str, versions: dict[str, str], timing_of: TimingOf
) -> list[Tick]:
    try:
        async with store.transaction() as tx:
            row = await store.claim_schedule(tx, sid)
            if row is None:
                return []  # fired meanwhile by another scheduler
            done = await fire_schedule(store, tx, row, versions[row["workflow"]], timing_of(row))
            await _wake(store, tx, done)
            return done
    except Exception as exc:
        if store.is_infrastructure(exc):
            raise
        log.exception("schedule %s failed its tick; it moves on to its next one", sid)
    # The schedule's own fault (its thread belongs to another workflow, its timing no longer
    # computes): its tick is recorded as failed and it moves on, or every pass would fail on it.
    async with store.transaction() as tx:
        row = await store.claim_schedule(tx, sid)
        if row is None:
            return []
        now, was = float(row["now"]), float(row["next_tick"])
        try:
            timing = timing_of(row)
            tick, next_tick = max(at_or_before(timing, now), was), timing.after(now)
        except Exception:
            tick, next_tick = was, now + 60.0  # a timing that fails: tried again in a minute
        recorded = await store.record_tick(tx, sid, tick, "failed", None)
        await store.advance_schedule(
            tx,
            sid,
            was=was,
            next_tick=max(next_tick, was + 0.001) if was <= now else was,
            last_tick=None,
            last_run_id=None,
            queued=int(row["queued"]),
        )
    return [tick_done(str(row["name"]), tick, "failed", None, recorded)] if recorded else []
