"""A failed run keeps its evidence: where it failed (node, task path, step) and a bounded
traceback with the user's frames first, shown by `get_run`, the summary, `keel runs show` and
`GET /v1/runs/{id}` — not only `KeyError: 'recipients'`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

import httpx
from langgraph.graph import END, START, StateGraph
from rich.console import Console

import keel
from keel.cli import render
from keel.core.failures import bounded_traceback, is_user_frame
from keel.service import create_app
from tests.support.apps.service import LiveServer
from tests.support.service_client import ADMIN, TOKENS, bearer
from tests.support.workers import drain


class Letter(TypedDict, total=False):
    to: str
    draft: str


def address_of(letter: dict[str, Any]) -> str:
    return str(letter["recipients"])  # the bug: the key is "to"


def draft(state: Letter) -> Letter:
    return {"draft": f"Dear {address_of(dict(state))}"}


def letter_graph() -> StateGraph:
    graph = StateGraph(Letter)
    graph.add_node("prepare", lambda state: {})
    graph.add_node("draft", draft)
    graph.add_edge(START, "prepare")
    graph.add_edge("prepare", "draft")
    graph.add_edge("draft", END)
    return graph


def failed_run(make_app: Callable[..., keel.App]) -> tuple[keel.App, str]:
    app = make_app()
    app.workflow("letter")(letter_graph)
    run_id = app.submit("letter", job_id="l-1", input={"to": "ana"}).run_id
    drain(app)
    assert app.get_run(run_id).status == "failed"
    return app, run_id


def test_a_failed_run_keeps_where_and_the_traceback(make_app: Callable[..., keel.App]) -> None:
    app, run_id = failed_run(make_app)
    details = app.get_run(run_id)
    failure = details.failure
    assert failure is not None
    assert (failure["type"], failure["message"]) == ("KeyError", "'recipients'")
    assert (failure["node"], failure["task_path"], failure["step"]) == (
        "draft",
        "__pregel_pull/draft",
        2,
    )
    assert "in address_of" in failure["traceback"] and "in draft" in failure["traceback"]
    assert "KeyError: 'recipients'\nDuring task with name 'draft'" in failure["traceback"]
    assert app.summary(run_id).why == "node draft raised at step 2: KeyError: 'recipients'"

    console = Console(width=200, record=True)
    console.print(render.run_view(details))
    shown = console.export_text()
    assert "failed in node draft, task __pregel_pull/draft, step 2: KeyError: 'recipients'" in shown
    assert "address_of" in shown

    with (
        LiveServer(create_app(app, tokens=TOKENS)) as server,
        httpx.Client(base_url=server.url, headers=bearer(ADMIN), timeout=30) as http,
    ):
        body = http.get(f"/v1/runs/{run_id}").json()
    assert body["failure"]["node"] == "draft" and "address_of" in body["failure"]["traceback"]


def test_a_long_traceback_keeps_the_users_frames_and_the_error() -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise KeyError("recipients")
        deep(n - 1)

    try:
        deep(8)
    except KeyError as exc:
        caught = exc
    kept = bounded_traceback(caught, limit=500)
    assert len(kept) <= 500 < len(bounded_traceback(caught))
    assert kept.rstrip().endswith("KeyError: 'recipients'")
    assert "in deep" in kept and "left out" in kept
    assert is_user_frame(__file__) and not is_user_frame(keel.__file__)
