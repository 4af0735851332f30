"""The `support-ticket` workflow: analyze -> retrieve -> draft -> manager approval -> send once.

Each node is small and does one thing, because a node that crashes re-runs from its start and
code before `keel.approval()` re-runs on every resume: analysis, retrieval and drafting are
reads, the approval is a durable wait, and the only side effect (the email) goes through the
ledger in its own node.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel
from keel.demo.support_ticket.analysis import Analysis, Ticket, analyze, parse_ticket
from keel.demo.support_ticket.drafter import Draft, Drafter, make_drafter
from keel.demo.support_ticket.mail import send_email
from keel.demo.support_ticket.retrieval import DocHit, search

WORKFLOW = "support-ticket"
VERSION = "1"


class Review(TypedDict):
    decision: str
    by: str | None
    comment: str | None


class Delivery(TypedDict):
    message_id: str
    to: str
    transport: str
    found_by: str


class TicketState(TypedDict, total=False):
    ticket_id: str
    customer: str
    subject: str
    body: str
    analysis: Analysis
    docs: list[DocHit]
    draft: Draft
    review: Review
    delivery: Delivery


def _ticket(state: TicketState) -> Ticket:
    return parse_ticket(dict(state))


def analyze_ticket(state: TicketState) -> dict[str, Any]:
    return {"analysis": analyze(_ticket(state))}


def retrieve_docs(state: TicketState) -> dict[str, Any]:
    ticket = _ticket(state)
    text = f"{ticket['subject']}\n{ticket['body']}"
    return {"docs": search(text, category=state["analysis"]["category"], limit=3)}


def make_draft_node(drafter: Drafter) -> Any:
    def draft_reply(state: TicketState) -> dict[str, Any]:
        draft = drafter.draft(_ticket(state), state["analysis"], state["docs"])
        # Overwritten whole on a re-run (atomic rename): the folder never holds half a draft.
        keel.artifacts().write_text("draft.txt", f"Subject: {draft['subject']}\n\n{draft['body']}")
        return {"draft": draft}

    return draft_reply


def manager_review(state: TicketState) -> dict[str, Any]:
    ticket, draft, analysis = _ticket(state), state["draft"], state["analysis"]
    decision = keel.approval(
        "manager",
        payload={
            "ticket": ticket,
            "to": analysis["email"],
            "category": analysis["category"],
            "urgency": analysis["urgency"],
            "draft": draft,
            "sources": [d["title"] for d in state["docs"]],
        },
        timeout="24h",
        on_timeout="reject",
    )
    return {"review": Review(decision=decision.decision, by=decision.by, comment=decision.comment)}


def after_review(state: TicketState) -> str:
    return "send_reply" if state["review"]["decision"] == "approved" else END


def send_reply(state: TicketState) -> dict[str, Any]:
    draft = state["draft"]
    result = send_email(
        state["analysis"]["email"],
        draft["subject"],
        draft["body"],
        ticket_id=state["ticket_id"],
    )
    # The copy the provider has (or, after a crash, the one the reconciler found there).
    keel.artifacts().write_text("reply.eml", result["eml"])
    return {
        "delivery": Delivery(
            message_id=result["message_id"],
            to=result["to"],
            transport=result["transport"],
            found_by=result.get("found_by", "sender"),
        )
    }


def build(drafter: Drafter | Any = None) -> StateGraph:
    """The uncompiled graph; `drafter` is a Drafter, a LangChain chat model, or None (offline)."""
    graph = StateGraph(TicketState)
    graph.add_node("analyze", analyze_ticket)
    graph.add_node("retrieve", retrieve_docs)
    graph.add_node("draft", make_draft_node(make_drafter(drafter)))
    graph.add_node("review", manager_review)
    graph.add_node("send_reply", send_reply)
    graph.add_edge(START, "analyze")
    graph.add_edge("analyze", "retrieve")
    graph.add_edge("retrieve", "draft")
    graph.add_edge("draft", "review")
    graph.add_conditional_edges("review", after_review, ["send_reply", END])
    graph.add_edge("send_reply", END)
    return graph


def register(app: keel.App, *, drafter: Drafter | Any = None) -> keel.App:
    """Register `support-ticket` (version 1) on `app`; pass a chat model to draft with an LLM."""
    app.workflow(WORKFLOW, version=VERSION)(lambda: build(drafter))
    return app


def ticket_job_id(ticket_id: str) -> str:
    return keel.job_id("ticket", ticket_id, "reply")
