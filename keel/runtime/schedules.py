"""`app.schedules`: crons and intervals that start runs (keel.core.schedules has the rules).

`AsyncSchedules` (`app.aio.schedules`) holds each operation once; the sync `Schedules`
(`app.schedules`) declares them again with `sync_of`. `run_scheduler` is the loop every worker
runs beside its claim loop: it upserts the schedules its workflows declare, then fires due ticks,
sleeping until the next one is due by the database's clock (at most a second: one round trip a
second when idle).
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import datetime
import logging
from typing import Any

from keel.core import schedules as rules
from keel.core.codec import canonical_json, check_storable, dumps, loads
from keel.core.errors import ScheduleExists, ScheduleNotFound, ThreadNotFound, UsageError
from keel.core.schedule_firing import fire_due as fire_batch
from keel.core.store.base import Row
from keel.core.store.store import Store
from keel.core.threads import validate_thread_id
from keel.core.workflows import Workflows
from keel.langgraph.inputs import check_input
from keel.runtime.cron import check_timing, timing, timing_of
from keel.runtime.facade import sync_of
from keel.runtime.ports import WorkerHost

log = logging.getLogger("keel.schedules")

MAX_NAME = 128
_SETTINGS = ("cron", "every_seconds", "timezone", "input", "catch_up", "overlap", "metadata")
MAX_SLEEP = 1.0
"""Longest a scheduler sleeps between looks at the next due tick, unless woken by changes."""
QUIET_SLEEP = 5.0
"""Longest it sleeps where a schedule's change wakes it (PostgreSQL's NOTIFY): an idle worker
then looks once in five seconds, or at its next tick."""


def validate_name(value: object) -> str:
    """A schedule's name: up to 128 letters, digits, '.', '_', '-', ':' (no spaces)."""
    if not isinstance(value, str) or not value:
        raise UsageError("a schedule's name must be a non-empty string")
    allowed = all(c.isascii() and (c.isalnum() or c in "._-:") for c in value)
    if len(value) > MAX_NAME or not allowed:
        raise UsageError(
            f"schedule name {value[:60]!r} may only contain up to {MAX_NAME} letters, digits, "
            "'.', '_', '-' and ':'"
        )
    return value


def public(row: Row) -> dict[str, Any]:
    """A schedule as the API returns it."""
    return {
        "schedule_id": row["schedule_id"],
        "name": row["name"],
        "workflow": row["workflow"],
        "cron": row["cron"],
        "every": row["every_seconds"],
        "timezone": row["timezone"],
        "input": loads(row["input"]),
        "thread_id": row["thread_id"],
        "catch_up": row["catch_up"],
        "overlap": row["overlap"],
        "metadata": loads(row["metadata"]),
        "paused": bool(row["paused"]),
        "declared": bool(row["declared"]),
        "next_tick": None if row["paused"] else float(row["next_tick"]),
        "last_tick": row["last_tick"],
        "last_run_id": row["last_run_id"],
        "queued_ticks": int(row["queued"]),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


class AsyncSchedules:
    """Schedules of an app: create, read, change, pause, resume, delete, trigger."""

    def __init__(self, runtime: WorkerHost) -> None:
        self.runtime = runtime

    @property
    def _store(self) -> Store:
        return self.runtime.services.store

    async def create(
        self,
        name: str,
        workflow: str,
        *,
        cron: str | None = None,
        every: float | None = None,
        timezone: str = "UTC",
        input: Any = None,
        thread_id: str | None = None,
        catch_up: str = "latest",
        overlap: str = "skip",
        metadata: dict[str, Any] | None = None,
        paused: bool = False,
        require_thread: bool = False,
    ) -> dict[str, Any]:
        """A schedule that starts a run of `workflow` (on `thread_id` if given) at each tick of
        `cron` (5 fields, or 6 with seconds first) in `timezone`, or every `every` seconds;
        ScheduleExists if the name is taken. See keel.core.schedules for `catch_up` and
        `overlap`. Its thread is made by its first tick if need be; with `require_thread` it
        must exist now (ThreadNotFound), judged with the thread locked: a deletion of it either
        went first, or waits and deletes this schedule with it (its next tick would make the
        thread again)."""
        await self.runtime.open()
        values = self._values(
            name, workflow, cron, every, timezone, input, thread_id, catch_up, overlap, metadata
        )
        if require_thread and thread_id is None:
            raise UsageError("require_thread asks for an existing thread: give thread_id")
        async with self._store.transaction() as tx:
            if require_thread and await self._store.lock_thread(tx, str(thread_id)) is None:
                raise ThreadNotFound(f"thread {thread_id!r} not found")
            now = await self._store.db_now(tx)
            values.update(
                schedule_id=rules.new_schedule_id(),
                declared=0,
                paused=int(paused),
                next_tick=timing(values["cron"], values["every_seconds"], timezone, now).after(now),
            )
            row = await self._store.insert_schedule(tx, values)
            await self._store.notify_wake(tx, rules.SCHEDULE_WAKE + values["schedule_id"])
        if row is None:
            raise ScheduleExists(f"a schedule named {name!r} exists")
        return public(row)

    def _values(
        self,
        name: str,
        workflow: str,
        cron: str | None,
        every: float | None,
        timezone: str,
        input: Any,
        thread_id: str | None,
        catch_up: str,
        overlap: str,
        metadata: dict[str, Any] | None,
    ) -> dict[str, Any]:
        validate_name(name)
        cron, every = check_timing(cron, every, timezone)
        rules.check_policies(catch_up, overlap)
        wf = self.runtime.workflows.get(workflow)
        if thread_id is not None:
            validate_thread_id(thread_id)
        check_storable([input, metadata], "the schedule's input and metadata")
        if input is not None or thread_id is None:
            check_input(wf, loads(canonical_json(input)), partial=thread_id is not None)
        if metadata is not None and not isinstance(metadata, dict):
            raise UsageError("metadata must be an object")
        return {
            "name": name,
            "workflow": wf.name,
            "cron": cron,
            "every_seconds": every,
            "timezone": timezone,
            "input": canonical_json(input),
            "thread_id": thread_id,
            "catch_up": catch_up,
            "overlap": overlap,
            "metadata": dumps(metadata or {}),
        }

    async def get(self, key: str) -> dict[str, Any]:
        """A schedule by id or name (ScheduleNotFound)."""
        return public(await self._row(key))

    async def _row(self, key: str) -> Row:
        await self.runtime.open()
        row = await self._store.get_schedule(key)
        if row is None:
            raise ScheduleNotFound(f"no schedule {key!r}")
        return row

    async def list(
        self,
        *,
        workflow: str | None = None,
        thread_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> builtins.list[dict[str, Any]]:
        """Schedules by name, of one workflow and one thread if asked."""
        await self.runtime.open()
        rows = await self._store.list_schedules(
            workflow=workflow, thread_id=thread_id, limit=limit, offset=offset
        )
        return [public(r) for r in rows]

    async def count(self, *, workflow: str | None = None, thread_id: str | None = None) -> int:
        await self.runtime.open()
        return await self._store.count_schedules(workflow=workflow, thread_id=thread_id)

    async def ticks(self, key: str, limit: int = 100) -> builtins.list[Row]:
        """The schedule's recorded ticks (fired, skipped, queued, triggered), newest first."""
        row = await self._row(key)
        return await self._store.schedule_ticks(str(row["schedule_id"]), limit)

    async def update(
        self,
        key: str,
        *,
        cron: str | None = None,
        every: float | None = None,
        timezone: str | None = None,
        input: Any = rules.UNCHANGED,
        catch_up: str | None = None,
        overlap: str | None = None,
        metadata: dict[str, Any] | None = None,
        paused: bool | None = None,
    ) -> dict[str, Any]:
        """Change what is given. A new timing (or a resume) counts its next tick from now: the
        ticks missed while paused are not caught up."""
        row = await self._row(key)
        retimed = cron is not None or every is not None or timezone is not None
        check_storable(metadata, "the schedule's metadata")
        kept = loads(row["metadata"])
        merged = {**kept, **metadata} if metadata is not None else kept
        changed = retimed or input is not rules.UNCHANGED or catch_up or overlap
        if not changed:
            # A pause, a resume, metadata: nothing to check against the workflow, which this
            # process may not register (`keel schedules pause --db ...`).
            values = {k: row[k] for k in _SETTINGS} | {"metadata": dumps(merged)}
        else:
            if cron is not None or every is not None:
                new_cron, new_every = cron, every
            else:
                new_cron, new_every = row["cron"], row["every_seconds"]
            values = self._values(
                str(row["name"]),
                str(row["workflow"]),
                new_cron,
                new_every,
                timezone or str(row["timezone"]),
                loads(row["input"]) if input is rules.UNCHANGED else input,
                row["thread_id"],
                catch_up or str(row["catch_up"]),
                overlap or str(row["overlap"]),
                merged,
            )
        resumed = paused is False and bool(row["paused"])
        async with self._store.transaction() as tx:
            # Unless retimed or resumed, the next tick (and the pause, if not given) stay as the
            # row has them when written: a tick may have fired since `row` was read.
            next_tick: float | None = None
            if retimed or resumed:
                now = await self._store.db_now(tx)
                spec = timing(values["cron"], values["every_seconds"], values["timezone"], now)
                next_tick = spec.after(now)
            values.update(
                schedule_id=row["schedule_id"],
                paused=None if paused is None else int(paused),
                next_tick=next_tick,
            )
            written = await self._store.write_schedule(tx, values)
            await self._store.notify_wake(tx, rules.SCHEDULE_WAKE + str(row["schedule_id"]))
        if written is None:
            raise ScheduleNotFound(f"no schedule {key!r}")
        return public(written)

    async def pause(self, key: str) -> dict[str, Any]:
        """No tick fires until `resume`."""
        return await self.update(key, paused=True)

    async def resume(self, key: str) -> dict[str, Any]:
        """Ticks fire again from the next one after now (none missed while paused)."""
        return await self.update(key, paused=False)

    async def delete(self, key: str) -> None:
        """Delete the schedule and its tick records (its runs stay); ScheduleNotFound."""
        row = await self._row(key)
        if not await self._store.delete_schedule(str(row["schedule_id"])):
            raise ScheduleNotFound(f"no schedule {key!r}")

    async def trigger(self, key: str) -> rules.Tick:
        """A run of the schedule now, beside its ticks (whatever its overlap policy)."""
        row = await self._row(key)
        version = self.runtime.workflows.get(str(row["workflow"])).version
        tick = await rules.trigger(self._store, str(row["schedule_id"]), version)
        self.runtime.services.wake()
        return tick

    async def declare(self, workflows: Workflows) -> builtins.list[dict[str, Any]]:
        """Upsert the schedules these workflows declare (`@app.workflow(schedule=...)`): a
        changed timing restarts from now, an unchanged one keeps its next tick."""
        await self.runtime.open()
        declared = []
        for wf in workflows.all():
            spec: rules.ScheduleSpec | None = getattr(wf, "schedule", None)
            if spec is None or workflows.get(wf.name) is not wf:
                continue
            name = spec.name or wf.name
            values = self._values(
                name,
                wf.name,
                spec.cron,
                spec.every,
                spec.timezone,
                spec.input,
                spec.thread_id,
                spec.catch_up,
                spec.overlap,
                spec.metadata,
            )
            async with self._store.transaction() as tx:
                now = await self._store.db_now(tx)
                values.update(
                    schedule_id=rules.new_schedule_id(),
                    next_tick=timing(
                        values["cron"], values["every_seconds"], spec.timezone, now
                    ).after(now),
                )
                row = await self._store.declare_schedule(tx, values)
                if row is not None:
                    await self._store.notify_wake(tx, rules.SCHEDULE_WAKE + str(row["schedule_id"]))
            if row is None:
                log.warning(
                    "workflow %s declares schedule %s, but one of that name was made by hand: "
                    "it is left as it is",
                    wf.name,
                    name,
                )
                continue
            declared.append(public(row))
        return declared


class Schedules:
    """`app.schedules`: the sync face of `AsyncSchedules`, one operation each."""

    def __init__(self, aio: AsyncSchedules) -> None:
        self.aio = aio

    create = sync_of(AsyncSchedules.create)
    get = sync_of(AsyncSchedules.get)
    list = sync_of(AsyncSchedules.list)
    count = sync_of(AsyncSchedules.count)
    ticks = sync_of(AsyncSchedules.ticks)
    update = sync_of(AsyncSchedules.update)
    pause = sync_of(AsyncSchedules.pause)
    resume = sync_of(AsyncSchedules.resume)
    delete = sync_of(AsyncSchedules.delete)
    trigger = sync_of(AsyncSchedules.trigger)


async def fire_due(runtime: WorkerHost, workflows: Workflows) -> list[rules.Tick]:
    """One scheduler pass: the due ticks of these workflows' schedules fired."""
    await runtime.open()
    versions = {name: workflows.get(name).version for name in {w.name for w in workflows.all()}}
    fired = await fire_batch(runtime.services.store, versions, timing_of)
    if any(t.run_id for t in fired):
        runtime.services.wake()
    return fired


async def run_scheduler(
    runtime: WorkerHost,
    workflows: Workflows,
    stopping: asyncio.Event,
    schedules: AsyncSchedules,
    wake: asyncio.Event | None = None,
) -> None:
    """Fire these workflows' due ticks until `stopping` (a worker's background task). `wake`,
    set when a schedule changes (a NOTIFY), lets it sleep longer when nothing is due."""
    names = sorted({w.name for w in workflows.all()})
    if not names:
        return
    declared = False
    store = runtime.services.store
    while not stopping.is_set():
        delay = MAX_SLEEP
        try:
            if not declared:
                await schedules.declare(workflows)
                declared = True
            wait, queued = await store.next_schedule_due(names)
            due = wait is not None and wait <= 0
            if due or queued:
                await fire_due(runtime, workflows)
            cap = QUIET_SLEEP if wake is not None else MAX_SLEEP
            delay = 0.0 if due else min(cap, cap if wait is None else wait)
        except Exception as exc:
            if not store.is_infrastructure(exc):
                log.exception("the scheduler failed a pass; it tries again in a second")
            # A database away: the worker's own loop reports it; try again in a second.
        if delay > 0:
            waiters = [asyncio.ensure_future(stopping.wait())]
            if wake is not None:
                waiters.append(asyncio.ensure_future(wake.wait()))
            try:
                await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            finally:
                # Also when the worker cancels this loop: a waiter left pending is destroyed
                # later with an error in the log ("Task was destroyed but it is pending").
                for waiter in waiters:
                    waiter.cancel()
        if wake is not None:
            wake.clear()


def schedule_spec(value: Any) -> rules.ScheduleSpec:
    """`@app.workflow(schedule=...)`: a cron expression, seconds (or a timedelta) between
    ticks, a dict of `ScheduleSpec`'s fields, or a ScheduleSpec; checked here, at
    registration."""
    if isinstance(value, rules.ScheduleSpec):
        spec = value
    elif isinstance(value, str):
        spec = rules.ScheduleSpec(cron=value)
    elif isinstance(value, datetime.timedelta):
        spec = rules.ScheduleSpec(every=value.total_seconds())
    elif isinstance(value, int | float) and not isinstance(value, bool):
        spec = rules.ScheduleSpec(every=float(value))
    elif isinstance(value, dict):
        try:
            spec = rules.ScheduleSpec(**value)
        except TypeError as exc:
            raise UsageError(f"schedule: {exc}") from None
    else:
        raise UsageError(
            "schedule is a cron expression, seconds between ticks, a dict or a ScheduleSpec"
        )
    cron, every = check_timing(spec.cron, spec.every, spec.timezone)
    rules.check_policies(spec.catch_up, spec.overlap)
    if spec.name is not None:
        validate_name(spec.name)
    return dataclasses.replace(spec, cron=cron, every=every)
