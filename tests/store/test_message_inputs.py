"""A run's message input, checked at submit as LangGraph takes it: for every kind of state
(TypedDict, pydantic, dataclass) and message field (with `add_messages`, with another reducer,
with none), what LangGraph runs is admitted and runs, and what fails it is refused, by field."""

from __future__ import annotations

import asyncio
import dataclasses
import operator
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import pydantic
import pytest
import typing_extensions
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AnyMessage, BaseMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import StateGraph
from langgraph.graph.message import add_messages

import keel
from keel.core.errors import InvalidInput
from tests.support.graphs import one_node
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


class Chat(typing_extensions.TypedDict):
    """A chat state as LangGraph's own examples write it (typing_extensions' TypedDict)."""

    messages: Annotated[list[AnyMessage], add_messages]
    turns: int


def chat_graph() -> StateGraph:
    return one_node(Chat, "n", lambda state: {"turns": len(state["messages"])})


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"messages": 5}, "input.messages"),
        ({"messages": [{"foo": 1}]}, "input.messages"),
        ({"messages": None}, "input.messages"),
        ({"messages": "hi", "turns": "many"}, "input.turns"),
        ({"mesages": "hi"}, "input.mesages"),
    ],
)
def test_a_typing_extensions_schema_and_its_messages_are_checked_at_submit(
    make_app: AppFactory, bad: dict[str, Any], field: str
) -> None:
    # Both went unchecked: typing.is_typeddict does not know typing_extensions' TypedDict (the
    # one LangGraph's docs use), and a message field was left to the first step, which failed
    # the admitted run with "Unsupported message type".
    app = make_app()
    app.workflow("chat")(chat_graph)
    with pytest.raises(InvalidInput) as refused:
        app.submit("chat", job_id="c-bad", input=bad)
    assert [e.split(":")[0] for e in refused.value.errors] == [field]
    assert app.list_runs() == []


def test_every_shape_the_message_reducer_takes_is_admitted_and_runs(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow("chat")(chat_graph)
    shapes: list[Any] = [
        "hi",
        ("user", "hi"),
        {"role": "user", "content": "hi"},
        {"type": "human", "content": "hi"},
        [{"role": "user", "content": "hi"}, ("assistant", "hello"), "and you?"],
        [],
    ]
    runs = [
        app.submit("chat", job_id=f"c-{i}", input={"messages": shape})
        for i, shape in enumerate(shapes)
    ]
    drain(app)
    assert [app.get_run(r.run_id).status for r in runs] == ["completed"] * len(shapes)


class ListOfBase(typing_extensions.TypedDict):
    messages: list[BaseMessage]


class ListOfAny(typing_extensions.TypedDict):
    messages: list[AnyMessage]


class SequenceOfAny(typing.TypedDict):
    messages: Sequence[AnyMessage]


class Added(typing_extensions.TypedDict):
    messages: Annotated[list[BaseMessage], operator.add]


class ModelOfBase(pydantic.BaseModel):
    messages: list[BaseMessage] = []


class ModelOfAny(pydantic.BaseModel):
    messages: list[AnyMessage] = []


class ModelReduced(pydantic.BaseModel):
    messages: Annotated[list[AnyMessage], add_messages] = []


@dataclasses.dataclass
class DataOfBase:
    messages: list[BaseMessage] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class DataReduced:
    messages: Annotated[list[AnyMessage], add_messages] = dataclasses.field(default_factory=list)


STATES = [
    Chat,
    ListOfBase,
    ListOfAny,
    SequenceOfAny,
    Added,
    ModelOfBase,
    ModelOfAny,
    ModelReduced,
    DataOfBase,
    DataReduced,
]

HUMAN = ["langchain", "schema", "messages", "HumanMessage"]
SENT: list[Any] = [  # as JSON carries them: a (role, text) pair arrives as a list
    [{"role": "user", "content": "hi"}],
    {"role": "user", "content": "hi"},
    [{"type": "human", "content": "hi"}],
    [{"lc": 1, "type": "constructor", "id": HUMAN, "kwargs": {"content": "hi"}}],
    [["user", "hi"]],
    "hi",
    ["hi"],
    [],
    5,
    None,
    [5],
    [[1, 2]],
    [{"role": "user"}],
    [{"content": "hi"}],
    [{"role": "bogus", "content": "hi"}],
    [{"type": "bogus", "content": "hi"}],
    [{"type": "human"}],
]


def chatbot(state: Any) -> dict[str, Any]:
    """LangGraph's own first example: the conversation handed to a chat model. A field nobody
    reads runs with anything in it; messages are there to be read as messages."""
    messages = state["messages"] if isinstance(state, dict) else state.messages
    return {"messages": [FakeListChatModel(responses=["hello"]).invoke(messages)]}


def langgraph_runs(state: type, messages: Any) -> bool:
    graph = one_node(state, "chat", chatbot).compile(checkpointer=InMemorySaver())
    try:
        asyncio.run(graph.ainvoke({"messages": messages}, {"configurable": {"thread_id": "t"}}))
    except Exception:
        return False
    return True


@pytest.mark.parametrize("state", STATES, ids=lambda s: s.__name__)
def test_a_message_field_takes_what_langgraph_takes_for_every_kind_of_state(
    make_app: AppFactory, state: type
) -> None:
    # A list[BaseMessage] field without a reducer (typing_extensions' TypedDict, a dataclass)
    # refused role dicts, which LangGraph hands to the node as they came and the node's chat
    # model takes (422 for a run LangGraph runs); a pydantic list[AnyMessage] admitted them,
    # and the model's validation then failed the run in the worker. LangGraph is asked, per
    # input, whether the graph runs it; Keel must agree both ways.
    app = make_app()
    app.workflow("chat")(lambda: one_node(state, "chat", chatbot))
    admitted: dict[str, str] = {}
    for i, messages in enumerate(SENT):
        if langgraph_runs(state, messages):
            admitted[repr(messages)] = app.submit("chat", {"messages": messages}).run_id
            continue
        with pytest.raises(InvalidInput) as refused:
            app.submit("chat", {"messages": messages}, job_id=f"refused-{i}")
        named = {
            e.split(":")[0].split(".")[:2] == ["input", "messages"] for e in refused.value.errors
        }
        assert named == {True}, (messages, refused.value.errors)  # by field, however deep
    assert len(app.list_runs()) == len(admitted)
    assert admitted, "LangGraph runs none of them: the table tests nothing"
    drain(app)
    assert {m: app.get_run(r).status for m, r in admitted.items()} == dict.fromkeys(
        admitted, "completed"
    )
