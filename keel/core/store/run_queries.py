"""The store's queries on runs and their timelines (part of `Store`)."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import Any, TypedDict, Unpack

from keel.core import logs
from keel.core.codec import dumps, loads
from keel.core.errors import InvalidTransition
from keel.core.store.base import Connector, EndWith, Later, Move, Row, Tx

# Timeline events added by the open transaction, logged only once it has committed.
_uncommitted: ContextVar[list[tuple[Any, ...]] | None] = ContextVar(
    "keel_uncommitted_events", default=None
)


@contextmanager
def committed() -> Iterator[None]:
    """Around a write transaction (outside it): log its events if, and after, it commits."""
    pending: list[tuple[Any, ...]] = []
    token = _uncommitted.set(pending)
    started = time.monotonic()
    try:
        yield
    except BaseException:
        _uncommitted.reset(token)
        raise
    _uncommitted.reset(token)
    took = time.monotonic() - started  # the transaction's, from its start to its commit
    for run_id, kind, data, worker_id, lease_token, ids in pending:
        logs.event(run_id, kind, data, worker_id=worker_id, token=lease_token, ids=ids, took=took)


def note_event(run_id: str, kind: str, data: dict[str, Any]) -> None:
    """Log an event a statement added to a run's timeline: once the open transaction has
    committed (as `add_event`'s), or now outside one."""
    pending = _uncommitted.get()
    if pending is None:
        logs.event(run_id, kind, data, worker_id=None, token=None, ids=None)
    else:
        pending.append((run_id, kind, data, None, None, None))


class RunFilters(TypedDict, total=False):
    """What a listing of runs is filtered by (none: every run), and its page."""

    status: str | None
    workflow: str | None
    since: float | None
    until: float | None
    limit: int
    offset: int


@dataclass(frozen=True)
class NewRun:
    """A run to admit: its identity and its input, named as the admission queries name them."""

    run_id: str
    job_id: str
    workflow: str
    workflow_version: str
    attempt: int
    input_hash: str
    input: str
    """The input as canonical JSON."""
    delay: float | None = None
    """Seconds after admission, by the database's clock, before a claim may take it."""
    not_before: float | None = None
    """Epoch seconds before which no claim takes it (wins over `delay`)."""


class RunQueries:
    db: Connector
    moves: dict[str, frozenset[Move]]
    """The status moves each writer of `keel_runs.status` declares (`load_moves`)."""

    # -- admission ------------------------------------------------------------------------------

    @staticmethod
    async def next_attempt(tx: Tx, job_id: str, workflow: str, input_hash: str) -> int:
        """The attempt number a rerun of this job, workflow and input gets."""
        row = await tx.one(
            "max_attempt", {"job_id": job_id, "workflow": workflow, "input_hash": input_hash}
        )
        return int(row["attempt"]) + 1 if row else 1

    @staticmethod
    async def job_runs(tx: Tx, job_id: str, workflow: str) -> list[Row]:
        """The job's runs of this workflow (run_id, input_hash, attempt, status), newest first."""
        return await tx.all("job_runs", {"job_id": job_id, "workflow": workflow})

    @staticmethod
    async def insert_run(tx: Tx, run: NewRun) -> bool:
        """Admit a run (queued); False if it was already admitted."""
        return await tx.one("insert_run", asdict(run)) is not None

    async def admit_run(
        self,
        run: NewRun,
        *,
        if_exists: str,
        data: dict[str, Any],
        then: Callable[[Tx], Awaitable[Later]] | None = None,
    ) -> tuple[Row | None, bool, bool, list[str], Row | None]:
        """Admit a run in one call (the `lock_job` and `admit_run` queries): the run's row (None if
        refused, or if a concurrent admission of it is not visible yet), whether this call
        created it, whether `if_exists` refused it, the job's runs with other input, and the
        row of `then`: a write sent and committed with the admission, whether or not it
        created the run, in one call (on PostgreSQL one message; a claim by a worker of the
        submitting process: `LeaseQueries.claim_with`)."""
        started = time.monotonic()
        params = {
            **asdict(run),
            "if_exists": if_exists,
            "data": dumps(data),
            "wake": int(then is None),
        }
        after: Row | None = None
        job = {"job_id": run.job_id, "workflow": run.workflow}

        async def admit(tx: Tx) -> tuple[Later, Later | None]:
            # Nothing read before the end: every statement goes in one message. The job's lock
            # first: the admission's snapshot then holds any admission of the job before it.
            await tx.execute("lock_job", job)
            admitted = await tx.send("admit_run", params)
            if then is None:
                return admitted, None
            claimed = await then(tx)
            # Other workers are woken only if the claim left the run queued.
            await tx.execute("wake_if_queued", {"run_id": run.run_id})
            return admitted, claimed

        admitted, followed = await self.db.run_transaction(admit)
        row = await admitted()
        if followed is not None:
            after = await followed()
        assert row is not None
        others = json.loads(row.pop("others"))
        refused, created = bool(row.pop("refused")), bool(row.pop("created"))
        row.pop("woken")
        if created:
            took = time.monotonic() - started
            logs.event(run.run_id, "admitted", data, worker_id=None, token=None, took=took)
        return (row if row.get("run_id") else None), created, refused, others, after

    # -- reading runs ---------------------------------------------------------------------------

    @staticmethod
    async def read_run(tx: Tx, run_id: str) -> Row | None:
        return await tx.one("get_run", {"run_id": run_id})

    @staticmethod
    async def send_read_run(tx: Tx, run_id: str) -> Later:
        """`read_run`, sent: its row comes back with the statements around it."""
        return await tx.send("get_run", {"run_id": run_id})

    @staticmethod
    async def lock_run(tx: Tx, run_id: str) -> Row | None:
        """The run, locked until `tx` ends: read it before changing it or its waits."""
        return await tx.one("lock_run", {"run_id": run_id})

    async def get_run(self, run_id: str) -> Row | None:
        async with self.db.read() as tx:
            return await self.read_run(tx, run_id)

    async def list_runs(
        self, *, job_id: str | None = None, **filters: Unpack[RunFilters]
    ) -> list[Row]:
        """Runs, newest first; `since`/`until` bound their admission time (until excluded)."""
        return await self._runs("list_runs", {"job_id": job_id}, filters)

    async def browse_runs(
        self, *, job_prefix: str | None = None, **filters: Unpack[RunFilters]
    ) -> list[Row]:
        """Runs newest first, filtered; `job_prefix` matches job ids starting with it."""
        # The smallest string above every string that starts with the prefix, in byte order:
        # the prefix match becomes an index range.
        end = (job_prefix + "\U0010ffff") if job_prefix else None
        job = {"job_prefix": job_prefix or None, "job_prefix_end": end}
        return await self._runs("browse_runs", job, filters)

    async def _runs(self, query: str, job: dict[str, Any], filters: RunFilters) -> list[Row]:
        params: dict[str, Any] = {
            "status": None,
            "workflow": None,
            "since": None,
            "until": None,
            "limit": 50,
            "offset": 0,
            **filters,
            **job,
        }
        async with self.db.read() as tx:
            return await tx.all(query, params)

    async def running_runs(self, limit: int = 1000) -> list[Row]:
        """Runs some worker holds now, grouped by owner."""
        async with self.db.read() as tx:
            return await tx.all("running_runs", {"limit": limit})

    async def count_unfinished(self, workflows: list[str]) -> int:
        async with self.db.read() as tx:
            row = await tx.one("count_unfinished", {"workflows": json.dumps(workflows)})
        return int(row["n"]) if row else 0

    # -- changing runs --------------------------------------------------------------------------

    async def update_run_status(
        self,
        tx: Tx,
        run_id: str,
        current: str,
        status: str,
        *,
        decision: str | None,
        termination_reason: str | None,
        error: str | None,
        output: str | None,
        finished: bool,
    ) -> None:
        """Only `keel.core.runs.transition` calls this; a move the query's `-- moves:` header
        does not declare is refused (the header is what the tests hold to the table)."""
        if (current, status) not in self.moves["update_run_status"]:
            raise InvalidTransition(f"a run cannot go from {current} to {status} here")
        await tx.execute(
            "update_run_status",
            {
                "run_id": run_id,
                "status": status,
                "decision": decision,
                "termination_reason": termination_reason,
                "error": error,
                "output": output,
                "finished": finished,
            },
        )

    async def finish_run(
        self,
        run_id: str,
        token: int,
        status: str,
        *,
        worker_id: str,
        termination_reason: str | None,
        error: str | None,
        output: str | None,
        kind: str,
        data: dict[str, Any],
        within: EndWith | None = None,
    ) -> bool:
        """End the running run that `token` holds, with its timeline event `kind`, in one
        statement (only `keel.core.runs.finish` calls this, after checking the transition
        table); False, writing nothing, if `token` no longer holds a running run. No
        `termination_reason`: the run completed, and its waits say why (see the query).
        `within`: the statement goes into that transaction (the run's last step's), and ends
        nothing if a cancel was asked meanwhile (that step's boundary cancels the run)."""
        started = time.monotonic()
        params = {
            "run_id": run_id,
            "lease_token": token,
            "status": status,
            "worker_id": worker_id,
            "termination_reason": termination_reason,
            "error": error,
            "output": output,
            "kind": kind,
            "data": dumps(data),
            "unless_cancelled": int(within is not None and status != "cancelled"),
        }
        if within is None:
            row = await self.db.single("finish_run", params)
        else:
            row = await within(lambda tx: tx.send("finish_run", params))
        if row is None:
            return False
        took = time.monotonic() - started
        if termination_reason is None:  # the statement judged it, and recorded it in the event
            data = {**data, "termination_reason": row["finished_reason"]}
        logs.event(run_id, kind, data, worker_id=worker_id, token=token, took=took)
        return True

    @staticmethod
    async def set_run_decision(tx: Tx, run_id: str, decision: str) -> None:
        await tx.execute("set_run_decision", {"run_id": run_id, "decision": decision})

    @staticmethod
    async def clear_failure(tx: Tx, run_id: str) -> None:
        """Forget a resumed run's termination reason, error and failed attempts."""
        await tx.execute("clear_failure", {"run_id": run_id})
        await tx.execute("reopen_failed_effects", {"run_id": run_id})

    @staticmethod
    async def request_cancel(tx: Tx, run_id: str) -> None:
        """Ask a running run to stop at its next step boundary."""
        await tx.execute("set_cancel_requested", {"run_id": run_id})

    async def keep_traceparent(self, run_id: str, traceparent: str) -> str | None:
        """The run's trace context: `traceparent` if the run had none, else the one it has
        (None for an unknown run). Not fenced: it only names the trace, and the first wins."""
        async with self.db.transaction() as tx:
            row = await tx.one("set_traceparent", {"run_id": run_id, "traceparent": traceparent})
            if row is None:
                row = await tx.one("get_traceparent", {"run_id": run_id})
        return None if row is None else row["traceparent"]

    @staticmethod
    async def set_run_version(tx: Tx, run_id: str, version: str) -> Row | None:
        """Move a queued or waiting run to another version of its workflow; None otherwise."""
        return await tx.one("set_run_version", {"run_id": run_id, "version": version})

    async def other_versions(self, names: list[str], keys: list[str], limit: int) -> list[Row]:
        """Unfinished runs of workflows named `names` under a version whose key is not in
        `keys`, oldest first."""
        # Two questions rather than one filter over every unfinished run: which versions their
        # runs are on (an index probe per version), then the runs of the versions not served,
        # if any. Runs waiting on a served version are never read (issue 34).
        async with self.db.read() as tx:
            found = await tx.all("unfinished_versions", {"names": json.dumps(names)})
            served = set(keys)
            pairs = [
                [row["workflow"], row["workflow_version"]]
                for row in found
                if f"{row['workflow']}@{row['workflow_version']}" not in served
            ]
            if not pairs:
                return []
            return await tx.all("unfinished_runs_of", {"pairs": json.dumps(pairs), "limit": limit})

    @staticmethod
    async def notify_wake(tx: Tx, run_id: str) -> None:
        """Wake idle workers when `tx` commits (PostgreSQL; a no-op on SQLite)."""
        await tx.execute("notify_wake", {"run_id": run_id})

    # -- timeline -------------------------------------------------------------------------------

    @staticmethod
    async def add_event(
        tx: Tx,
        run_id: str,
        kind: str,
        data: dict[str, Any] | None = None,
        *,
        worker_id: str | None = None,
        token: int | None = None,
        ids: dict[str, Any] | None = None,
        key: str | None = None,
    ) -> None:
        """Append to the run's timeline; `ids` are extra correlation ids for its log line. An
        event with a `key` is added once per run and key (a task's `step` event)."""
        params = {
            "run_id": run_id,
            "kind": kind,
            "worker_id": worker_id,
            "lease_token": token,
            "data": dumps(data or {}),
        }
        if key is None:
            await tx.execute("insert_event", params)
        else:
            await tx.execute("insert_step_event", {**params, "step_key": key})
        pending = _uncommitted.get()
        entry = (run_id, kind, data or {}, worker_id, token, ids)
        if pending is None:
            logs.event(*entry[:3], worker_id=worker_id, token=token, ids=ids)
        else:
            pending.append(entry)

    @staticmethod
    def log_events(row: Row | None, *, took: float, ids: dict[str, Any] | None = None) -> None:
        """Log, once its transaction has committed, the timeline events a statement wrote as it
        returned them (its `events` column, a JSON list of {run_id, kind, data, worker_id,
        lease_token}, taken out of `row`): the log says what the timeline holds, rebuilt
        nowhere. `events_before` (where a SQLite chain started reading them) goes too."""
        if row is None:
            return
        row.pop("events_before", None)
        written = row.pop("events", None)
        for event in json.loads(written) if isinstance(written, str) else written or ():
            logs.event(
                event["run_id"],
                event["kind"],
                event["data"],
                worker_id=event["worker_id"],
                token=event["lease_token"],
                ids=ids,
                took=took,
            )

    async def events(self, run_id: str) -> list[Row]:
        async with self.db.read() as tx:
            rows = await tx.all("list_events", {"run_id": run_id})
        for row in rows:
            row["data"] = loads(row["data"])
        return rows
