"""Two conversation graphs for the thread tests, and an App that registers them.

`chat`: each turn's user message is answered by an echo, merged into the thread's messages by
LangGraph's `add_messages`, and counted in `turns`. `ask`: asks a question with a plain
`interrupt()` and keeps whatever value the answer is, then logs "done". `review`: waits for a
manager's `keel.approval()`, the typed interrupt a plain resume does not answer.

`--app tests.support.thread_graphs:fresh_app` builds a new App with both on
$KEEL_DATABASE_URL at each use: a `keel worker` subprocess and in-process CLI tests (CliRunner)
each get one on their own database.
"""

from __future__ import annotations

import operator
import os
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

import keel


class Chat(TypedDict, total=False):
    messages: Annotated[list[Any], add_messages]
    turns: Annotated[int, operator.add]


def chat() -> StateGraph:
    def reply(state: Chat) -> dict[str, Any]:
        last = state["messages"][-1].content
        return {"messages": [("ai", f"echo: {last}")], "turns": 1}

    g = StateGraph(Chat)
    g.add_node("reply", reply)
    g.add_edge(START, "reply")
    g.add_edge("reply", END)
    return g


class Ask(TypedDict, total=False):
    question: str
    answer: Any
    log: Annotated[list[str], operator.add]


def asking() -> StateGraph:
    def ask(state: Ask) -> dict[str, Any]:
        answer = interrupt({"question": state["question"]})
        return {"answer": answer, "log": [f"asked {state['question']}"]}

    def done(state: Ask) -> dict[str, Any]:
        return {"log": ["done"]}

    g = StateGraph(Ask)
    g.add_node("ask", ask)
    g.add_node("done", done)
    g.add_edge(START, "ask")
    g.add_edge("ask", "done")
    g.add_edge("done", END)
    return g


def reviewing() -> StateGraph:
    def review(state: Ask) -> dict[str, Any]:
        return {"answer": keel.approval("manager", payload={"q": state["question"]}).decision}

    g = StateGraph(Ask)
    g.add_node("review", review)
    g.add_edge(START, "review")
    g.add_edge("review", END)
    return g


def register(app: keel.App) -> keel.App:
    """`app` with the workflows "chat", "ask" and "review"."""
    app.workflow("chat")(chat)
    app.workflow("ask")(asking)
    app.workflow("review")(reviewing)
    return app


def texts(values: dict[str, Any]) -> list[str]:
    """The contents of a chat state's messages, in order."""
    return [m.content if hasattr(m, "content") else m["content"] for m in values["messages"]]


def __getattr__(name: str) -> keel.App:
    if name == "fresh_app":
        return register(keel.App(os.environ.get("KEEL_DATABASE_URL")))
    raise AttributeError(name)
