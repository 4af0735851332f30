"""The newsletter example end to end on both backends: the review loop's limit, the approval by
Slack, the three artifacts and the one announcement, also when a real worker process is killed
during finalization; and email reminders and escalations counted at a real SMTP server."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import keel
from examples.newsletter import FILES, newsletter_job_id, register
from examples.newsletter.content import (
    OFFLINE_LABEL,
    OfflineDrafter,
    Reviewer,
    load_notes,
    select_notes,
)
from examples.newsletter.delivery import notifiers_from_env
from examples.newsletter.graph import render_files
from keel.core.codec import loads
from keel.notifiers.email import EmailNotifier, message_id_for
from keel.testing import spawn_worker
from keel.testing.smtp import SmtpSink
from tests.support import REPO
from tests.support.slack_fake import (
    CHANNEL,
    TOKEN,
    SlackServer,
    claim_and_die,
    deliver,
    run_to_idle,
    sweep,
)

DATE, TOPIC = "2026-08-07", "AI Signals"
TITLE = "Published: AI Signals: the 2026-08-07 issue"


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[SmtpSink]:
    with SmtpSink(spool=tmp_path / "spool") as server:
        yield server


@pytest.fixture
def slack() -> Iterator[SlackServer]:
    with SlackServer() as server:
        yield server


@pytest.fixture
def env(sink: SmtpSink, slack: SlackServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The example's configuration: Slack approvals, email announcements (and reminders)."""
    values = {
        "NEWSLETTER_SMTP_URL": sink.url,
        "NEWSLETTER_MAIL_SPOOL": str(sink.spool),
        "SLACK_BOT_TOKEN": TOKEN,
        "SLACK_CHANNEL": CHANNEL,
        "SLACK_API_URL": slack.base_url,
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def submit(app: keel.App, **input: Any) -> str:
    data = {"topic": TOPIC, "date": DATE, "editor": "U0EDITOR", **input}
    job = newsletter_job_id(data["date"], data["topic"])
    return str(app.submit("newsletter", job_id=job, input=data)["run_id"])


def announcements(sink: SmtpSink) -> int:
    return sink.count(subject=TITLE)


def check_artifacts(app: keel.App, run_id: str) -> dict[str, bytes]:
    """The three files are there, whole, parseable, and what the run's state says they are."""
    done = app.get_run(run_id)
    assert [a.name for a in done.artifacts] == sorted(FILES)
    folder = done.artifacts[0].path.parent
    assert sorted(p.name for p in folder.iterdir()) == sorted(FILES), "no temp files left"
    data = {a.name: a.path.read_bytes() for a in done.artifacts}
    report = json.loads(data["report.json"])
    assert report["run_id"] == run_id and report["job_id"] == done.run["job_id"]
    assert report["approval"]["decision"] == "approved"
    assert report["newsletter"]["sha256"] == done.output["report"]["newsletter.md"]
    newsletter = data["newsletter.md"].decode()
    assert newsletter.startswith("# AI Signals: the 2026-08-07 issue\n")
    assert OFFLINE_LABEL in newsletter and newsletter.endswith("\n")
    assert data["report.md"].decode().startswith("# Report: AI Signals")
    # Finalization is keyed by the run: rendering again gives the same bytes.
    again = render_files(run_id, done.output)
    assert {name: text.encode() for name, text in again.items()} == data
    return data


def test_a_reviewer_that_never_accepts_ends_at_max_revisions(
    make_app: Callable[..., keel.App],
) -> None:
    app = register(make_app())
    run_id = submit(app, accept_on_revision=None, max_revisions=2)
    fast = submit(app, topic="deadlines", accept_on_revision=None, max_revisions=0)
    run_to_idle(app)
    done = app.get_run(run_id)
    assert (done.status, done.decision, done.termination_reason) == (
        "completed",
        "not_decided",
        "max_revisions_exceeded",
    )
    assert [r["revision"] for r in done.output["reviews"]] == [0, 1, 2]
    assert not any(r["accepted"] for r in done.output["reviews"])
    assert done.waits == [] and done.effects == [] and done.artifacts == []
    other = app.get_run(fast)
    assert other.termination_reason == "max_revisions_exceeded"
    assert len(other.output["reviews"]) == 1
    accepted = submit(app, topic="leases", accept_on_revision=2, max_revisions=2)
    run_to_idle(app)
    assert app.get_run(accepted).status == "waiting", "accepted on its last allowed revision"


def test_an_approved_newsletter_is_finalized_and_announced_once(
    make_app: Callable[..., keel.App], env: dict[str, str], sink: SmtpSink, slack: SlackServer
) -> None:
    app = register(make_app())
    for notifier in notifiers_from_env():
        app.add_notifier(notifier)
    run_id = submit(app)
    run_to_idle(app)
    deliver(app)
    (post,) = slack.made("chat.postMessage")
    assert "AI Signals: the 2026-08-07 issue" in str(post["blocks"])
    (wait,) = app.get_run(run_id).waits
    payload = loads(wait["payload"])
    assert payload["revision"] == 1 and OFFLINE_LABEL in payload["newsletter"]
    assert sink.count() == 0, "the editor is a Slack user: no approval email"
    assert app.approve(run_id, by="slack:U0EDITOR", channel="slack").recorded
    run_to_idle(app)
    deliver(app)
    run_to_idle(app)
    done = app.get_run(run_id)
    assert (done.status, done.decision, done.termination_reason) == (
        "completed",
        "approved",
        "approved",
    )
    check_artifacts(app, run_id)
    assert announcements(sink) == 1 and sink.count() == 1
    (mail,) = sink.messages
    assert mail.rcpt_tos == ("team@example.com",)
    assert f"/v1/runs/{run_id}/artifacts/newsletter.md" in mail.message.get_content()
    (intent,) = done.intents  # through the outbox, under its rate limit
    assert (intent["effect"], intent["status"]) == ("announce", "delivered")
    assert mail.message_id == message_id_for(intent["intent_id"])
    assert done.output["notified"]["message_id"] == mail.message_id
    assert len(slack.made("chat.update")) == 1
    assert len(slack.made("chat.postMessage")) == 1


def test_a_rejected_newsletter_writes_and_announces_nothing(
    make_app: Callable[..., keel.App], env: dict[str, str], sink: SmtpSink
) -> None:
    app = register(make_app())
    run_id = submit(app)
    run_to_idle(app)
    app.reject(run_id, by="U0EDITOR", comment="not this week")
    run_to_idle(app)
    done = app.get_run(run_id)
    assert (done.status, done.decision, done.termination_reason) == (
        "completed",
        "rejected",
        "rejected",
    )
    assert done.artifacts == [] and done.intents == [] and sink.count() == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "faults",
    [
        "artifact.before_rename@2",
        "artifact.before_rename:report.md@1",
        "outbox.after_call:announce@1",
    ],
)
def test_a_worker_killed_during_finalization_leaves_whole_files_and_one_announcement(
    faults: str,
    make_app: Callable[..., keel.App],
    db_url: str,
    tmp_path: Path,
    env: dict[str, str],
    sink: SmtpSink,
    slack: SlackServer,
) -> None:
    app = register(make_app())
    for notifier in notifiers_from_env():
        app.add_notifier(notifier)
    run_id = submit(app)
    run_to_idle(app)
    deliver(app)
    assert app.approve(run_id, by="slack:U0EDITOR", channel="slack").recorded
    log = tmp_path / "workers.log"
    doomed = spawn_worker(
        "examples.newsletter:app",
        "--stop-when-idle",
        database_url=db_url,
        faults=faults,
        lease_ttl=1,
        artifacts_dir=tmp_path / "artifacts",
        env=env,
        cwd=REPO,
        log=log,
    )
    assert doomed.wait(60) == -signal.SIGKILL, log.read_text()[-3000:]
    folder = tmp_path / "artifacts" / run_id
    written = {p.name for p in folder.iterdir()}
    if faults.startswith("artifact"):
        assert set(FILES) - written, "killed before all three files were in place"
        assert any(name.endswith(".tmp") for name in written), "killed before a rename"
    assert announcements(sink) == (1 if "announce" in faults else 0)
    first_newsletter = (folder / "newsletter.md").read_bytes()

    # A clean worker (this process) takes the run over once the dead worker's lease expires.
    run_to_idle(app)
    done = app.get_run(run_id)
    assert (done.status, done.decision, done.termination_reason) == (
        "completed",
        "approved",
        "approved",
    )
    data = check_artifacts(app, run_id)
    assert data["newsletter.md"] == first_newsletter
    assert announcements(sink) == 1, "announced exactly once"
    (intent,) = done.intents
    assert (intent["effect"], intent["status"]) == ("announce", "delivered")
    kinds = [e["kind"] for e in done.timeline]
    # A dispatcher killed after the send: the reconciler found the message, nothing resent.
    assert ("outbox.reconciled" in kinds) == ("announce" in faults)
    assert len(slack.made("chat.postMessage")) == 1, "one approval message"
    assert len(slack.made("chat.update")) == 1, "one update for the one decision"


def test_reminders_and_escalations_are_emailed_once_each(
    make_app: Callable[..., keel.App], sink: SmtpSink
) -> None:
    clock = keel.ManualClock()
    app = register(make_app(clock=clock, lease_ttl=30))
    notifier = EmailNotifier(sink.url, "keel@example.com", spool=sink.spool)
    app.add_notifier(notifier)
    run_id = submit(
        app,
        editor="Ed <ed@example.com>",
        approval={
            "remind_after": "1h",
            "escalate_after": "2h",
            "escalate_to": ["chief@example.com", "U0NOTANEMAIL"],
            "timeout": "3h",
        },
    )
    run_to_idle(app)
    deliver(app)
    deliver(app)

    def sent(kind: str) -> list[Any]:
        return [m for m in sink.messages if m.message["X-Keel-Notification"] == kind]

    (request,) = sent("request")
    assert request.rcpt_tos == ("ed@example.com",)
    assert request.subject.startswith("[keel] Approval needed: editor for newsletter-2026")
    assert f"keel approve {run_id}" in request.message.get_content()
    clock.advance(3600)
    for _ in range(2):
        sweep(app)
        deliver(app)
    (remind,) = sent("remind")
    assert remind.rcpt_tos == ("ed@example.com",)
    assert remind.message["In-Reply-To"] == request.message_id
    clock.advance(3600)
    sweep(app)
    sweep(app)
    # The dispatcher sending the escalation dies before recording it; the next one finds the
    # message at the mail server by its Message-ID and does not send it again.
    note, result = claim_and_die(app, notifier)
    assert note.kind == "escalate" and result["to"] == ["chief@example.com"]
    clock.advance(31)
    deliver(app)
    deliver(app)
    (escalate,) = sent("escalate")
    assert escalate.rcpt_tos == ("chief@example.com",)
    assert sink.count() == 3
    statuses = sorted((n["kind"], n["status"]) for n in app.get_run(run_id).notifications)
    assert statuses == [
        ("escalate", "delivered"),
        ("remind", "delivered"),
        ("request", "delivered"),
    ]

    clock.advance(3600)
    sweep(app)
    deliver(app)
    run_to_idle(app)
    done = app.get_run(run_id)
    # The deadline rejected it: the decision is rejected, the run ended because time ran out.
    assert (done.status, done.decision, done.termination_reason) == (
        "completed",
        "rejected",
        "timed_out",
    )
    assert sink.count() == 3, "no email for the expiry (not one of this notifier's kinds)"
    assert done.artifacts == []


def test_an_unreachable_mail_server_is_retried_later(
    make_app: Callable[..., keel.App], tmp_path: Path
) -> None:
    clock = keel.ManualClock()
    with SmtpSink() as probe:
        url = probe.url  # a port nothing listens on once the probe stops
    app = register(make_app(clock=clock))
    app.add_notifier(EmailNotifier(url, "keel@example.com"))
    run_id = submit(app, editor="ed@example.com")
    run_to_idle(app)
    deliver(app)
    (intent,) = app.get_run(run_id).notifications
    assert (intent["status"], intent["attempts"]) == ("queued", 1)
    assert "unreachable" in intent["error"]


def test_the_offline_drafter_and_reviewer_are_deterministic() -> None:
    notes = select_notes("deadlines for humans", load_notes())
    assert notes[0]["slug"] == "deadlines-for-humans"
    drafter, reviewer = OfflineDrafter(), Reviewer()
    first = drafter.draft(TOPIC, DATE, notes, None, None)
    assert first == drafter.draft(TOPIC, DATE, list(notes), None, None)
    assert OFFLINE_LABEL in first["markdown"] and first["revision"] == 0
    review = reviewer.review(first, notes, accept_on_revision=1)
    assert not review["accepted"] and review["requests"] == ["summary", "call_to_action"]
    second = drafter.draft(TOPIC, DATE, notes, first, review)
    assert "**In this issue:**" in second["markdown"] and "**Your turn:**" in second["markdown"]
    assert reviewer.review(second, notes, accept_on_revision=1)["accepted"]
    never = reviewer.review(second, notes, accept_on_revision=None)
    assert not never["accepted"] and never["requests"] == ["tighten"]
    third = drafter.draft(TOPIC, DATE, notes, second, never)
    assert len(third["markdown"]) < len(second["markdown"])
    assert select_notes("zzz", load_notes()) == sorted(load_notes(), key=lambda n: n["slug"])[:4]


def test_an_announced_newsletter_replays_with_no_divergence(
    make_app: Callable[..., keel.App], env: dict[str, str], sink: SmtpSink, slack: SlackServer
) -> None:
    app = register(make_app())
    for notifier in notifiers_from_env():
        app.add_notifier(notifier)
    run_id = submit(app)
    run_to_idle(app)
    app.approve(run_id, by="slack:U0EDITOR", channel="slack")
    run_to_idle(app)
    done = app.get_run(run_id)
    assert done.status == "completed" and announcements(sink) == 1
    files = check_artifacts(app, run_id)
    report = app.replay(run_id)
    assert not report.diverged, report.model_dump()
    # The announcement is an outbox intent: the replay stages nothing and its wait for the
    # delivery is answered as recorded, beside the editor's approval.
    assert (report.effects_served, report.approvals_answered) == (0, 2)
    # The review loop, the approval, the finalization and the announcement, all replayed.
    assert report.last_step is not None and report.last_step >= 5
    assert announcements(sink) == 1, "the replay announced again"
    assert check_artifacts(app, run_id) == files
    assert app.get_run(run_id).timeline == done.timeline
