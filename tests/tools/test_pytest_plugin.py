"""keel.testing's pytest fixtures, used as a user would on the shipped example."""

from __future__ import annotations

from pathlib import Path

import pytest

import keel

ROOT = Path(__file__).resolve().parents[2]


def test_keel_db_is_migrated_and_sinks_count(keel_db, keel_smtp_sink, keel_http_sink) -> None:
    import smtplib
    from email.message import EmailMessage

    import httpx

    with keel.App(keel_db) as app:
        assert app.list_runs() == []
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "a@x.invalid", "b@x.invalid", "hi"
    message.set_content("hello")
    with smtplib.SMTP(keel_smtp_sink.host, keel_smtp_sink.port) as smtp:
        smtp.send_message(message)
    httpx.post(keel_http_sink.url + "/hook", json={"n": 1})
    assert keel_smtp_sink.count(subject="hi") == 1
    assert len(keel_http_sink.deliveries) == 1


@pytest.mark.slow
def test_keel_chaos_on_the_support_ticket_example(keel_chaos) -> None:
    report = keel_chaos(
        "keel.demo.support_ticket:app",
        "support-ticket",
        {
            "ticket_id": "17",
            "customer": "ana@example.com",
            "subject": "Refund",
            "body": "I want my money back for the hub I returned.",
        },
        env={"SUPPORT_SMTP_URL": "{smtp_url}", "SUPPORT_MAIL_SPOOL": "{smtp_spool}"},
        points=("effect.after_perform", "wait.after_interrupt"),
        cwd=ROOT,
    )
    assert report.clean.status == "completed"
    assert report.clean.world["smtp messages"] == 1
    assert {c.point for c in report.cells} == {"effect.after_perform", "wait.after_interrupt"}
    assert report.ok, [c.problems for c in report.cells]
