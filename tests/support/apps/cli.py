"""A tiny Keel app for the CLI tests: wait for a manager's approval, then send one email.

The App reads its database from $KEEL_DATABASE_URL; the email goes to the SMTP server at
$KEEL_TEST_SMTP (host:port), a real `keel.testing.smtp.SmtpSink` in the test process, so the
tests count what the outside world received.
"""

from __future__ import annotations

import operator
import os
import smtplib
from email.message import EmailMessage
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel

WORKFLOW = "cli-ticket"
SUBJECT = "Re: your ticket"


def build() -> keel.App:
    """An App on $KEEL_DATABASE_URL (read now) with the workflow below registered."""
    built = keel.App(os.environ.get("KEEL_DATABASE_URL"))
    built.workflow(WORKFLOW)(cli_ticket)
    return built


@keel.effect("send_email")
def send_email(to: str, body: str, *, idempotency_key: str) -> dict[str, str]:
    host, _, port = os.environ["KEEL_TEST_SMTP"].rpartition(":")
    message = EmailMessage()
    message["From"] = "keel@example.com"
    message["To"] = to
    message["Subject"] = SUBJECT
    # The key names the logical email: a provider (or a reconciler) can look it up.
    message["Message-ID"] = f"<{idempotency_key.replace(':', '.')}@keel.test>"
    message.set_content(body)
    with smtplib.SMTP(host, int(port), timeout=10) as smtp:
        smtp.send_message(message)
    return {"message_id": str(message["Message-ID"])}


class State(TypedDict, total=False):
    to: str
    body: str
    log: Annotated[list[str], operator.add]


def review(state: State) -> dict[str, Any]:
    decision = keel.approval("manager", payload={"to": state["to"]}, timeout="1h")
    return {"log": [decision.decision]}


def send(state: State) -> dict[str, Any]:
    if state["log"][-1] == "approved":
        keel.artifacts().write_text("reply.txt", state.get("body", ""))
        send_email(state["to"], state.get("body", ""))
        return {"log": ["sent"]}
    return {"log": ["not sent"]}


def cli_ticket() -> StateGraph:
    graph = StateGraph(State)
    graph.add_node("review", review)
    graph.add_node("send", send)
    graph.add_edge(START, "review")
    graph.add_edge("review", "send")
    graph.add_edge("send", END)
    return graph


app = build()


def __getattr__(name: str) -> keel.App:
    # `--app tests.support.apps.cli:fresh_app` builds a new App on every import of the name, so
    # in-process CLI tests (CliRunner) each get one on their own $KEEL_DATABASE_URL instead of
    # the one this module bound when a previous test first imported it.
    if name == "fresh_app":
        return build()
    raise AttributeError(name)
