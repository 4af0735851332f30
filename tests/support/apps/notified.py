"""An approval whose request and decision are emailed, for the notification kill tests.

Env: KEEL_DATABASE_URL, NOTIFIED_SMTP_URL (a keel.testing.SmtpSink), NOTIFIED_SPOOL (its spool,
which the notifier's reconciler reads like a provider's lookup; unset: no reconciler, and a
notification whose sender died is marked in doubt rather than sent again).
"""

from __future__ import annotations

import os
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

import keel
from keel.notifiers.email import EmailNotifier

app = keel.App()
if "NOTIFIED_SMTP_URL" in os.environ:
    app.add_notifier(
        EmailNotifier(
            os.environ["NOTIFIED_SMTP_URL"],
            "keel@example.com",
            kinds=("request", "decided"),
            spool=os.environ.get("NOTIFIED_SPOOL") or None,
            # Longer than the test holds the SMTP server's reply.
            timeout=120.0,
        )
    )


class Ask(TypedDict, total=False):
    item: str
    decision: str


def ask(state: Ask) -> Ask:
    decision = keel.approval(
        "manager", payload={"item": state["item"]}, approvers=["boss@example.com"]
    )
    return {"decision": decision.decision}


@app.workflow("ask")
def ask_graph() -> StateGraph:
    g = StateGraph(Ask)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g
