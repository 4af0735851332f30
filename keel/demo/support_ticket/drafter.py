"""Drafters: turn a ticket, its analysis and the retrieved articles into a reply draft.

`OfflineDrafter` (the default) composes the reply from templates: no network, no API key, the
same draft for the same ticket every time, and it says so in the text. `ChatModelDrafter`
wraps any LangChain chat model (`langchain_core.language_models.BaseChatModel`), e.g.
`ChatOpenAI(model=...)` or `ChatAnthropic(model=...)`.

Drafting is a read, not a side effect: a crash mid-draft just drafts again, and the draft the
manager approves is the one checkpointed after this step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypedDict, runtime_checkable

from keel.demo.support_ticket.analysis import Analysis, Ticket
from keel.demo.support_ticket.retrieval import DocHit

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

OFFLINE_LABEL = "Drafted by Keel's offline drafter (no LLM)."
SIGNATURE = "Best regards,\nNimbus Support"

OPENERS = {
    "account_deletion": "I understand you would like your account and its data deleted.",
    "refund": "I'm sorry the purchase did not work out; let's get your refund sorted.",
    "billing": "I'm sorry about the trouble with your billing.",
    "password": "I'm sorry you can't get into your account.",
    "two_factor": "I'm sorry you're stuck at the two-factor step.",
    "shipping": "I'm sorry your order is not with you yet.",
    "api": "Thanks for the details about the API errors you are seeing.",
    "general": "Thanks for getting in touch.",
}
URGENT = "We've marked your ticket as urgent and are on it."


class Draft(TypedDict):
    subject: str
    body: str
    drafted_by: str
    sources: list[str]


@runtime_checkable
class Drafter(Protocol):
    name: str

    def draft(self, ticket: Ticket, analysis: Analysis, docs: list[DocHit]) -> Draft: ...


def reply_subject(ticket: Ticket) -> str:
    subject = ticket["subject"]
    base = subject if subject.lower().startswith("re:") else f"Re: {subject}"
    return f"{base} [ticket {ticket['ticket_id']}]"


def greeting_name(email: str) -> str:
    local = email.split("@", 1)[0].replace(".", " ").replace("_", " ").replace("-", " ")
    return " ".join(p.capitalize() for p in local.split() if p.isalpha()) or "there"


class OfflineDrafter:
    """A deterministic drafter: the ticket and the retrieved articles, stitched together."""

    name = "offline"

    def draft(self, ticket: Ticket, analysis: Analysis, docs: list[DocHit]) -> Draft:
        lines = [f"Hi {greeting_name(analysis['email'])},", ""]
        intro = f'Thanks for contacting Nimbus support about "{ticket["subject"]}".'
        lines.append(f"{intro} {OPENERS.get(analysis['category'], OPENERS['general'])}")
        if analysis["urgency"] == "high":
            lines.append(URGENT)
        lines.append("")
        if docs:
            lines.append("From our help center, this should answer it:")
            lines.append("")
            for n, doc in enumerate(docs, 1):
                lines += [f"{n}. {doc['title']}: {doc['summary']}", f"   {doc['url']}"]
        else:
            lines.append("A member of our team will look into this and get back to you.")
        lines += [
            "",
            "If this does not solve it, just reply to this email and we'll take it from there.",
            "",
            SIGNATURE,
            "",
            "--",
            OFFLINE_LABEL,
        ]
        return Draft(
            subject=reply_subject(ticket),
            body="\n".join(lines) + "\n",
            drafted_by="keel-offline-drafter (no LLM)",
            sources=[d["slug"] for d in docs],
        )


class ChatModelDrafter:
    """Draft with any LangChain chat model; the retrieved articles are its only knowledge."""

    def __init__(self, model: BaseChatModel, *, signature: str = SIGNATURE) -> None:
        self.model = model
        self.signature = signature
        self.name = f"chat-model:{_model_name(model)}"

    def messages(self, ticket: Ticket, analysis: Analysis, docs: list[DocHit]) -> list[Any]:
        from langchain_core.messages import HumanMessage, SystemMessage

        articles = "\n\n".join(f"## {d['title']} ({d['url']})\n{d['summary']}" for d in docs)
        system = (
            "You are a support agent for Nimbus (a smart-home hub with a cloud subscription). "
            "Write a short, friendly email reply to the customer. Use only the help-center "
            "articles below; link the ones you use; never promise what they do not say. "
            f"Reply with the email body only, ending with:\n{self.signature}\n\n"
            f"Help-center articles:\n{articles or '(none found)'}"
        )
        human = (
            f"Ticket {ticket['ticket_id']} from {analysis['email']} "
            f"(category {analysis['category']}, urgency {analysis['urgency']})\n"
            f"Subject: {ticket['subject']}\n\n{ticket['body']}"
        )
        return [SystemMessage(system), HumanMessage(human)]

    def draft(self, ticket: Ticket, analysis: Analysis, docs: list[DocHit]) -> Draft:
        reply = self.model.invoke(self.messages(ticket, analysis, docs))
        text = str(reply.text)  # joins the text blocks of a multi-part reply
        return Draft(
            subject=reply_subject(ticket),
            body=text.strip() + "\n",
            drafted_by=self.name,
            sources=[d["slug"] for d in docs],
        )


def _model_name(model: Any) -> str:
    for attr in ("model_name", "model"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value
    return type(model).__name__


def make_drafter(model: BaseChatModel | Drafter | None = None) -> Drafter:
    """None -> the offline drafter; a LangChain chat model -> ChatModelDrafter; else as is."""
    if model is None:
        return OfflineDrafter()
    if isinstance(model, Drafter):
        return model
    return ChatModelDrafter(model)
