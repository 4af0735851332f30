"""A five-step ticket workflow for worker-fleet tests, run by real `keel worker` processes.

Env: KEEL_DATABASE_URL, FLEET_SMTP_URL (smtp://127.0.0.1:PORT), FLEET_SPOOL (the SmtpSink's
spool, which the reconciler reads like a provider's message-lookup API), FLEET_MARKERS (a folder
where the long step drops `<run_id>.started`, so a test knows when to freeze the worker).
"""

from __future__ import annotations

import os
import smtplib
import time
from email.message import EmailMessage
from pathlib import Path
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel
from keel.notifiers.email import spooled

app = keel.App()


def _message_id(key: str) -> str:
    return f"<{key.rsplit(':', 1)[-1]}@fleet.keel.invalid>"


def lookup(ticket: str, *, idempotency_key: str) -> dict[str, Any] | None:
    found = spooled(os.environ["FLEET_SPOOL"], _message_id(idempotency_key))
    return {"message_id": _message_id(idempotency_key), "reconciled": True} if found else None


@keel.effect("send_reply", reconcile=lookup)
def send_reply(ticket: str, *, idempotency_key: str) -> dict[str, Any]:
    url = os.environ["FLEET_SMTP_URL"].removeprefix("smtp://")
    host, port = url.split(":")
    msg = EmailMessage()
    msg["From"] = "support@fleet.invalid"
    msg["To"] = "customer@fleet.invalid"
    msg["Subject"] = f"ticket {ticket}"
    msg["Message-ID"] = _message_id(idempotency_key)
    msg["X-Ticket"] = ticket
    msg.set_content(f"reply to {ticket}")
    with smtplib.SMTP(host, int(port), timeout=10) as smtp:
        smtp.send_message(msg)
    return {"message_id": msg["Message-ID"]}


class Ticket(TypedDict, total=False):
    ticket: str
    work: float
    steps: list[str]


def _step(name: str) -> Any:
    def node(state: Ticket) -> Ticket:
        return {"steps": [*state.get("steps", []), name]}

    node.__name__ = name
    return node


def long_step(state: Ticket) -> Ticket:
    """Simulates slow work (a tool call); drops a marker so a test can freeze the worker here."""
    if markers := os.environ.get("FLEET_MARKERS"):
        run_id = keel.core.context.current().run_id
        Path(markers, f"{run_id}.started").touch()
    time.sleep(float(state.get("work", 0.0)))
    return {"steps": [*state.get("steps", []), "work"]}


def send(state: Ticket) -> Ticket:
    send_reply(state["ticket"])
    return {"steps": [*state.get("steps", []), "send"]}


@app.workflow("ticket")
def ticket() -> StateGraph:
    g = StateGraph(Ticket)
    g.add_node("analyze", _step("analyze"))
    g.add_node("work", long_step)
    g.add_node("send", send)
    g.add_node("close", _step("close"))
    g.add_node("archive", _step("archive"))
    g.add_edge(START, "analyze")
    g.add_edge("analyze", "work")
    g.add_edge("work", "send")
    g.add_edge("send", "close")
    g.add_edge("close", "archive")
    g.add_edge("archive", END)
    return g


def gate(state: Ticket) -> Ticket:
    """A manager's approval with a one-hour deadline (rejected when it passes)."""
    decision = keel.approval("manager", payload={"ticket": state["ticket"]}, timeout="1h")
    return {"steps": [*state.get("steps", []), decision.decision]}


def send_if_approved(state: Ticket) -> Ticket:
    if state["steps"][-1] == "approved":
        send_reply(state["ticket"])
    return {"steps": [*state.get("steps", []), "done"]}


@app.workflow("gated")
def gated() -> StateGraph:
    g = StateGraph(Ticket)
    g.add_node("gate", gate)
    g.add_node("send", send_if_approved)
    g.add_edge(START, "gate")
    g.add_edge("gate", "send")
    g.add_edge("send", END)
    return g


class Batch(TypedDict, total=False):
    items: int
    resumed_from: int
    processed: list[int]


def process_batch(state: Batch) -> Batch:
    """A long tool call that heartbeats its progress; the first attempt dies half-way."""
    start = int((keel.last_heartbeat() or {}).get("next", 0))
    processed = []
    for item in range(start, state["items"]):
        processed.append(item)
        keel.heartbeat({"next": item + 1})
        if start == 0 and item == state["items"] // 2:
            os.kill(os.getpid(), 9)  # the worker dies in the middle of the step
    return {"resumed_from": start, "processed": processed}


@app.workflow("batch")
def batch() -> StateGraph:
    g = StateGraph(Batch)
    g.add_node("process", process_batch)
    g.add_edge(START, "process")
    g.add_edge("process", END)
    return g
