"""`keel serve`: the HTTP API on uvicorn."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from keel.core import logs
from keel.runtime.app import App
from keel.runtime.loading import load_app
from keel.service.read_timeouts import protocol_with, read_timeouts


def serve(
    app_spec_or_app: str | App,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    log_level: str = "info",
    header_timeout: float | str | None = None,
    body_timeout: float | str | None = None,
    **create_app_kwargs: Any,
) -> None:
    """Serve the HTTP API of a keel.App (or `module:attribute` naming one) until SIGINT/SIGTERM.

    Requests only record and wake workers: run workers separately (`keel worker APP`). A
    request whose headers take longer than `header_timeout` (default 10 s), or whose body takes
    longer than `body_timeout` (30 s), to arrive is cut off (keel.service.read_timeouts).
    """
    import uvicorn

    from keel.service.api import create_app

    if not logging.getLogger().handlers:
        # Called from Python rather than `keel serve`: the same setup as every Keel process.
        logs.configure(log_level)
    owned = isinstance(app_spec_or_app, str)
    keel_app = load_app(app_spec_or_app) if isinstance(app_spec_or_app, str) else app_spec_or_app
    try:
        api = create_app(keel_app, **create_app_kwargs)
        if owned:
            _close_on_shutdown(api, keel_app)
        # log_config=None: uvicorn's records go through Keel's handler (keel.core.logs), with
        # the same format and redaction as everything else.
        protocol = protocol_with(*read_timeouts(header_timeout, body_timeout))
        uvicorn.run(
            api,
            host=host,
            port=port,
            log_level=log_level,
            ws="none",
            http=protocol,
            log_config=None,
        )
    except BaseException:
        if owned:
            keel_app.close()
        raise


def _close_on_shutdown(api: FastAPI, keel_app: App) -> None:
    """Close the App when uvicorn shuts down gracefully.

    uvicorn re-raises the SIGTERM/SIGINT it caught once it has drained, so code after
    `uvicorn.run()` never runs on a signal; the lifespan's exit does.
    """
    inner = api.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        async with inner(app) as state:
            yield state
        # close() blocks on the App's own loop; keep uvicorn's loop free meanwhile.
        await asyncio.to_thread(keel_app.close)

    api.router.lifespan_context = lifespan
