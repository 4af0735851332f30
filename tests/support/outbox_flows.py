"""An outbox effect to a keel.testing.HttpSink (its URL in $OUTBOX_TEST_URL: the `provider`
fixtures set it), and the small graphs the outbox tests build from nodes."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypedDict

import httpx
from langgraph.graph import END, START, StateGraph

import keel
from keel.testing.http import HttpSink

URL = "OUTBOX_TEST_URL"


def _post(body: dict[str, Any], key: str) -> Any:
    response = httpx.post(
        os.environ[URL] + "/mail", json=body, headers={"Idempotency-Key": key}, timeout=10
    )
    if response.status_code >= 500:
        raise keel.TransientError(f"provider said {response.status_code}")
    response.raise_for_status()
    return response.json()


@keel.effect(
    "rt_mail",
    outbox=True,
    provider_idempotent=True,
    retry=keel.Retry(initial=0.01, maximum=0.05),
    max_attempts=3,
)
def mail(to: str, *, idempotency_key: str = keel.KEY) -> Any:
    return _post({"to": to}, idempotency_key)


@contextmanager
def serving(monkeypatch: Any) -> Iterator[HttpSink]:
    """An HttpSink on 127.0.0.1 that `mail` delivers to (a pytest MonkeyPatch sets its URL)."""
    with HttpSink() as sink:
        monkeypatch.setenv(URL, sink.url)
        yield sink


class State(TypedDict, total=False):
    to: str
    handle: str
    result: Any
    approved: bool


def drain(app: keel.App) -> None:
    app.run_worker(stop_when_idle=True, handle_signals=False, concurrency=2)


def graph(*nodes: tuple[str, Callable[[State], State]]) -> Callable[[], StateGraph]:
    def build() -> StateGraph:
        g = StateGraph(State)
        previous = START
        for name, fn in nodes:
            g.add_node(name, fn)
            g.add_edge(previous, name)
            previous = name
        g.add_edge(previous, END)
        return g

    return build


def enqueue(state: State) -> State:
    return {"handle": mail(state["to"])}


def wait(state: State) -> State:
    return {"result": keel.await_effect(state["handle"])}
