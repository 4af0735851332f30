"""The HTTP service's traces: one span per request, through OpenTelemetry's FastAPI
instrumentation (in the extra `keel[otel]`). A run submitted by a request roots its own trace,
linked to the request's span (keel.langgraph.traces). Without the package, nothing is added."""

from __future__ import annotations

from fastapi import FastAPI

# Probes and scrapes every few seconds would bury the requests people trace.
EXCLUDED = "healthz,readyz,metrics"


def instrument(api: FastAPI) -> bool:
    """Trace `api`'s requests; False when the instrumentation is not installed."""
    try:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    except ImportError:
        return False
    FastAPIInstrumentor.instrument_app(api, excluded_urls=EXCLUDED)
    return True
