"""The HTTP service's fixtures, shared by its tests and the mixed HTTP + Slack decision test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import keel
from keel.service import create_app
from tests.support.apps.service import PERFORMED, LiveServer, register
from tests.support.service_client import TOKENS, Service


@pytest.fixture
def serve(make_app: Callable[..., keel.App]) -> Iterator[Callable[..., Service]]:
    """Start a server for a new App (register the workflows, pass create_app options)."""
    PERFORMED.clear()
    started: list[tuple[LiveServer, Service]] = []

    def start(app_kwargs: dict[str, Any] | None = None, **options: Any) -> Service:
        app = register(make_app(lease_ttl=5, **(app_kwargs or {})))
        options.setdefault("tokens", TOKENS)
        server = LiveServer(create_app(app, **options)).__enter__()
        started.append((server, Service(app, server.url)))
        return started[-1][1]

    yield start
    for server, service in started:
        service.close()
        server.__exit__(None, None, None)


@pytest.fixture
def svc(serve: Callable[..., Service]) -> Service:
    return serve()
