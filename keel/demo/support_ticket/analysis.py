"""Ticket analysis: category, urgency and the customer's address, by plain rules over the text.

Deterministic on purpose: the same ticket gives the same analysis on every machine and every
replay, and a test can say exactly what it expects.
"""

from __future__ import annotations

import re
from typing import Any, TypedDict


class Ticket(TypedDict):
    ticket_id: str
    customer: str
    subject: str
    body: str


class Analysis(TypedDict):
    category: str
    urgency: str
    email: str
    matched: list[str]


# Order breaks ties: a ticket asking to delete the account *and* mentioning billing is about
# deletion; one about a refund of a charge is about the refund.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("account_deletion", ("delete my account", "close my account", "deletion", "gdpr", "erase")),
    ("refund", ("refund", "money back", "return", "cancel my order")),
    ("billing", ("invoice", "charged", "charge", "billing", "payment", "card", "vat")),
    ("password", ("password", "locked out", "sign in", "log in", "login", "reset")),
    ("two_factor", ("two-factor", "2fa", "authenticator", "recovery code")),
    ("shipping", ("shipping", "delivery", "package", "parcel", "tracking", "arrived")),
    ("api", ("api", "401", "403", "429", "rate limit", "bearer")),
)
HIGH = ("urgent", "asap", "immediately", "right now", "charged twice", "locked out", "outage",
        "chargeback", "lawyer", "leaked", "production")  # fmt: skip
LOW = ("no rush", "when you have time", "just wondering", "curious")
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")


def parse_ticket(value: Any) -> Ticket:
    """The workflow's input, checked: a bad ticket fails the run with a clear message."""
    if not isinstance(value, dict):
        raise ValueError(f"a support ticket is a JSON object, not {type(value).__name__}")
    missing = [k for k in ("ticket_id", "subject", "body") if not str(value.get(k, "")).strip()]
    if missing:
        raise ValueError(f"the ticket lacks {', '.join(missing)}")
    return Ticket(
        ticket_id=str(value["ticket_id"]).strip(),
        customer=str(value.get("customer", "")).strip(),
        subject=str(value["subject"]).strip(),
        body=str(value["body"]).strip(),
    )


def _hits(text: str, words: tuple[str, ...]) -> list[str]:
    return [w for w in words if re.search(rf"(?<![a-z0-9]){re.escape(w)}(?![a-z0-9])", text)]


def analyze(ticket: Ticket) -> Analysis:
    text = f"{ticket['subject']}\n{ticket['body']}".lower()
    best, best_hits = "general", list[str]()
    for category, words in CATEGORIES:
        found = _hits(text, words)
        if len(found) > len(best_hits):
            best, best_hits = category, found
    urgency = "high" if _hits(text, HIGH) else "low" if _hits(text, LOW) else "normal"
    return Analysis(category=best, urgency=urgency, email=customer_email(ticket), matched=best_hits)


def customer_email(ticket: Ticket) -> str:
    """The `customer` field if it is an address, else the first address in the body."""
    for candidate in (ticket["customer"], ticket["body"]):
        found = _EMAIL.search(candidate)
        if found:
            return found.group(0).lower()
    raise ValueError(f"ticket {ticket['ticket_id']} names no customer email address")
