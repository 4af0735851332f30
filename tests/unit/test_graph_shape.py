"""A graph's structural digest: what changes it, what does not, and how a change is named."""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from keel.langgraph.shape import describe_change, graph_shape, shape_digest


class State(TypedDict, total=False):
    draft: str
    log: Annotated[list[str], operator.add]


def write(state: Any) -> dict[str, Any]:
    return {"draft": "hello"}


def review_route(state: Any) -> Literal["send", "__end__"]:
    return "send"


def build(
    review: str = "review",
    *,
    branch: bool = True,
    state: type[Any] = State,
    body: Any = write,
) -> StateGraph[Any]:
    graph = StateGraph(state)
    graph.add_node("draft", body)
    graph.add_node(review, write)
    graph.add_node("send", write)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", review)
    if branch:
        graph.add_conditional_edges(review, review_route)
    else:
        graph.add_edge(review, "send")
    graph.add_edge("send", END)
    return graph


def digest(builder: StateGraph[Any]) -> str:
    return shape_digest(graph_shape(builder))


def test_the_same_structure_has_the_same_digest_in_every_build() -> None:
    assert digest(build()) == digest(build())


def test_a_node_body_edited_under_the_same_version_keeps_the_digest() -> None:
    def other_body(state: State) -> dict[str, Any]:
        return {"draft": "a better prompt"}

    assert digest(build(body=other_body)) == digest(build())


def test_a_renamed_node_changes_the_digest_and_is_named_first() -> None:
    before, after = graph_shape(build()), graph_shape(build("signoff"))
    assert shape_digest(before) != shape_digest(after)
    said = describe_change(before, after)
    assert said.startswith("node 'review' renamed to 'signoff'")
    assert "more" in said  # its edges moved with it; one line, not a list


def test_an_edge_in_place_of_a_branch_changes_the_digest() -> None:
    before, after = graph_shape(build()), graph_shape(build(branch=False))
    assert shape_digest(before) != shape_digest(after)
    said = describe_change(before, after)
    assert "edge review->send added" in said
    assert "conditional edges from 'review' changed" in said


def test_a_state_key_removed_or_reduced_otherwise_is_named() -> None:
    class Fewer(TypedDict, total=False):
        draft: str

    class Replaced(TypedDict, total=False):
        draft: str
        log: list[str]

    base = graph_shape(build())
    assert describe_change(base, graph_shape(build(state=Fewer))) == "state key 'log' removed"
    said = describe_change(base, graph_shape(build(state=Replaced)))
    assert said.startswith("state key 'log' is reduced by LastValue")


def test_command_destinations_and_subgraphs_count() -> None:
    def go(state: State) -> Command[Literal["send"]]:
        return Command(goto="send")

    def with_command(target: Any) -> StateGraph[Any]:
        graph = StateGraph(State)
        graph.add_node("draft", target)
        graph.add_node("send", write)
        graph.add_node("other", write)
        graph.add_edge(START, "draft")
        return graph

    def go_other(state: State) -> Command[Literal["other"]]:
        return Command(goto="other")

    assert digest(with_command(go)) != digest(with_command(go_other))

    def parent(inner: StateGraph[Any]) -> StateGraph[Any]:
        graph = StateGraph(State)
        graph.add_node("child", inner.compile())
        graph.add_edge(START, "child")
        return graph

    assert digest(parent(build())) != digest(parent(build("signoff")))
    assert digest(parent(build())) == digest(parent(build()))


def test_no_difference_found_still_says_something() -> None:
    shape = graph_shape(build())
    assert describe_change(shape, {**shape, "format": 0}).startswith("the graph was recorded")
