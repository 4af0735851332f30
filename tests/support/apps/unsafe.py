"""Deliberately unsafe workflows: the crash harness must catch them.

- `direct-email` sends its email with smtplib inside a node instead of through an effect: a crash
  after the send but before the step's checkpoint sends it again.
- `random-wait` announces its approval request to an HTTP endpoint under a fresh uuid4 each time
  the node runs, outside the ledger: every extra execution of the node (a crash right after the
  interrupt, a replay) announces another request that nobody will ever answer.
"""

from __future__ import annotations

import os
import smtplib
import uuid
from email.message import EmailMessage
from typing import TypedDict

import httpx
from langgraph.graph import END, START, StateGraph

import keel

app = keel.App()


class State(TypedDict, total=False):
    to: str
    sent: bool
    decision: str


def analyze(state: State) -> State:
    return {"to": state.get("to", "customer@example.com")}


def send_directly(state: State) -> State:
    host, port = os.environ["KEEL_CHAOS_SMTP_URL"].removeprefix("smtp://").split(":")
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "bot@example.com", state["to"], "your ticket"
    msg.set_content("hello")
    with smtplib.SMTP(host, int(port)) as smtp:
        smtp.send_message(msg)  # UNSAFE: not an effect, no idempotency key
    return {"sent": True}


def close(state: State) -> State:
    return {}


@app.workflow("direct-email")
def direct_email() -> StateGraph:
    g = StateGraph(State)
    g.add_node("analyze", analyze)
    g.add_node("send", send_directly)
    g.add_node("close", close)
    g.add_edge(START, "analyze")
    g.add_edge("analyze", "send")
    g.add_edge("send", "close")
    g.add_edge("close", END)
    return g


def ask(state: State) -> State:
    request_id = str(uuid.uuid4())  # UNSAFE: a new id on every execution of the node
    httpx.post(os.environ["KEEL_CHAOS_HTTP_URL"] + "/approval-requests", json={"id": request_id})
    decision = keel.approval("manager", payload={"request_id": request_id})
    return {"decision": decision.decision}


@app.workflow("random-wait")
def random_wait() -> StateGraph:
    g = StateGraph(State)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g
