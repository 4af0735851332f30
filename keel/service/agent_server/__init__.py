"""The LangGraph Agent Server protocol on Keel: what langgraph-sdk, LangGraph Studio and
agent-chat-ui speak, served at the root of Keel's HTTP API (docs/agent-server.md).

`agent_server_router` combines its parts: `/ok` and `/info` (info.py), assistants
(assistants.py and assistant_book.py: the default assistant of each registered workflow and
assistants of one's own, with versions), threads with their state and
history (threads.py), runs and their streams (runs.py, stream.py), the store (store.py). The
JSON shapes of assistants, threads, states and runs are in shapes.py.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from keel.runtime.app import App
from keel.service.agent_server.assistants import assistants_router
from keel.service.agent_server.authz import gate_for
from keel.service.agent_server.crons import crons_router
from keel.service.agent_server.info import info_router
from keel.service.agent_server.run_batches import run_batches_router
from keel.service.agent_server.runs import runs_router
from keel.service.agent_server.store import store_router
from keel.service.agent_server.thread_prune import thread_prune_router
from keel.service.agent_server.thread_stream import thread_stream_router
from keel.service.agent_server.threads import threads_router
from keel.service.auth import Authenticator


def agent_server_router(keel_app: App, auth: Authenticator, *, user_auth: Any = None) -> APIRouter:
    """Every endpoint of the Agent Server protocol Keel serves, for `keel_app`: under
    `user_auth` (a `langgraph_sdk.Auth`), else the `auth` section of the langgraph.json
    `keel_app` was loaded from, else `auth` (Keel's tokens, sent as `x-api-key` or
    `Authorization: Bearer`). See authz.py."""
    gate = gate_for(keel_app, auth, user_auth)
    router = APIRouter()
    parts = (
        info_router(),
        assistants_router(keel_app, gate),
        threads_router(keel_app, gate),
        thread_stream_router(keel_app, gate),
        thread_prune_router(keel_app, gate),
        crons_router(keel_app, gate),
        runs_router(keel_app, gate),
        run_batches_router(keel_app, gate),
        store_router(keel_app, gate),
    )
    # The parts' routes in one flat router, not one included router each: FastAPI tries an
    # included router's routes only after walking every level above it, at each request. The
    # parts set no prefix or dependency of their own at inclusion, so this is the same routes
    # in the same order.
    for part in parts:
        router.routes.extend(part.routes)
    return router


__all__ = ["agent_server_router"]
