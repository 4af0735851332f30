"""OpenTelemetry traces of runs (the optional extra `keel[otel]`).

One trace per run, however many attempts, workers and days it takes:

- `keel.run <workflow>`: the trace's root, drawn once by whoever first traces the run (its
  submitter, from admission; else its first worker, from admission to the claim). Its W3C
  `traceparent` is kept on the run (`keel_runs.traceparent`, first writer wins), so every later
  process finds the same trace.
- `keel.attempt <workflow>`: one per lease (claim, resume after a decision, takeover), a child
  of the run's context; a worker killed mid-attempt never ends (never exports) its span, but the
  steps it finished were exported as they ended, and the next attempt is again a child of the
  run.
- `keel.step <node>`: one per node execution (LangChain's callbacks: the same events LangSmith
  reads), children of the attempt; a subgraph's nodes are children of the node that runs it.
- `keel.effect <name>`: one per effect call through the ledger, a child of its step, with its
  idempotency key and outcome (performed, served from the ledger, resolved, waiting, failed).

Tracing is on when OpenTelemetry's API is importable and a real tracer provider is set (the
app's own `trace.set_tracer_provider(...)`, or `opentelemetry-instrument keel worker ...`);
otherwise `active()` is None and nothing here runs: no callback, no span, no query.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langgraph.errors import GraphBubbleUp

from keel.core.ids import StepRef, namespace_without_task_ids
from keel.core.store.base import Row
from keel.core.store.store import Store

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Link, Span, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the extra is absent: tracing is off
    trace = None  # type: ignore[assignment]

SCOPE = "keel"
_INTERNAL = frozenset({"__start__", "__end__"})


def active() -> RunTracer | None:
    """The tracer to use now, or None when tracing is off (no OpenTelemetry, no provider)."""
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return RunTracer(provider.get_tracer(SCOPE))


def trace_id(traceparent: str | None) -> str | None:
    """The 32-hex trace id in a W3C traceparent (`00-<trace id>-<span id>-<flags>`)."""
    parts = (traceparent or "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


def _nanos(at: float | None) -> int | None:
    return None if at is None else int(float(at) * 1e9)


class RunTracer:
    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer
        self.propagator = TraceContextTextMapPropagator()

    async def root(self, store: Store, run: Row, *, by: str) -> Any:
        """The run's trace context (an OpenTelemetry Context), its root drawn now if it has
        none yet. A span current here (an HTTP request submitting the run) is linked, not made
        the parent: each run is a trace of its own."""
        kept = run.get("traceparent")
        if not kept:
            here = trace.get_current_span().get_span_context()
            span = self.tracer.start_span(
                f"keel.run {run['workflow']}",
                context=otel_context.Context(),
                links=[Link(here)] if here.is_valid else None,
                start_time=_nanos(run.get("created_at")),
                attributes={
                    "keel.run_id": run["run_id"],
                    "keel.job_id": run["job_id"],
                    "keel.workflow": run["workflow"],
                    "keel.workflow_version": run["workflow_version"],
                    "keel.traced_by": by,
                },
            )
            carrier: dict[str, str] = {}
            self.propagator.inject(carrier, context=trace.set_span_in_context(span))
            mine = carrier.get("traceparent")
            if not mine:  # a provider that makes no valid context: nothing to keep
                return otel_context.Context()
            kept = await store.keep_traceparent(run["run_id"], mine) or mine
            if kept == mine:
                span.end()
            # else another process traced the run first: this root is dropped, never ended.
        return self.propagator.extract({"traceparent": kept})

    def attempt(self, parent: Any, run: Row, worker_id: str, token: int) -> Span:
        return self.tracer.start_span(
            f"keel.attempt {run['workflow']}",
            context=parent,
            attributes={
                "keel.run_id": run["run_id"],
                "keel.job_id": run["job_id"],
                "keel.workflow": run["workflow"],
                "keel.workflow_version": run["workflow_version"],
                "keel.worker_id": worker_id,
                "keel.lease_token": token,
            },
        )

    def steps(self, attempt: Span) -> Steps:
        return Steps(self.tracer, attempt)


@dataclass
class _Open:
    span: Span
    namespace: str  # LangGraph's checkpoint namespace of the node the span draws
    own: bool  # this callback run opened the span (a node), or inherits its nearest node's


class Steps(BaseCallbackHandler):
    """Step spans from LangChain's callbacks, and the effect spans of those steps (the
    `keel.core.tracing.Tracer` the run's context carries). One per attempt."""

    run_inline = True  # called on the event loop, in order, not from a thread pool
    raise_error = False  # a tracing bug must never fail a step

    def __init__(self, tracer: Any, attempt: Span) -> None:
        self.tracer = tracer
        self.attempt = attempt
        self._open: dict[UUID, _Open] = {}
        self._by_place: dict[tuple[str, int, str], Span] = {}
        self._lock = threading.Lock()  # nodes of a sync graph call back from their threads

    # -- steps ------------------------------------------------------------------------------

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        meta = metadata or {}
        node, namespace = meta.get("langgraph_node"), str(meta.get("langgraph_checkpoint_ns", ""))
        with self._lock:
            outer = self._open.get(parent_run_id) if parent_run_id else None
        # A node's task is the runnable named after its node in a namespace of its own; what
        # it calls (its function, a model, a tool) inherits the namespace and the span.
        is_task = node is not None and kwargs.get("name") == node
        if not is_task or (outer is not None and outer.namespace == namespace):
            if outer is not None:
                with self._lock:
                    self._open[run_id] = _Open(outer.span, outer.namespace, own=False)
            return
        if node in _INTERNAL:
            return
        parent = outer.span if outer is not None else self.attempt
        step = int(meta.get("langgraph_step", -1))
        path = "/".join(str(p) for p in meta.get("langgraph_path", ()))
        span = self.tracer.start_span(
            f"keel.step {node}",
            context=trace.set_span_in_context(parent),
            attributes={
                "keel.node": str(node),
                "keel.step": step,
                "keel.task_path": path,
                "keel.namespace": namespace_without_task_ids(namespace),
            },
        )
        with self._lock:
            self._open[run_id] = _Open(span, namespace, own=True)
            self._by_place[(namespace_without_task_ids(namespace), step, path)] = span

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._close(run_id, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._close(run_id, error)

    def _close(self, run_id: UUID, error: BaseException | None) -> None:
        with self._lock:
            entry = self._open.pop(run_id, None)
        if entry is None or not entry.own:
            return
        _finish(entry.span, error, "keel.step.outcome")
        entry.span.end()

    # -- effects (keel.core.tracing.Tracer) ---------------------------------------------------

    @contextmanager
    def effect(self, where: StepRef, name: str) -> Iterator[_Noted]:
        with self._lock:
            parent = self._by_place.get((where.namespace, where.step, where.path), self.attempt)
        span = self.tracer.start_span(
            f"keel.effect {name}",
            context=trace.set_span_in_context(parent),
            attributes={"keel.effect": name, "keel.node": where.node, "keel.step": where.step},
        )
        try:
            yield _Noted(span)
        except BaseException as exc:
            _finish(span, exc, "keel.effect.outcome")
            raise
        finally:
            span.end()

    def close(self) -> None:
        """End what the attempt left open (a lease lost mid-step): the steps it did not end."""
        with self._lock:
            left = [e.span for e in self._open.values() if e.own]
            self._open.clear()
            self._by_place.clear()
        for span in left:
            span.set_attribute("keel.step.outcome", "abandoned")
            span.end()


class _Noted:
    def __init__(self, span: Span) -> None:
        self.span = span

    def note(self, **attributes: Any) -> None:
        for key, value in attributes.items():
            self.span.set_attribute(f"keel.effect.{key}", value)


def _finish(span: Span, error: BaseException | None, outcome: str) -> None:
    if error is None:
        span.set_attribute(outcome, "ok")
    elif isinstance(error, GraphBubbleUp):
        # An interrupt: the step (or the effect in doubt) waits for a person, not an error.
        span.set_attribute(outcome, "waiting")
    else:
        span.set_attribute(outcome, "error")
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:500]))


def end_attempt(span: Span, outcome: str, error: BaseException | None = None) -> None:
    span.set_attribute("keel.attempt.outcome", outcome)
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:500]))
    span.end()


@contextmanager
def current(span: Span) -> Iterator[None]:
    """`span` is the current span inside: what the nodes' own instrumentation (an HTTP client,
    a model SDK) traces joins the run's trace under the attempt."""
    with trace.use_span(
        span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    ):
        yield
