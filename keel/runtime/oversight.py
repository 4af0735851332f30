"""What an operator looks at and acts on, on `keel.AsyncApp` (mixed into it): live workers,
runs that need a version nobody serves and their move to another version, open waits, dead
leases, the outbox's intents, and the record (a run's timeline, the database's figures,
pruning). The rules live in the core (keel.core.versions, leases, effects.dispatch, retention)
and keel.runtime.stranded; these are their faces.
"""

from __future__ import annotations

import logging
from typing import Any

from keel.core import leases, retention, versions
from keel.core.codec import dumps, loads
from keel.core.effects import dispatch as effect_dispatch
from keel.core.effects.outbox import IntentStatus, public
from keel.core.errors import RunNotFound, UsageError, WaitNotFound, WorkflowVersionMismatch
from keel.core.ids import validate_run_id
from keel.core.store.base import Row
from keel.langgraph.graphs import checkpoint_misfits, compile_graph
from keel.langgraph.shape import describe_change, shape_digest
from keel.runtime import stranded
from keel.runtime.runtime import Runtime

log = logging.getLogger("keel.runtime.oversight")


class Oversight:
    """The fleet, waits and outbox operations of `AsyncApp` (`runtime` is the app's)."""

    runtime: Runtime

    async def open(self) -> None: ...  # AsyncApp's

    # -- workers and versions -------------------------------------------------------------------

    async def stranded_runs(self, limit: int = 100) -> list[Row]:
        """Runs that need a worker of a version no worker serves, oldest first."""
        await self.open()
        window = stranded.live_window(self.runtime.heartbeat_interval)
        return await stranded.stranded_runs(self.runtime.store, window, None, limit)

    async def _served(self) -> stranded.Serving:
        await self.open()
        window = stranded.live_window(self.runtime.heartbeat_interval)
        return await stranded.served(self.runtime.store, window)

    async def upgrade_run(self, run_id: str, *, to: str, by: str | None = None) -> Row:
        """Move a queued or waiting run to another registered version of its workflow, when
        its checkpoint fits that version's graph; WorkflowVersionMismatch when it does not."""
        await self.open()
        validate_run_id(run_id)
        run = await self.runtime.store.get_run(run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        workflow = self.runtime.workflows.get(run["workflow"], to)
        versions.check_upgradable(run, to)
        graph = compile_graph(workflow, self.runtime.fencing())  # a builder or a compiled graph
        thread = str(run.get("thread_id") or run_id)  # a turn of a thread reads the thread
        problems = await checkpoint_misfits(graph, self.runtime.fencing(), thread)
        if problems:
            raise WorkflowVersionMismatch(
                f"run {run_id} cannot move from {run['workflow']}@{run['workflow_version']} to "
                f"{workflow.key}: its checkpoint does not fit ({'; '.join(problems)})"
            )
        row = await versions.upgrade(self.runtime.store, run_id, to, seen=run, by=by)
        self.runtime.wake()
        return row

    async def accept_graph(self, workflow: str, version: str, *, by: str) -> str | None:
        """Hold `workflow@version` to its graph as registered here from now on, in place of the
        one it was first served with: an operator's word that the change moves no run elsewhere
        (a router renamed, a reducer moved, a library upgrade that renamed what the digest
        records). Checked first, as an upgrade is: WorkflowVersionMismatch, nothing written, if
        the checkpoint of a run of that version not finished does not fit the graph. Returns
        what differed (None: nothing did, nothing was written). Workers that refused the
        version serve it once restarted."""
        await self.open()
        registered = self.runtime.workflows.get(workflow, version)
        self.runtime.check(registered)
        shape = self.runtime.shapes[registered.key]
        held = await self.runtime.store.graph_shape(registered.name, registered.version)
        if held is not None and held["digest"] == shape_digest(shape):
            return None
        change = "first served" if held is None else describe_change(loads(held["shape"]), shape)
        misfits = await self._misfits_of(registered)
        if misfits:
            more = f" (and {len(misfits) - 3} more)" if misfits[3:] else ""
            shown = "; ".join(misfits[:3]) + more
            raise WorkflowVersionMismatch(
                f"{registered.key}'s graph as registered here ({change}) does not fit the "
                f"checkpoints of its runs in flight: {shown}. Give it a new version instead"
            )
        await self.runtime.store.accept_graph_shape(
            registered.name, registered.version, shape_digest(shape), dumps(shape), by
        )
        log.warning(
            "%s accepted %s's graph as it is now (%s)",
            by,
            registered.key,
            change,
            extra={"event": "version.accepted"},
        )
        return change

    async def _misfits_of(self, registered: Any) -> list[str]:
        """Why runs of `registered`'s version not finished could not go on in its graph."""
        store, saver = self.runtime.store, self.runtime.fencing()
        graph = compile_graph(registered, saver)
        found = []
        for status in ("queued", "waiting", "running"):
            for run in await store.list_runs(workflow=registered.name, status=status, limit=10**6):
                if run["workflow_version"] != registered.version:
                    continue
                thread = str(run.get("thread_id") or run["run_id"])
                problems = await checkpoint_misfits(graph, saver, thread)
                found += [f"run {run['run_id']}: {p}" for p in problems]
        return found

    # -- waits ----------------------------------------------------------------------------------

    async def browse_pending_waits(
        self, *, kind: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[Row]:
        """Open waits of one kind (None: all), oldest deadline first, paged."""
        await self.open()
        return await self.runtime.store.browse_pending_waits(kind=kind, limit=limit, offset=offset)

    async def running_runs(self, limit: int = 1000) -> list[Row]:
        """Runs some worker holds now, by owner (lease token, expiry, last heartbeat)."""
        await self.open()
        return await self.runtime.store.running_runs(limit)

    async def get_wait(self, wait_id: str) -> Row:
        """One wait (approval, in-doubt effect, signal) by id; WaitNotFound if unknown."""
        await self.open()
        wait = await self.runtime.store.get_wait(wait_id)
        if wait is None:
            raise WaitNotFound(f"no wait {wait_id!r}")
        return wait

    async def pending_waits(self, limit: int = 100) -> list[Row]:
        """Open waits, oldest deadline first."""
        await self.open()
        return await self.runtime.store.pending_waits(limit)

    async def workers(self, *, silent_for: float = 0.0) -> list[Row]:
        """Workers that announced themselves within three heartbeat intervals, each with
        `state` "live"; with `silent_for`, also those not stopped that went quiet within that
        many seconds: `state` "silent" if quiet for up to three lease TTLs (waiting for the
        database, or dead: nobody can tell from here; a live one comes back by itself once it
        reaches the database), "dead" past that (every lease it held lapsed long ago: its runs
        are for other workers to take over)."""
        await self.open()
        runtime = self.runtime
        live_window = stranded.live_window(runtime.heartbeat_interval)
        dead_after = stranded.dead_after(runtime.lease_ttl, runtime.heartbeat_interval)
        rows = await runtime.store.workers(max(live_window, silent_for))
        now = await runtime.store.database_now()
        for row in rows:
            seen = row["heartbeat_at"]
            live, silent = seen >= now - live_window, seen >= now - dead_after
            row["state"] = "live" if live else "silent" if silent else "dead"
        return rows

    async def end_dead_lease(self, run_id: str, token: int) -> bool:
        """The worker holding `run_id` under `token` is dead (you saw its process exit): let
        the next claim take the run over now instead of after the lease TTL. False if that
        token no longer holds the run."""
        await self.open()
        validate_run_id(run_id)
        return await leases.end_dead(self.runtime.store, run_id, token)

    # -- the outbox of user effects (keel.core.effects.outbox, docs/outbox.md) -----------------

    async def effect_intents(
        self, *, state: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Outbox intents, oldest first: all, or those in `state` (pending, sending,
        delivered, dead, in_doubt) and/or of one run."""
        if state is not None and state not in set(IntentStatus):
            raise UsageError(f"state must be one of {', '.join(IntentStatus)}, not {state!r}")
        await self.open()
        rows = await self.runtime.store.list_intents(status=state, run_id=run_id, limit=limit)
        return [public(r) for r in rows]

    async def retry_intent(self, intent_id: str, *, by: str | None = None) -> dict[str, Any]:
        """Deliver a dead intent again, its attempts from zero (a timeline event of its run)."""
        await self.open()
        return public(await effect_dispatch.retry(self.runtime.services, intent_id, by=by))

    async def resolve_intent(
        self, intent_id: str, *, performed: bool, result: Any = None, by: str | None = None
    ) -> dict[str, Any]:
        """A person's answer on an in-doubt (or dead) intent: it reached the provider
        (delivered, never resent) or not (delivered now, under the same id)."""
        await self.open()
        return public(
            await effect_dispatch.resolve(
                self.runtime.services, intent_id, performed=performed, result=result, by=by
            )
        )

    # -- the record ---------------------------------------------------------------------------

    async def events_after(self, run_id: str, after: int = 0, limit: int = 500) -> list[Row]:
        """The run's timeline after event id `after` (RunNotFound for an unknown run)."""
        await self.open()
        validate_run_id(run_id)
        rows = await self.runtime.store.events_after(run_id, after, limit)
        if not rows and after == 0 and await self.runtime.store.get_run(run_id) is None:
            raise RunNotFound(f"no run {run_id!r}")
        return rows

    async def metrics_snapshot(self) -> dict[str, Any]:
        """The database's figures /metrics reports, and `now` by the database's clock."""
        await self.open()
        return await self.runtime.store.metrics_snapshot()

    async def run_status(self, run_id: str) -> str:
        """The run's status alone (RunNotFound for an unknown run)."""
        await self.open()
        run = await self.runtime.store.get_run(run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        return str(run["status"])

    async def prune(
        self,
        *,
        older_than: str | float,
        statuses: list[str] | None = None,
        keep_failed: bool = False,
        dry_run: bool = False,
        batch_size: int = 200,
    ) -> retention.PruneReport:
        """Delete finished runs older than `older_than` (see keel.core.retention.prune)."""
        await self.open()
        return await retention.prune(
            self.runtime.services,
            older_than=older_than,
            statuses=statuses,
            keep_failed=keep_failed,
            dry_run=dry_run,
            batch_size=batch_size,
        )
