"""Schedules: a cron expression (or an interval) that starts a run at each of its ticks, once.

A schedule's `next_tick` is the next tick not yet fired, by the database's clock. A scheduler (a
loop in every worker: keel.runtime.scheduler) claims the schedules whose `next_tick` has passed
(`FOR UPDATE SKIP LOCKED` on PostgreSQL, the write lock on SQLite), and in the same transaction
admits each tick's run, records the tick and moves `next_tick` on (only if nobody else moved it).
Exactly one run per tick however many schedulers race, crash or restart: the tick's record is
keyed by (schedule, tick), and the run's job id derives from them, so the database refuses a
second of either. Ticks are judged by the database's clock, never a scheduler's.

After an outage, the ticks missed follow the schedule's `catch_up`:

- `latest` (the default): one run, for the newest tick passed;
- `all`: a run for each missed tick, the newest `MAX_CATCH_UP` of them at most;
- `none`: none, but the newest tick if it passed less than `ON_TIME` seconds ago (the tick of
  now, fired a little late, is not a missed one).

When the previous tick's run is still unfinished, `overlap` says what a tick does: `skip` (the
tick is recorded as skipped, no run), `enqueue` (the tick waits and fires when that run ends, in
order; at most `MAX_QUEUED` wait, later ones are skipped) or `allow` (a run now, beside it). A
schedule on a thread starts runs on that thread, which runs one at a time: there `enqueue` and
`allow` both queue the run on the thread, `skip` skips while the thread has an unfinished run.

The timing itself (cron parsing, timezones) is the runtime's (`Timing`, keel.runtime.cron): the
core only needs the tick after a time and the tick before it.
"""

from __future__ import annotations

import logging
import math
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from keel.core.codec import dumps
from keel.core.errors import UsageError
from keel.core.ids import input_hash, run_id
from keel.core.store.base import Row, Tx
from keel.core.store.run_queries import NewRun
from keel.core.store.store import Store
from keel.core.store.thread_queries import ThreadPlace

log = logging.getLogger("keel.schedules")

CATCH_UP = ("latest", "all", "none")
OVERLAP = ("skip", "enqueue", "allow")
MAX_CATCH_UP = 100
"""Missed ticks `catch_up="all"` fires at most after an outage (the newest ones)."""
MAX_QUEUED = 100
"""Ticks an `enqueue` schedule holds back at most behind an unfinished run; later ones skip."""
ON_TIME = 5.0
"""Seconds after its time within which a tick is the tick of now, not a missed one."""
UNCHANGED: Any = object()
"""An update's `input` when not given (None is an input)."""
SCHEDULE_WAKE = "schedule:"
"""The prefix of the wake-up a schedule's change sends its schedulers (`keel_wake`)."""
PRUNE_CHANCE = 0.05
"""Chance a schedule's fired ticks prune its old records: a statement per tick otherwise, for a
table that may hold a few dozen more rows than it keeps."""
CLAIM_BATCH = 200
"""Due schedules one scheduler's transaction takes at most. A batch costs a few statements
whatever its size (keel.core.schedule_firing): 1,000 ticks due at once were fired with a p99
lateness of 2.2 s in batches of 50, 1.2 s in batches of 200, 1.1 s in batches of 500 (bench case
13, burst)."""

UNFINISHED = ("queued", "running", "waiting")


class Timing(Protocol):
    """A schedule's ticks (epoch seconds)."""

    def after(self, t: float) -> float:
        """The first tick strictly after `t`."""
        ...

    def before(self, t: float) -> float:
        """The last tick strictly before `t`."""
        ...


TimingOf = Callable[[Row], Timing]
"""The timing of a schedule's row (its cron, every_seconds, timezone and next_tick)."""


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule declared with a workflow (`@app.workflow(schedule=...)`)."""

    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"
    input: Any = None
    thread_id: str | None = None
    catch_up: str = "latest"
    overlap: str = "skip"
    metadata: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    """Default: the workflow's name."""


@dataclass(frozen=True)
class Tick:
    """What a scheduler did with one tick of a schedule."""

    schedule: str
    tick: float
    outcome: str
    """fired, skipped, queued, triggered, missed (passed in an outage, not fired by the
    schedule's `catch_up`) or failed (the schedule could not fire it: see the log)."""
    run_id: str | None
    lateness: float
    """Seconds from the tick's time to its run's admission, by the database's clock."""


def check_policies(catch_up: str, overlap: str) -> None:
    if catch_up not in CATCH_UP:
        raise UsageError(f"catch_up must be one of {', '.join(CATCH_UP)}, not {catch_up!r}")
    if overlap not in OVERLAP:
        raise UsageError(f"overlap must be one of {', '.join(OVERLAP)}, not {overlap!r}")


def new_schedule_id() -> str:
    return str(uuid.uuid4())


def tick_job_id(schedule_id: str, tick: float) -> str:
    """The job id of a tick's run: the schedule's id and the tick's time in milliseconds."""
    return f"schedule.{schedule_id}.{round(tick * 1000)}"


def at_or_before(timing: Timing, t: float) -> float:
    """The last tick at or before `t`."""
    previous = timing.before(t)
    following = timing.after(previous)
    return following if following <= t else previous


def due_ticks(timing: Timing, next_tick: float, now: float, catch_up: str) -> list[float]:
    """The ticks from `next_tick` to `now` to fire, oldest first, under `catch_up`."""
    if next_tick > now:
        return []
    latest = max(at_or_before(timing, now), next_tick)
    return policy_ticks(timing, next_tick, now, latest, catch_up)


def policy_ticks(
    timing: Timing, next_tick: float, now: float, latest: float, catch_up: str
) -> list[float]:
    if catch_up == "latest":
        return [latest]
    if catch_up == "none":
        return [latest] if now - latest <= ON_TIME else []
    ticks = [latest]
    while len(ticks) < MAX_CATCH_UP:
        previous = timing.before(ticks[-1])
        if previous < next_tick:
            break
        ticks.append(previous)
    return ticks[::-1]


def missed_ticks(timing: Timing, next_tick: float, now: float, fired: list[float]) -> list[float]:
    """The ticks from `next_tick` to `now` that `catch_up` does not fire, oldest first: the
    newest `MAX_CATCH_UP` passed at most (an outage of a year records no more)."""
    if next_tick > now:
        return []
    taken = set(fired)
    ticks: list[float] = []
    tick = max(at_or_before(timing, now), next_tick)
    for _ in range(MAX_CATCH_UP):
        if tick < next_tick:
            break
        if tick not in taken:
            ticks.append(tick)
        tick = timing.before(tick)
    return ticks[::-1]


async def fire_schedule(store: Store, tx: Tx, row: Row, version: str, timing: Timing) -> list[Tick]:
    now = float(row["now"])
    sid, name = str(row["schedule_id"]), str(row["name"])
    on_thread = row["thread_id"] is not None
    queued = int(row["queued"])
    last_run: str | None = row["last_run_id"]
    fired_last: float | None = None
    done: list[Tick] = []

    async def busy() -> bool:
        if on_thread:
            return bool(await store.thread_unfinished(tx, str(row["thread_id"])))
        if last_run is None:
            return False
        run = await store.read_run(tx, last_run)
        return run is not None and run["status"] in UNFINISHED

    if queued and not on_thread and not await busy():
        # The run that held the queue back has ended: the oldest held tick goes now.
        tick = await store.oldest_queued_tick(tx, sid)
        queued = queued - 1 if tick is not None else 0
        if tick is not None:
            last_run = await _admit_tick(store, tx, row, version, tick, notify=False)
            released = await store.release_tick(tx, sid, tick, last_run)
            fired_last = tick
            done.append(tick_done(name, tick, "fired", last_run, released))
    was = float(row["next_tick"])
    next_tick = was
    if was <= now:
        overlap = str(row["overlap"])
        following = timing.after(was)
        if following > now:
            # The usual case, a single tick due: one computation of the timing, not six.
            next_tick, due, missed = (
                following,
                policy_ticks(timing, was, now, was, str(row["catch_up"])),
                [],
            )
        else:
            next_tick = timing.after(now)
            due = due_ticks(timing, was, now, str(row["catch_up"]))
            missed = missed_ticks(timing, was, now, due)
        if not due and not missed:
            missed = [was]  # `none`, a single tick passed too long ago
        if missed and await store.record_missed(tx, sid, missed):
            # Recorded so that "why did this tick not run?" has an answer (`ticks()`).
            done += [Tick(name, tick, "missed", None, 0.0) for tick in missed]
        for tick in due:
            outcome = None
            if overlap == "enqueue" and not on_thread and (queued > 0 or await busy()):
                outcome = "queued" if queued < MAX_QUEUED else "skipped"
            elif overlap == "skip" and await busy():
                outcome = "skipped"
            if outcome is not None:
                recorded = await store.record_tick(tx, sid, tick, outcome, None)
                if recorded is not None:  # else: recorded before, by a scheduler this one raced
                    queued += outcome == "queued"
                    done.append(tick_done(name, tick, outcome, None, recorded))
                continue
            rid = await _admit_tick(store, tx, row, version, tick, notify=False)
            recorded = await store.record_tick(tx, sid, tick, "fired", rid)
            if recorded is None:
                continue  # fired before (a scheduler whose commit this one did not see)
            last_run, fired_last = rid, tick
            done.append(tick_done(name, tick, "fired", rid, recorded))
    moved = await store.advance_schedule(
        tx,
        sid,
        was=was,
        next_tick=next_tick,
        last_tick=fired_last,
        last_run_id=last_run if fired_last is not None else None,
        queued=queued,
    )
    if not moved:
        raise RuntimeError(f"schedule {name} moved under its claim")  # the claim holds its row
    if done and random.random() < PRUNE_CHANCE:
        await store.prune_ticks(tx, sid)
    return done


def tick_done(name: str, tick: float, outcome: str, rid: str | None, recorded: Row | None) -> Tick:
    fired_at = recorded.get("fired_at") if recorded else None
    lateness = max(0.0, float(fired_at) - tick) if fired_at is not None else 0.0
    return Tick(name, tick, outcome, rid, lateness)


async def trigger(store: Store, key: str, version: str) -> Tick:
    """A run of the schedule now, off its clock and its overlap policy (`keel schedules
    trigger`): recorded as a `triggered` tick at the database's time."""
    async with store.transaction() as tx:
        row = await store.read_schedule(tx, key)
        if row is None:
            raise LookupError(key)
        tick = round(await store.db_now(tx), 3)
        rid = await _admit_tick(store, tx, row, version, tick)
        recorded = await store.record_tick(tx, str(row["schedule_id"]), tick, "triggered", rid)
    return tick_done(str(row["name"]), tick, "triggered", rid, recorded)


async def _admit_tick(
    store: Store, tx: Tx, row: Row, version: str, tick: float, notify: bool = True
) -> str:
    """Admit the tick's run in `tx` (found, not admitted again, if it exists): its id.
    `notify=False` leaves waking the workers to the caller (once for a batch of runs)."""
    workflow, input_json = str(row["workflow"]), str(row["input"])
    job_id = tick_job_id(str(row["schedule_id"]), tick)
    rid = run_id(job_id, workflow, version, input_json)
    run = NewRun(
        run_id=rid,
        job_id=job_id,
        workflow=workflow,
        workflow_version=version,
        attempt=1,
        input_hash=input_hash(workflow, version, input_json),
        input=input_json,
    )
    event: dict[str, Any] = {
        "workflow": workflow,
        "version": version,
        "job_id": job_id,
        "attempt": 1,
        "schedule": row["name"],
        "tick": tick,
    }
    thread_id = row["thread_id"]
    if thread_id is None:
        if not await store.insert_run(tx, run):
            return rid
    else:
        thread = await store.take_thread(
            tx, thread_id, create=True, workflow=workflow, version=version, metadata=dumps({})
        )
        if thread is None or thread["workflow"] != workflow:
            raise UsageError(f"thread {thread_id} belongs to another workflow than {workflow!r}")
        if await store.read_run(tx, rid) is not None:
            return rid
        place = ThreadPlace(
            thread_id=thread_id,
            thread_seq=await store.next_thread_seq(tx, thread_id),
            command=None,
            checkpoint_id=None,
            config=None,
            multitask_strategy="enqueue",
        )
        await store.insert_thread_run(tx, run, place)
        event.update(thread_id=thread_id, thread_seq=place.thread_seq, multitask_strategy="enqueue")
    await store.add_event(tx, rid, "admitted", event)
    if notify:
        await store.notify_wake(tx, rid)
    return rid


def interval_ticks(every: float, anchor: float) -> Timing:
    """The ticks of an interval: `anchor` + k * `every` (whole milliseconds)."""
    if not every >= 1:
        raise UsageError(f"every must be at least 1 second, not {every!r}")
    return _Interval(every, anchor)


@dataclass(frozen=True)
class _Interval:
    every: float
    anchor: float

    def after(self, t: float) -> float:
        k = math.floor((t - self.anchor) / self.every) + 1
        return self._at(k, t, later=True)

    def before(self, t: float) -> float:
        k = math.ceil((t - self.anchor) / self.every) - 1
        return self._at(k, t, later=False)

    def _at(self, k: int, t: float, *, later: bool) -> float:
        tick = round(self.anchor + k * self.every, 3)
        # Rounding may land the tick on `t` itself: step once more.
        if later and tick <= t:
            tick = round(tick + self.every, 3)
        if not later and tick >= t:
            tick = round(tick - self.every, 3)
        return tick
