"""Upstream's PostgreSQL saver serializes a checkpoint's changed blob channels in a thread; a
worker does it on its loop while they are small (keel.langgraph.recording.small_state) and in
a thread once they are not, and the checkpoints are the same either way."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.backends.pg_batch import LARGE
from tests.support.workers import claim, execute

AppFactory = Callable[..., keel.App]


class Notes(TypedDict, total=False):
    notes: Annotated[list[str], operator.add]  # a list: kept as a blob, not inline


def grows() -> StateGraph:
    def short(state: Notes) -> dict[str, Any]:
        return {"notes": ["short"]}

    def long(state: Notes) -> dict[str, Any]:
        return {"notes": ["x" * (LARGE + 1)]}

    g = StateGraph(Notes)
    g.add_node("short", short)
    g.add_node("long", long)
    g.add_edge(START, "short")
    g.add_edge("short", "long")
    g.add_edge("long", END)
    return g


# PostgreSQL only: upstream's SQLite saver serializes on the loop itself.
@pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_small_blobs_are_serialized_on_the_loop_and_large_ones_in_a_thread(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow("grows")(grows)
    runtime = app.aio.runtime
    portal = runtime.portal
    portal.call(runtime.open())
    saver = runtime.fencing()
    dumped: list[tuple[int, bool]] = []  # (bytes of notes, serialized on the loop)
    dump = saver._dump_blobs

    def watched(thread_id: str, ns: str, values: dict[str, Any], versions: Any) -> Any:
        if "notes" in values:
            dumped.append((sum(map(len, values["notes"])), portal.on_loop()))
        return dump(thread_id, ns, values, versions)

    saver._dump_blobs = watched  # type: ignore[method-assign]
    run = app.submit("grows", job_id="blobs-1", input={"notes": []})["run_id"]
    assert execute(app, *claim(app, "w-a")) == "completed"
    assert app.get_run(run).output == {"notes": ["short", "x" * (LARGE + 1)]}
    small = [on_loop for size, on_loop in dumped if size <= LARGE]
    large = [on_loop for size, on_loop in dumped if size > LARGE]
    assert small and all(small), dumped
    assert large and not any(large), dumped
