"""The workflow the HTTP tests drive, and a real uvicorn server to drive it through.

`review`: write a draft artifact -> wait for an editor's approval -> tell the requester the
outcome through a ledger effect (whatever the decision, so "performed once" is checkable for
either winner). `PERFORMED` records every real performance of that effect in this process.

`python -c "from keel.service import serve; serve('tests.support.apps.service:app', ...)"` imports
`app` lazily (module __getattr__), bound to $KEEL_DATABASE_URL.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, TypedDict

import uvicorn
from fastapi import FastAPI
from langgraph.graph import END, START, StateGraph

import keel

WORKFLOW = "review"
PERFORMED: list[dict[str, str]] = []


class State(TypedDict, total=False):
    topic: str
    timeout: str
    decision: str
    notified: str


@keel.effect("notify_requester")
def notify_requester(topic: str, decision: str, *, idempotency_key: str) -> dict[str, str]:
    PERFORMED.append({"key": idempotency_key, "topic": topic, "decision": decision})
    return {"topic": topic, "decision": decision}


def prepare(state: State) -> State:
    keel.artifacts().write_text(
        "draft.md", f"# {state['topic']}\n\nA draft about {state['topic']}.\n"
    )
    return {}


def review(state: State) -> State:
    answer = keel.approval(
        "editor",
        payload={"topic": state["topic"]},
        timeout=state.get("timeout", "24h"),
        on_timeout="reject",
    )
    return {"decision": answer.decision}


def notify(state: State) -> State:
    result = notify_requester(state["topic"], state["decision"])
    return {"notified": result["decision"]}


def build() -> StateGraph:
    g = StateGraph(State)
    g.add_node("prepare", prepare)
    g.add_node("review", review)
    g.add_node("notify", notify)
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "review")
    g.add_edge("review", "notify")
    g.add_edge("notify", END)
    return g


def register(app: keel.App) -> keel.App:
    app.workflow(WORKFLOW)(build)
    app.workflow("other")(build)
    return app


_lazy: dict[str, keel.App] = {}


def __getattr__(name: str) -> Any:
    if name == "app":
        if "app" not in _lazy:
            _lazy["app"] = register(keel.App())
        return _lazy["app"]
    raise AttributeError(name)


class LiveServer:
    """A real uvicorn server on 127.0.0.1 in a background thread, on a port the OS picked."""

    def __init__(self, api: FastAPI) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            api, host="127.0.0.1", port=self.port, log_level="warning", ws="none", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
        if self._thread.is_alive():
            raise RuntimeError("uvicorn did not stop")
