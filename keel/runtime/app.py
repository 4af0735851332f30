"""`keel.App`: the public, synchronous face of Keel's async core.

Each operation is its `keel.AsyncApp` twin handed to the App's own event loop (keel.core.portal)
by a `sync_of` descriptor (keel.runtime.facade), declared once; async code uses `app.aio`.
Registration, notifiers and the App's lifetime are its own.
"""

from __future__ import annotations

import atexit
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from keel.core.clock import Clock
from keel.core.errors import UsageError
from keel.core.infra import Attempts
from keel.core.notifications import Notifier
from keel.core.webhooks import TOLERANCE, WebhookSettings
from keel.core.workflows import Workflow
from keel.runtime.aio import AsyncApp
from keel.runtime.facade import sync_of
from keel.runtime.inbound import MAX_BYTES, InboundHook, Verifier
from keel.runtime.runtime import DEFAULT_URL
from keel.runtime.schedules import Schedules, schedule_spec

F = TypeVar("F", bound=Callable[[], Any])


class App:
    def __init__(
        self,
        url: str | None = None,
        *,
        clock: Clock | None = None,
        artifacts_dir: str | Path | None = None,
        lease_ttl: float = 30.0,
        heartbeat_interval: float | None = None,
        max_input_bytes: int = 1_000_000,
        max_attempts: int = 5,
        max_infra_retries: int = 20,
        retry_backoff: float = 1.0,
        effect_timeout: float | None = None,
        webhook_secret: str | None = None,
        webhook_allow_hosts: list[str] | str | None = None,
        webhook_attempts: int = 10,
        webhook_deadline: float | None = None,
    ) -> None:
        """`url` defaults to $KEEL_DATABASE_URL, then `sqlite:///.keel/keel.db`.

        `max_attempts`: executions of one run that may crash outside its graph's nodes (with a
        backoff from `retry_backoff` seconds, doubling, capped at a minute) before it ends
        failed; `max_infra_retries`: executions an infrastructure fault may interrupt.
        `effect_timeout`: seconds one provider call of an effect that declares no `timeout=`
        may take (default $KEEL_EFFECT_TIMEOUT, else 60; docs/effects.md).
        `webhook_secret` (a `whsec_` secret; default $KEEL_WEBHOOK_SECRET) signs completion
        webhooks; `webhook_allow_hosts` (default $KEEL_WEBHOOK_ALLOW_HOSTS) lists the private
        addresses, networks or host names they may reach; `webhook_attempts`: deliveries of
        one before it is dead; `webhook_deadline`: seconds one delivery may take in all
        (default $KEEL_WEBHOOK_DEADLINE, else 30; docs/webhooks.md).
        """
        self.aio = AsyncApp(
            url or os.environ.get("KEEL_DATABASE_URL") or DEFAULT_URL,
            clock=clock,
            artifacts_root=artifacts_dir or os.environ.get("KEEL_ARTIFACTS_DIR", ".keel/artifacts"),
            lease_ttl=_lease_ttl(lease_ttl),
            heartbeat_interval=heartbeat_interval,
            max_input_bytes=max_input_bytes,
            attempts=Attempts(
                max_crashes=max_attempts,
                max_infra_retries=max_infra_retries,
                backoff=retry_backoff,
                max_backoff=max(60.0, retry_backoff),
            ),
            effect_timeout=effect_timeout,
            webhooks=WebhookSettings.configure(
                webhook_secret,
                webhook_allow_hosts,
                max_attempts=webhook_attempts,
                deadline=webhook_deadline,
            ),
        )
        self._portal = self.aio.runtime.portal
        self.schedules = Schedules(self.aio.schedules)
        """Crons and intervals that start runs (docs/schedules.md)."""
        self.hooks: dict[str, InboundHook] = {}
        """Inbound webhooks by name (`webhook`), served by `keel serve` at /hooks/{name}."""
        # A script that never calls close() would otherwise end with its pool's tasks destroyed
        # mid-flight ("Task was destroyed but it is pending!"); the weak reference keeps the
        # exit hook from keeping the App alive.
        ref = weakref.ref(self)

        def close_at_exit() -> None:
            if (app := ref()) is not None:
                app.close()

        self._close_at_exit = close_at_exit
        atexit.register(close_at_exit)

    @property
    def url(self) -> str:
        return self.aio.runtime.url

    def workflow(
        self,
        name: str,
        version: str = "1",
        *,
        durability: str = "sync",
        termination: Callable[[Any], str | None] | None = None,
        recursion_limit: int = 100,
        max_concurrency: int | None = None,
        schedule: Any = None,
    ) -> Callable[[F], F]:
        """Register a function returning an uncompiled LangGraph builder (a StateGraph).

        `termination(final_state)` may name the run's termination reason (e.g.
        "max_revisions_exceeded"); `max_concurrency` caps running runs across all workers.
        The graph is built and compiled here: one that cannot compile raises InvalidWorkflow.
        `schedule` (a cron expression, seconds between ticks, or a dict of
        `app.schedules.create`'s options) starts a run at each tick: the schedule, named after
        the workflow, is upserted by every worker at its start (docs/schedules.md).
        """
        spec = None if schedule is None else schedule_spec(schedule)

        def register(factory: F) -> F:
            self.aio.runtime.register(
                Workflow(
                    name,
                    version,
                    factory,
                    durability,
                    termination,
                    recursion_limit,
                    max_concurrency,
                    spec,
                )
            )
            return factory

        return register

    def webhook(
        self,
        name: str,
        *,
        workflow: str,
        verify: str | Verifier = "standard",
        secret: str | None = None,
        job_id: str | Callable[[Any], str] | None = None,
        input: Callable[[Any], Any] | None = None,
        tolerance: float = TOLERANCE,
        max_bytes: int = MAX_BYTES,
    ) -> InboundHook:
        """Declare `POST /hooks/{name}` on `keel serve`: a signed delivery (`verify`:
        "standard", "github", "stripe" with `secret`, or a function of the headers and body)
        becomes a submit of `workflow`, once per delivery id (docs/webhooks.md). `job_id`: a
        template of payload fields (`"pr-{pull_request.number}"`) or a function of the payload
        (default: one job per delivery); `input`: a function of the payload (default: it)."""
        hook = InboundHook(
            name, workflow, verify, secret, job_id, input, float(tolerance), int(max_bytes)
        )
        self.hooks[name] = hook
        return hook

    def add_notifier(self, notifier: Notifier) -> Notifier:
        """Deliver wait notifications (request, remind, escalate, decided, expired) through it."""
        if not isinstance(notifier, Notifier):
            raise UsageError("a notifier needs `name`, `kinds` and `send(notification)`")
        self.aio.runtime.notifiers[notifier.name] = notifier
        return notifier

    migrate = sync_of(AsyncApp.migrate)
    schema_version = sync_of(AsyncApp.schema_version)

    @property
    def latest_schema_version(self) -> int:
        """The schema version this Keel needs."""
        return self.aio.latest_schema_version

    # Each operation once, from its async twin: the same parameters, return type and docstring.
    submit = sync_of(AsyncApp.submit)
    accept_hook_delivery = sync_of(AsyncApp.accept_hook_delivery)
    get_run = sync_of(AsyncApp.get_run)
    list_runs = sync_of(AsyncApp.list_runs)
    browse_runs = sync_of(AsyncApp.browse_runs)
    summary = sync_of(AsyncApp.summary)
    replay = sync_of(AsyncApp.replay)
    approve = sync_of(AsyncApp.approve)
    reject = sync_of(AsyncApp.reject)
    get_wait = sync_of(AsyncApp.get_wait)
    pending_waits = sync_of(AsyncApp.pending_waits)
    browse_pending_waits = sync_of(AsyncApp.browse_pending_waits)
    running_runs = sync_of(AsyncApp.running_runs)
    database_now = sync_of(AsyncApp.database_now)
    workers = sync_of(AsyncApp.workers)
    upgrade_run = sync_of(AsyncApp.upgrade_run)
    accept_graph = sync_of(AsyncApp.accept_graph)
    stranded_runs = sync_of(AsyncApp.stranded_runs)
    cancel = sync_of(AsyncApp.cancel)
    end_dead_lease = sync_of(AsyncApp.end_dead_lease)
    resume = sync_of(AsyncApp.resume)
    resolve_effect = sync_of(AsyncApp.resolve_effect)
    effect_intents = sync_of(AsyncApp.effect_intents)
    retry_intent = sync_of(AsyncApp.retry_intent)
    resolve_intent = sync_of(AsyncApp.resolve_intent)
    events_after = sync_of(AsyncApp.events_after)
    run_status = sync_of(AsyncApp.run_status)
    metrics_snapshot = sync_of(AsyncApp.metrics_snapshot)
    prune = sync_of(AsyncApp.prune)
    # Threads: conversations of many runs (keel.runtime.conversations).
    wait = sync_of(AsyncApp.wait)
    create_thread = sync_of(AsyncApp.create_thread)
    get_thread = sync_of(AsyncApp.get_thread)
    search_threads = sync_of(AsyncApp.search_threads)
    update_thread = sync_of(AsyncApp.update_thread)
    delete_thread = sync_of(AsyncApp.delete_thread)
    copy_thread = sync_of(AsyncApp.copy_thread)
    thread_runs = sync_of(AsyncApp.thread_runs)
    active_run = sync_of(AsyncApp.active_run)
    get_state = sync_of(AsyncApp.get_state)
    get_history = sync_of(AsyncApp.get_history)
    update_state = sync_of(AsyncApp.update_state)
    resume_thread = sync_of(AsyncApp.resume_thread)
    # SIGTERM/SIGINT are taken by the calling thread and handed to the loop (keel.runtime.facade).
    run_worker = sync_of(AsyncApp.run_worker, relay_signals=True)
    run_dispatcher = sync_of(AsyncApp.run_dispatcher, relay_signals=True)

    def close(self) -> None:
        atexit.unregister(self._close_at_exit)
        if self._portal.started:
            self._portal.call(self.aio.close())
        self._portal.close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lease_ttl(given: float) -> float:
    """$KEEL_LEASE_TTL (seconds) if set, else `given`; a clear UsageError for a value that is
    no number (a traceback before)."""
    text = os.environ.get("KEEL_LEASE_TTL")
    if not text:
        return given
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"KEEL_LEASE_TTL={text[:40]!r} is not a number of seconds") from None
