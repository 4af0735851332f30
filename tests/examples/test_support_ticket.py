"""The support-ticket example end to end, in process, on both backends, with a real SMTP sink."""

from __future__ import annotations

import email
import email.policy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

import keel
from keel.core.codec import loads
from keel.demo.support_ticket import register, ticket_job_id
from keel.demo.support_ticket.analysis import analyze, parse_ticket
from keel.demo.support_ticket.drafter import OFFLINE_LABEL, OfflineDrafter
from keel.demo.support_ticket.mail import lookup_sent_email, message_id_for, send_email
from keel.demo.support_ticket.retrieval import load_docs, search
from keel.testing.smtp import SmtpSink

REFUND = {
    "ticket_id": "4711",
    "customer": "ana@example.com",
    "subject": "Refund for my Nimbus Hub",
    "body": "I returned the hub last week and would like my money back. When is the refund due?",
}
PASSWORD = {
    "ticket_id": "4712",
    "customer": "Bo Lee <bo.lee@example.org>",
    "subject": "Locked out",
    "body": "I cannot log in and the password reset email never arrives. Urgent please!",
}


@pytest.fixture
def sink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SmtpSink]:
    spool = tmp_path / "spool"
    with SmtpSink(spool=spool) as server:
        monkeypatch.setenv("SUPPORT_SMTP_URL", server.url)
        monkeypatch.setenv("SUPPORT_MAIL_SPOOL", str(spool))
        monkeypatch.delenv("SUPPORT_MAIL_DIR", raising=False)
        yield server


def run_to_idle(app: keel.App) -> None:
    app.run_worker(stop_when_idle=True, handle_signals=False)


def submit(app: keel.App, ticket: dict[str, str]) -> str:
    row = app.submit("support-ticket", job_id=ticket_job_id(ticket["ticket_id"]), input=ticket)
    return str(row["run_id"])


def test_approved_ticket_sends_exactly_one_email(
    make_app: Callable[..., keel.App], sink: SmtpSink
) -> None:
    app = register(make_app(lease_ttl=5))
    run_id = submit(app, REFUND)
    assert run_id.startswith("ticket-4711-reply-")
    run_to_idle(app)
    waiting = app.get_run(run_id)
    assert waiting.status == "waiting"
    assert sink.count() == 0, "nothing is sent before the manager decides"
    (wait,) = waiting.waits
    payload = loads(wait["payload"])
    assert (wait["kind"], wait["name"], wait["on_timeout"]) == ("approval", "manager", "reject")
    assert payload["to"] == "ana@example.com"
    assert payload["category"] == "refund"
    assert payload["sources"][0] == "Refunds and returns"
    assert OFFLINE_LABEL in payload["draft"]["body"]

    assert app.approve(run_id, by="manager@example.com").recorded
    assert not app.approve(run_id, by="someone-else").recorded
    run_to_idle(app)
    run_to_idle(app)  # nothing left to do: a second worker pass sends nothing

    done = app.get_run(run_id)
    assert (done.status, done.decision, done.termination_reason) == (
        "completed",
        "approved",
        "approved",
    )
    assert len(sink.messages) == 1
    (mail,) = sink.messages
    (effect,) = done.effects
    assert (effect["name"], effect["status"]) == ("send_email", "sent")
    key = effect["idempotency_key"]
    assert mail.rcpt_tos == ("ana@example.com",)
    assert mail.message["X-Keel-Idempotency-Key"] == key
    assert mail.message_id == message_id_for(key) == done.output["delivery"]["message_id"]
    assert mail.subject == "Re: Refund for my Nimbus Hub [ticket 4711]"
    assert OFFLINE_LABEL in mail.message.get_content()
    names = {a.name for a in done.artifacts}
    assert {"draft.txt", "reply.eml"} <= names
    (eml,) = [a for a in done.artifacts if a.name == "reply.eml"]
    saved = email.message_from_bytes(eml.path.read_bytes(), policy=email.policy.default)
    assert saved["Message-ID"] == mail.message_id
    kinds = [e["kind"] for e in done.timeline]
    assert "decision.recorded" in kinds and "effect.sent" in kinds


def test_rejected_ticket_ends_without_email(
    make_app: Callable[..., keel.App], sink: SmtpSink
) -> None:
    app = register(make_app(lease_ttl=5))
    run_id = submit(app, PASSWORD)
    run_to_idle(app)
    assert app.get_run(run_id).status == "waiting"
    app.reject(run_id, by="manager@example.com", comment="tone is off")
    run_to_idle(app)
    done = app.get_run(run_id)
    assert (done.status, done.decision, done.termination_reason) == (
        "completed",
        "rejected",
        "rejected",
    )
    assert sink.count() == 0
    assert done.effects == []
    assert "delivery" not in done.output
    assert done.output["review"] == {
        "decision": "rejected",
        "by": "manager@example.com",
        "comment": "tone is off",
    }
    assert "reply.eml" not in {a.name for a in done.artifacts}


def test_unanswered_approval_is_rejected_at_its_deadline(
    make_app: Callable[..., keel.App], sink: SmtpSink
) -> None:
    clock = keel.ManualClock()
    app = register(make_app(lease_ttl=5, clock=clock))
    run_id = submit(app, REFUND)
    run_to_idle(app)
    clock.advance(23 * 3600)
    run_to_idle(app)
    assert app.get_run(run_id).status == "waiting", "the 24 h deadline has not passed yet"
    clock.advance(2 * 3600)
    run_to_idle(app)
    done = app.get_run(run_id)
    # The deadline rejected it: the decision is rejected, the run ended because time ran out.
    assert (done.status, done.decision, done.termination_reason) == (
        "completed",
        "rejected",
        "timed_out",
    )
    assert done.output["review"]["decision"] == "rejected"
    assert sink.count() == 0
    assert done.effects == []


def test_retrieval_ranks_the_relevant_article_first() -> None:
    assert len(load_docs()) >= 6
    refund = search(REFUND["subject"] + "\n" + REFUND["body"], category="refund")
    assert [h["slug"] for h in refund][:1] == ["refunds"]
    assert len(refund) <= 3
    assert refund == sorted(refund, key=lambda h: -h["score"])
    api = search("Every call returns 401 since I created a new API key", category="api")
    assert api[0]["slug"] == "api-keys"
    # Ticket text is data, never FTS5 query syntax.
    assert search('refund" OR body:* NEAR(')[0]["slug"] == "refunds"
    assert search("hello, thanks!") == []


def test_analysis_rules() -> None:
    refund = analyze(parse_ticket(REFUND))
    assert (refund["category"], refund["urgency"], refund["email"]) == (
        "refund",
        "normal",
        "ana@example.com",
    )
    locked = analyze(parse_ticket(PASSWORD))
    assert (locked["category"], locked["urgency"], locked["email"]) == (
        "password",
        "high",
        "bo.lee@example.org",
    )
    from_body = parse_ticket({**REFUND, "customer": "", "body": "write me at Zed@Example.net"})
    assert analyze(from_body)["email"] == "zed@example.net"
    with pytest.raises(ValueError, match="no customer email"):
        analyze(parse_ticket({**REFUND, "customer": "", "body": "no address here"}))
    with pytest.raises(ValueError, match="subject"):
        parse_ticket({"ticket_id": "1", "body": "x"})


def test_offline_drafter_is_deterministic_and_labeled() -> None:
    ticket = parse_ticket(REFUND)
    analysis = analyze(ticket)
    docs = search(ticket["body"], category=analysis["category"])
    first = OfflineDrafter().draft(ticket, analysis, docs)
    again = OfflineDrafter().draft(parse_ticket(dict(REFUND)), analyze(ticket), list(docs))
    assert first == again
    assert first["body"].rstrip().endswith(OFFLINE_LABEL)
    assert "no LLM" in first["drafted_by"]
    assert first["body"].startswith("Hi Ana,")
    assert docs[0]["url"] in first["body"]
    other = parse_ticket(PASSWORD)
    assert OfflineDrafter().draft(other, analyze(other), [])["body"] != first["body"]


class RecordingChatModel(BaseChatModel):
    """A real LangChain chat model that answers with a fixed text and keeps its prompts."""

    reply: str
    prompts: list[list[BaseMessage]] = []

    @property
    def _llm_type(self) -> str:
        return "recording"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, **kw: Any) -> ChatResult:
        self.prompts.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(self.reply))])


def test_a_chat_model_can_draft(make_app: Callable[..., keel.App], sink: SmtpSink) -> None:
    model = RecordingChatModel(reply="Hi Ana, your refund is on its way.", prompts=[])
    app = register(make_app(lease_ttl=5), drafter=model)
    run_id = submit(app, REFUND)
    run_to_idle(app)
    (wait,) = app.get_run(run_id).waits
    draft = loads(wait["payload"])["draft"]
    assert draft["body"] == "Hi Ana, your refund is on its way.\n"
    assert draft["drafted_by"] == "chat-model:RecordingChatModel"
    assert len(model.prompts) == 1
    system, human = model.prompts[0]
    assert "Refunds and returns" in str(system.content)
    assert REFUND["body"] in str(human.content)


def test_reconciler_asks_the_provider_by_message_id(sink: SmtpSink) -> None:
    key = "effect:send_email:" + "ab" * 16
    args = ("ana@example.com", "Re: hi", "body\n")
    assert lookup_sent_email(*args, ticket_id="1", idempotency_key=key) is None
    result = send_email.fn(*args, ticket_id="1", idempotency_key=key)
    assert result["message_id"] == f"<{'ab' * 16}@keel.invalid>"
    assert sink.count() == 1
    found = lookup_sent_email(*args, ticket_id="1", idempotency_key=key)
    assert found is not None and found["found_by"] == "reconciler"
    assert found["message_id"] == result["message_id"]
    other = "effect:send_email:" + "cd" * 16
    assert lookup_sent_email(*args, ticket_id="1", idempotency_key=other) is None


def test_file_transport_writes_whole_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outbox = tmp_path / "outbox"
    monkeypatch.delenv("SUPPORT_SMTP_URL", raising=False)
    monkeypatch.setenv("SUPPORT_MAIL_DIR", str(outbox))
    key = "effect:send_email:" + "ef" * 16
    args = ("ana@example.com", "Re: hi", "body\n")
    assert lookup_sent_email(*args, ticket_id="1", idempotency_key=key) is None
    send_email.fn(*args, ticket_id="1", idempotency_key=key)
    (written,) = outbox.iterdir()
    assert written.suffix == ".eml"
    parsed = email.message_from_bytes(written.read_bytes(), policy=email.policy.default)
    assert parsed["Message-ID"] == message_id_for(key)
    assert parsed["X-Keel-Idempotency-Key"] == key
    found = lookup_sent_email(*args, ticket_id="1", idempotency_key=key)
    assert found is not None and found["transport"] == "file"


def test_a_sent_ticket_replays_with_no_divergence_and_sends_nothing(
    make_app: Callable[..., keel.App], sink: SmtpSink
) -> None:
    app = register(make_app(lease_ttl=5))
    run_id = submit(app, REFUND)
    run_to_idle(app)
    app.approve(run_id, by="manager@example.com")
    run_to_idle(app)
    done = app.get_run(run_id)
    assert done.status == "completed" and len(sink.messages) == 1
    files = {a.name: a.path.read_bytes() for a in done.artifacts}
    report = app.replay(run_id)
    assert not report.diverged, report.model_dump()
    assert (report.effects_served, report.approvals_answered) == (1, 1)
    assert len(sink.messages) == 1, "the replay sent an email"
    after = app.get_run(run_id)
    assert (after.timeline, after.effects, after.waits) == (done.timeline, done.effects, done.waits)
    assert {a.name: a.path.read_bytes() for a in after.artifacts} == files
