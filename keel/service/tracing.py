"""The HTTP service's traces: one span per request, through OpenTelemetry's FastAPI
instrumentation (in the extra `keel[otel]`). A run submitted by a request roots its own trace,
linked to the request's span (keel.langgraph.traces). Without the package, or without a tracer
provider set when the service is created, nothing is added: the instrumentation matches every
request against the routes a second time to name its span, which cost about a quarter of a
request's CPU in `keel dev` (bench case 13) for spans nobody records."""

from __future__ import annotations

from fastapi import FastAPI

# Probes and scrapes every few seconds would bury the requests people trace.
EXCLUDED = "healthz,readyz,metrics"


def instrument(api: FastAPI) -> bool:
    """Trace `api`'s requests; False when the instrumentation is not installed or no tracer
    provider is set (the app's own, or `opentelemetry-instrument`'s)."""
    try:
        from opentelemetry import trace
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    except ImportError:
        return False
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return False
    FastAPIInstrumentor.instrument_app(api, excluded_urls=EXCLUDED)
    return True
