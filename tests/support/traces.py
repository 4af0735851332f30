"""Spans for the trace tests: this process's in-memory exporter, and a JSON-lines exporter for
worker processes.

OpenTelemetry's tracer provider is set once per process, so `collected()` sets it on first use
and hands back the one exporter (cleared by each test). A worker process exports through
`JsonLines` when its app module finds $KEEL_TEST_SPANS (tests/support/apps/traced.py): one JSON
object per ended span, written and flushed at once, so what a SIGKILLed worker ended is on disk.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

ENV = "KEEL_TEST_SPANS"
_memory: InMemorySpanExporter | None = None
_lock = threading.Lock()


def collected() -> InMemorySpanExporter:
    """This process's exporter (the provider installed on first call), emptied."""
    global _memory
    with _lock:
        if _memory is None:
            _memory = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(_memory))
            trace.set_tracer_provider(provider)
        _memory.clear()
        return _memory


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "attributes": dict(span.attributes or {}),
        "links": [f"{link.context.trace_id:032x}" for link in span.links],
        "status": span.status.status_code.name,
    }


class JsonLines(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                out.write(json.dumps(as_dict(span), default=str) + "\n")
            out.flush()
        return SpanExportResult.SUCCESS


def export_to(path: str) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLines(path)))
    trace.set_tracer_provider(provider)


def read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
