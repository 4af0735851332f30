"""Prometheus metrics: `/metrics` on `keel serve`, and a worker's `--metrics-port`.

Two sources, each metric from exactly one:

- What the database holds (runs per status, the queue, the ledger, open waits, the outbox, the
  sweeper's lag) is read at scrape time by a custom collector from Store read methods, so every
  process reports the same cluster-wide figures and nothing drifts after a restart.
- What this process did (steps and runs executed, takeovers, heartbeat failures, provider calls,
  notification failures, database errors) is counted in-process from the log records Keel
  already emits for each of them (`keel.core.logs`): a line in the log and a count here cannot
  disagree, and there is no second set of calls to keep in step.

docs/operations.md lists every metric and a starter set of alerts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from keel.core import logs
from keel.core.errors import UsageError
from keel.runtime.app import App

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "generate_latest", "metrics_for"]

_FINISHED_EVENTS = {"status.completed", "status.failed", "status.cancelled"}
_DB_MODULES = ("psycopg", "psycopg_pool", "sqlite3", "aiosqlite")
_STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_RUN_BUCKETS = (0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 86400)


class DatabaseCollector(Collector):
    """Gauges describing the database, computed at each scrape."""

    def __init__(self, app: App, on_error: Any) -> None:
        self.app = app
        self.on_error = on_error

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("keel_database_up", "1 if the last scrape could read the database.")
        try:
            snap = self.app.metrics_snapshot()
        except Exception as exc:
            self.on_error(exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        now = snap["now"]

        runs = GaugeMetricFamily(
            "keel_runs",
            "Runs by workflow, version and status.",
            labels=["workflow", "version", "status"],
        )
        for row in snap["runs"]:
            runs.add_metric(
                [row["workflow"], str(row["workflow_version"]), row["status"]], row["n"]
            )
        yield runs

        queue = snap["queue"]
        yield GaugeMetricFamily(
            "keel_queue_depth", "Runs queued for a worker.", value=queue["n"] or 0
        )
        yield GaugeMetricFamily(
            "keel_queue_oldest_age_seconds",
            "Age of the oldest queued run (0 when none is queued).",
            value=_age(now, queue["oldest"]),
        )

        effects = GaugeMetricFamily(
            "keel_effects",
            "Ledger rows by effect and state (in_doubt needs a person).",
            labels=["effect", "state"],
        )
        in_doubt = 0
        for row in snap["effects"]:
            effects.add_metric([row["name"], row["status"]], row["n"])
            in_doubt += row["n"] if row["status"] == "in_doubt" else 0
        yield effects
        yield GaugeMetricFamily(
            "keel_effects_in_doubt", "Effects in doubt, all names together.", value=in_doubt
        )

        waits = GaugeMetricFamily("keel_waits_pending", "Open waits by kind.", labels=["kind"])
        ages = GaugeMetricFamily(
            "keel_waits_oldest_age_seconds", "Age of the oldest open wait by kind.", labels=["kind"]
        )
        for row in snap["waits"]:
            waits.add_metric([row["kind"]], row["n"])
            ages.add_metric([row["kind"]], _age(now, row["oldest"]))
        yield waits
        yield ages

        outbox = GaugeMetricFamily("keel_outbox", "Notifications by state.", labels=["state"])
        backlog, oldest = 0, None
        for row in snap["outbox"]:
            outbox.add_metric([row["status"]], row["n"])
            if row["status"] in ("queued", "sending"):
                backlog += row["n"]
                if row["oldest"] is not None:
                    oldest = row["oldest"] if oldest is None else min(oldest, row["oldest"])
        yield outbox
        yield GaugeMetricFamily(
            "keel_outbox_backlog",
            "Notifications not yet delivered (queued or sending).",
            value=backlog,
        )
        yield GaugeMetricFamily(
            "keel_outbox_oldest_age_seconds",
            "Age of the oldest undelivered notification.",
            value=_age(now, oldest),
        )
        intents = GaugeMetricFamily(
            "keel_effect_intents",
            "Outbox effect intents by effect and state (dead: the dead letters).",
            labels=["effect", "state"],
        )
        undelivered = None
        for row in snap.get("intents", []):
            intents.add_metric([row["effect"], row["status"]], row["n"])
            if row["status"] in ("pending", "sending") and row["oldest"] is not None:
                undelivered = (
                    row["oldest"] if undelivered is None else min(undelivered, row["oldest"])
                )
        yield intents
        yield GaugeMetricFamily(
            "keel_effect_intents_oldest_age_seconds",
            "Age of the oldest outbox effect intent not delivered yet (pending or sending).",
            value=_age(now, undelivered),
        )
        yield GaugeMetricFamily(
            "keel_sweeper_lag_seconds",
            "How long ago the oldest passed deadline, stage or expired lease became due and is "
            "still not handled (0 when nothing is overdue).",
            value=_age(now, snap["overdue"]),
        )


def _age(now: float, then: float | None) -> float:
    return 0.0 if then is None else max(0.0, float(now) - float(then))


def _workflow_labels(record: logging.LogRecord) -> tuple[str, str]:
    """The record's workflow as (name, version) labels. Log lines carry `name@version` in
    one field; metrics keep them apart, as `keel_runs` does, so that a counter and a gauge
    join on `workflow` and a dashboard can sum over versions."""
    key = str(getattr(record, "workflow", "") or "")
    name, at, version = key.rpartition("@")  # the last "@", as keel.core.versions splits keys
    return (name, version) if at else (key, "")


class Metrics(logging.Handler):
    """One process's registry: the database collector and the counters fed by log records."""

    def __init__(self, app: App) -> None:
        super().__init__(logging.DEBUG)
        self.set_name("keel-metrics")
        self.addFilter(logs.ContextFilter())
        self.registry = CollectorRegistry()
        r = self.registry

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, labels, registry=r)

        def histogram(name: str, doc: str, buckets: Sequence[float], *labels: str) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r)

        self.events = counter(
            "keel_events", "Timeline events committed by this process, by kind.", "kind"
        )
        self.finished = counter(
            "keel_runs_finished",
            "Runs this process finished, by workflow, version and status.",
            "workflow",
            "version",
            "status",
        )
        self.run_seconds = histogram(
            "keel_run_duration_seconds",
            "Execution time of a run's final attempt, claim to finish, by workflow, version and "
            "status.",
            _RUN_BUCKETS,
            "workflow",
            "version",
            "status",
        )
        self.step_seconds = histogram(
            "keel_step_duration_seconds",
            "Time from a run's previous step boundary to this step's writes, by workflow, version "
            "and node.",
            _STEP_BUCKETS,
            "workflow",
            "version",
            "node",
        )
        self.takeovers = counter(
            "keel_lease_takeovers", "Runs this process took over from a worker whose lease expired."
        )
        self.leases_lost = counter(
            "keel_leases_lost", "Leases this process found taken over (it stopped the run)."
        )
        self.heartbeat_failures = counter(
            "keel_heartbeat_failures", "Lease renewals that failed (the database did not answer)."
        )
        self.effect_seconds = histogram(
            "keel_effect_call_duration_seconds",
            "Provider calls made for effects and their reconcilers, by effect, call and outcome.",
            _STEP_BUCKETS,
            "effect",
            "call",
            "outcome",
        )
        self.effects_in_doubt = counter(
            "keel_effects_marked_in_doubt",
            "Effects this process marked in doubt, by workflow and version.",
            "workflow",
            "version",
        )
        self.delivery_failures = counter(
            "keel_outbox_delivery_failures",
            "Notifications that ended failed or in doubt here, by notifier outcome.",
            "outcome",
        )
        self.webhook_deliveries = counter(
            "keel_webhook_deliveries",
            "Completion webhook delivery attempts made here, by outcome (delivered, retry, "
            "refused: a 4xx; blocked: a private address not allowed).",
            "outcome",
        )
        self.webhook_refusals = counter(
            "keel_webhook_refusals",
            "Inbound webhook deliveries refused here, by reason (bad_signature, "
            "stale_timestamp, body_too_large, malformed_json, ...).",
            "reason",
        )
        self.db_errors = counter(
            "keel_database_errors",
            "Database errors seen by this process, by exception class.",
            "kind",
        )
        self.ticks = counter(
            "keel_schedule_ticks",
            "Schedule ticks this process's scheduler handled, by outcome (fired, skipped, "
            "queued, triggered, missed, failed).",
            "outcome",
        )
        self.tick_lateness = histogram(
            "keel_schedule_tick_lateness_seconds",
            "Seconds from a tick's time to its run's admission, by the database's clock.",
            _STEP_BUCKETS,
        )
        r.register(DatabaseCollector(app, self._database_error))

    def _database_error(self, exc: BaseException) -> None:
        self.db_errors.labels(type(exc).__name__).inc()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._count(record)
        except Exception:  # a metric must never break the code that logged
            self.handleError(record)

    def _count(self, record: logging.LogRecord) -> None:
        if (kind := getattr(record, "db_error", None)) is not None:
            self.db_errors.labels(str(kind)).inc()  # a fault ridden out, logged without a trace
        elif record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            if type(exc).__module__.split(".")[0] in _DB_MODULES:
                self._database_error(exc)
        kind = getattr(record, "event", None)
        if kind is None:
            return
        workflow = _workflow_labels(record)
        duration = getattr(record, "duration", None)
        if record.name == logs.EVENTS.name:
            self.events.labels(kind).inc()
        if kind in _FINISHED_EVENTS:
            status = kind.removeprefix("status.")
            self.finished.labels(*workflow, status).inc()
            if duration is not None:
                self.run_seconds.labels(*workflow, status).observe(duration)
        elif kind == "step" and duration is not None:
            node = str(getattr(record, "node", ""))
            self.step_seconds.labels(*workflow, node).observe(duration)
        elif kind == "lease.takeover":
            self.takeovers.inc()
        elif kind == "lease.lost":
            self.leases_lost.inc()
        elif kind == "heartbeat.failed":
            self.heartbeat_failures.inc()
        elif kind in ("effect.perform", "effect.reconcile") and duration is not None:
            outcome = "error" if "error=" in record.getMessage() else "ok"
            name = str(getattr(record, "effect", ""))
            self.effect_seconds.labels(name, kind.split(".")[1], outcome).observe(duration)
        elif kind.startswith("schedule."):
            self.ticks.labels(kind.removeprefix("schedule.")).inc()
            if kind == "schedule.fired" and duration is not None:
                self.tick_lateness.observe(duration)
        elif kind == "effect.in_doubt":
            self.effects_in_doubt.labels(*workflow).inc()
        elif kind in ("notification.failed", "notification.in_doubt"):
            self.delivery_failures.labels(kind.split(".")[1]).inc()
        elif kind == "webhook.delivery":
            self.webhook_deliveries.labels(str(getattr(record, "outcome", ""))).inc()
        elif kind == "webhook.refused":
            self.webhook_refusals.labels(str(getattr(record, "reason", ""))).inc()

    def scrape(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve this registry on http://host:port/metrics from a daemon thread."""
        try:
            start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:  # the port in use: a traceback before
            raise UsageError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None

    def detach(self) -> None:
        """Stop counting (not `close`: logging's own reconfiguration, as uvicorn does at start,
        closes every handler, and the counts must go on)."""
        logging.getLogger("keel").removeHandler(self)


def metrics_for(app: App) -> Metrics:
    """The App's metrics, created (and fed from Keel's log records) on first use."""
    existing = getattr(app, "_metrics", None)
    if isinstance(existing, Metrics):
        return existing
    metrics = Metrics(app)
    keel_logger = logging.getLogger("keel")
    keel_logger.addHandler(metrics)
    logs.keep_info(keel_logger)
    app._metrics = metrics  # type: ignore[attr-defined]
    return metrics
