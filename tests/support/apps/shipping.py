"""An app whose run sends one real email, then fails in the next node while the file named by
$SHIPPING_BROKEN exists (the operator "fixes" it by deleting the file, then resumes the run).

Env: KEEL_DATABASE_URL, KEEL_TEST_SMTP (host:port of the test's SmtpSink), SHIPPING_BROKEN.
"""

from __future__ import annotations

import os
import smtplib
from email.message import EmailMessage
from pathlib import Path
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel

WORKFLOW = "shipping"


@keel.effect("send_confirmation")
def send_confirmation(order: str, *, idempotency_key: str) -> dict[str, str]:
    host, _, port = os.environ["KEEL_TEST_SMTP"].rpartition(":")
    message = EmailMessage()
    message["From"] = "shop@example.com"
    message["To"] = "customer@example.com"
    message["Subject"] = f"order {order} confirmed"
    message["Message-ID"] = f"<{idempotency_key.replace(':', '.')}@keel.test>"
    message.set_content("Thanks!")
    with smtplib.SMTP(host, int(port), timeout=10) as smtp:
        smtp.send_message(message)
    return {"message_id": str(message["Message-ID"])}


class Order(TypedDict, total=False):
    order: str
    confirmation: dict[str, str]
    label: str


def confirm(state: Order) -> dict[str, Any]:
    return {"confirmation": send_confirmation(state["order"])}


def label(state: Order) -> dict[str, Any]:
    if Path(os.environ["SHIPPING_BROKEN"]).exists():
        raise RuntimeError("the label printer API rejected the request")
    return {"label": f"label-{state['order']}"}


def build() -> keel.App:
    built = keel.App(os.environ.get("KEEL_DATABASE_URL"))

    @built.workflow(WORKFLOW)
    def shipping() -> StateGraph:
        g = StateGraph(Order)
        g.add_node("confirm", confirm)
        g.add_node("label", label)
        g.add_edge(START, "confirm")
        g.add_edge("confirm", "label")
        g.add_edge("label", END)
        return g

    return built


app = build()
