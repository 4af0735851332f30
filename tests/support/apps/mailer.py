"""The app the crash tests kill: workflows that send real email through the effect ledger.

Worker subprocesses load it with `python -m keel worker tests.support.apps.mailer:app`; the test
process builds its own App on the same database and calls `register()` so it can submit runs
and read them back. Everything outside the database comes from the environment, read when the
effect runs (not at import), so one module serves every test:

- KEEL_DATABASE_URL: the database (keel.App() reads it).
- MAILER_SMTP_URL: `smtp://127.0.0.1:PORT`, the SmtpSink of the test.
- MAILER_SPOOL: the folder that sink writes each accepted message to; the reconciler looks
  there, as it would ask a mail provider's API "did you accept this Message-ID?".

Workflows:
- `mailer`: prepare -> approval -> send (one `send_email`, reconciled) -> done.
- `mailer-unreconciled`: the same graph whose effect has no reconciler and whose provider does
  not dedupe: a crash after the provider accepted the message leaves the key in doubt.
- `revisions`: draft, then a loop that sends the same email (same args) in two iterations.
- `mailer-idempotent`: the same graph whose effect has no reconciler but is declared
  `provider_idempotent` (retried under its key when in doubt).
- `stamped`: send an email whose body carries the time it was written (new on every replay);
  `stamped-keyed` sends it through an effect whose `key=` leaves the body out.
- `report`: write an artifact saying which process wrote it.
- `agent`: a fake model asks for three tool calls at once; LangGraph's ToolNode runs them on
  threads, and each emails its own recipient (`<ticket>-<n>`) after a random pause of its own.
"""

from __future__ import annotations

import operator
import os
import random
import smtplib
import time
from email.message import EmailMessage
from typing import Annotated, Any, TypedDict
from urllib.parse import urlsplit

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

import keel
from keel.core.effects.ledger import Effect
from keel.notifiers.email import spooled

SENDER = "keel-mailer@example.com"
REVISIONS = 2


def message_id_for(idempotency_key: str) -> str:
    """The Message-ID is a function of the key: a retry under the key is the same message."""
    return f"<{idempotency_key.replace(':', '.')}@mailer.keel.test>"


def deliver(to: str, subject: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
    url = urlsplit(os.environ["MAILER_SMTP_URL"])
    if url.scheme != "smtp" or url.hostname is None or url.port is None:
        raise ValueError(f"MAILER_SMTP_URL must be smtp://host:port, not {url.geturl()!r}")
    msg = EmailMessage()
    msg["From"] = SENDER
    msg["To"] = to
    msg["Subject"] = subject
    message_id = message_id_for(idempotency_key)
    msg["Message-ID"] = message_id
    msg.set_content(body)
    with smtplib.SMTP(url.hostname, url.port, timeout=10) as smtp:
        smtp.send_message(msg)
    return {"message_id": message_id, "to": to}


def lookup(to: str, subject: str, body: str, *, idempotency_key: str) -> dict[str, Any] | None:
    """Ask the "provider" (the sink's spool) whether it accepted this key's message."""
    message_id = message_id_for(idempotency_key)
    if spooled(os.environ["MAILER_SPOOL"], message_id):
        return {"message_id": message_id, "to": to, "reconciled": True}
    return None


send_email: Effect[..., dict[str, Any]] = keel.effect("send_email", reconcile=lookup)(deliver)
# Same name (so the same fault label arms it), no reconciler, provider not idempotent.
send_email_unreconciled: Effect[..., dict[str, Any]] = keel.effect("send_email")(deliver)
send_email_idempotent: Effect[..., dict[str, Any]] = keel.effect(
    "send_email", provider_idempotent=True
)(deliver)
# The recipient and subject say which email this is; the body may be written anew.
send_email_keyed: Effect[..., dict[str, Any]] = keel.effect(
    "send_email", reconcile=lookup, key=("to", "subject")
)(deliver)


class MailState(TypedDict, total=False):
    ticket: str
    to: str
    subject: str
    body: str
    approved: bool
    message_id: str
    log: Annotated[list[str], operator.add]


def prepare(state: MailState) -> MailState:
    ticket = state["ticket"]
    return {
        "subject": f"Re: ticket {ticket}",
        "body": f"Hello,\n\nyour ticket {ticket} is solved.\n",
        "log": ["prepared"],
    }


def review(state: MailState) -> MailState:
    decision = keel.approval(
        "manager", payload={"ticket": state["ticket"], "subject": state["subject"]}
    )
    return {"approved": decision.approved, "log": [f"decision:{decision.decision}"]}


def done(state: MailState) -> MailState:
    return {"log": ["done"]}


def mailer_graph(effect: Effect[..., dict[str, Any]]) -> StateGraph:
    def send(state: MailState) -> MailState:
        if not state.get("approved"):
            return {"log": ["not sent"]}
        result = effect(state["to"], state["subject"], state["body"])
        # An in-doubt send resolved by a person ("it went out") carries whatever result that
        # person gave, possibly none: the node must not assume the provider's answer.
        return {"message_id": (result or {}).get("message_id", ""), "log": ["sent"]}

    g = StateGraph(MailState)
    g.add_node("prepare", prepare)
    g.add_node("approval", review)
    g.add_node("send", send)
    g.add_node("done", done)
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "approval")
    g.add_edge("approval", "send")
    g.add_edge("send", "done")
    g.add_edge("done", END)
    return g


class RevisionState(TypedDict, total=False):
    ticket: str
    to: str
    subject: str
    body: str
    revision: int
    message_ids: Annotated[list[str], operator.add]


def draft(state: RevisionState) -> RevisionState:
    ticket = state["ticket"]
    return {
        "subject": f"Draft for ticket {ticket}",
        "body": f"Draft reply for ticket {ticket}.\n",
        "revision": 0,
    }


def revise(state: RevisionState) -> RevisionState:
    # The same call with the same args in every iteration: only the step tells them apart.
    result = send_email(state["to"], state["subject"], state["body"])
    return {"revision": state["revision"] + 1, "message_ids": [result["message_id"]]}


def again(state: RevisionState) -> str:
    return "revise" if state["revision"] < REVISIONS else END


def revisions_graph() -> StateGraph:
    g = StateGraph(RevisionState)
    g.add_node("draft", draft)
    g.add_node("revise", revise)
    g.add_edge(START, "draft")
    g.add_edge("draft", "revise")
    g.add_conditional_edges("revise", again, ["revise", END])
    return g


def stamped_graph(effect: Effect[..., dict[str, Any]]) -> StateGraph:
    def send(state: MailState) -> MailState:
        # Non-deterministic on purpose: the clock read again on every replay of the node.
        body = f"Your ticket {state['ticket']} is solved (written at {time.time_ns()}).\n"
        result = effect(state["to"], f"Re: ticket {state['ticket']}", body)
        return {"message_id": result["message_id"], "log": ["sent"]}

    g = StateGraph(MailState)
    g.add_node("send", send)
    g.add_edge(START, "send")
    g.add_edge("send", END)
    return g


def report_graph() -> StateGraph:
    def publish(state: MailState) -> MailState:
        keel.artifacts().write_text("report.txt", f"written by process {os.getpid()}\n")
        return {"log": ["published"]}

    g = StateGraph(MailState)
    g.add_node("publish", publish)
    g.add_edge(START, "publish")
    g.add_edge("publish", END)
    return g


class AgentState(TypedDict, total=False):
    ticket: str
    messages: Annotated[list[Any], add_messages]


@tool
def email_customer(to: str, ticket: str) -> str:
    """Email `to` about `ticket`."""
    time.sleep(random.uniform(0, 0.05))  # tool calls run at once: their order varies
    sent = send_email(to, f"Re: ticket {ticket}", f"About {ticket}.")
    return str(sent["message_id"])


def agent_graph() -> StateGraph:
    def model(state: AgentState) -> AgentState:
        ticket = state["ticket"]
        calls = [
            {"name": "email_customer", "args": {"to": f"{ticket}-{n}", "ticket": ticket}}
            | {"id": f"call_{n}"}
            for n in range(3)
        ]
        return {"messages": [AIMessage(content="", tool_calls=calls, id=f"ai-{ticket}")]}

    g = StateGraph(AgentState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([email_customer]))
    g.add_edge(START, "model")
    g.add_edge("model", "tools")
    g.add_edge("tools", END)
    return g


def register(target: keel.App) -> keel.App:
    target.workflow("mailer")(lambda: mailer_graph(send_email))
    target.workflow("mailer-unreconciled")(lambda: mailer_graph(send_email_unreconciled))
    target.workflow("mailer-idempotent")(lambda: mailer_graph(send_email_idempotent))
    target.workflow("revisions")(revisions_graph)
    target.workflow("stamped")(lambda: stamped_graph(send_email))
    target.workflow("stamped-keyed")(lambda: stamped_graph(send_email_keyed))
    target.workflow("report")(report_graph)
    target.workflow("agent")(agent_graph)
    return target


app = register(keel.App())
