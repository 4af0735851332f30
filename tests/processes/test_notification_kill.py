"""A worker SIGKILLed while it emails an approval request, to a real SMTP server on 127.0.0.1.

The server accepts the request's message (it is counted: the person has it) and then holds its
reply, so the sending worker is inside `send` when it is killed. Meanwhile the wait is decided,
and a second worker takes the `decided` notification to the same notifier: it is put back
(`defer_notification`) while the request is `sending`, and goes out once the dead worker's
claim on the request expired and the request was settled.

What is promised (keel/core/notification_outbox.py, keel/notifiers/email.py, docs/slack.md
"Once, even when a worker dies"): each notification at most once. A request whose sender died
mid-delivery is asked about with the notifier's `reconcile` (here the SMTP server's spool, a
provider's lookup by Message-ID) and recorded `delivered` if found, never sent again; without a
reconciler it is marked `in_doubt`, never sent again. Here the server had accepted it, so the
person gets the request exactly once either way, and the decision exactly once, after it. The
decision waits for the dead worker's claim on the request (the lease TTL) plus one deferral
(`AFTER_REQUEST`, 1 s) and a sweep: the test allows it far more (a liveness bound, not speed).
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import keel
from keel.notifiers.email import EmailNotifier
from keel.testing import SmtpSink, spawn_worker
from tests.support import REPO
from tests.support.apps import notified
from tests.support.checks import wait_until

pytestmark = pytest.mark.slow

APP = "tests.support.apps.notified:app"
TTL = 6.0
"""The workers' lease TTL, and so a notification's claim: long enough that the second worker
starts and defers the decision while the first one's claim on the request is still live."""


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[SmtpSink]:
    server = SmtpSink(spool=tmp_path / "spool")
    with server:
        yield server


def outbox(db_url: str, run_id: str) -> dict[str, dict[str, Any]]:
    """The run's notifications by kind, read straight from the table."""
    sql = "SELECT kind, status, attempts, created_at, updated_at FROM keel_outbox WHERE run_id = "
    names = ("kind", "status", "attempts", "created_at", "updated_at")
    if db_url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(db_url.removeprefix("sqlite:///"))) as db:
            rows = db.execute(sql + "?", (run_id,)).fetchall()
    else:
        with psycopg.connect(db_url, autocommit=True) as conn:
            rows = conn.execute(sql + "%s", (run_id,)).fetchall()
    return {row[0]: dict(zip(names, row, strict=True)) for row in rows}


@pytest.mark.parametrize("reconciled", [True, False], ids=["reconcile", "no-reconcile"])
def test_a_worker_killed_while_emailing_a_request_sends_each_email_once(
    db_url: str, sink: SmtpSink, tmp_path: Path, reconciled: bool
) -> None:
    spool = str(sink.spool) if reconciled else ""
    env = {"NOTIFIED_SMTP_URL": sink.url, "NOTIFIED_SPOOL": spool, "KEEL_LOG_LEVEL": "warning"}
    procs: list[subprocess.Popen[bytes]] = []

    def worker() -> subprocess.Popen[bytes]:
        procs.append(
            spawn_worker(
                APP,
                database_url=db_url,
                lease_ttl=TTL,
                env=env,
                cwd=REPO,
                log=tmp_path / f"worker-{len(procs)}.log",
            )
        )
        return procs[-1]

    def logs() -> str:
        return "\n".join(p.read_text()[-3000:] for p in sorted(tmp_path.glob("worker-*.log")))

    app = keel.App(db_url, artifacts_dir=tmp_path / "artifacts")
    app.aio.runtime.adopt(notified.app.aio.runtime.workflows)
    # The decision is recorded here: this App inserts its notification, to the same notifier.
    app.add_notifier(
        EmailNotifier(sink.url, "keel@example.com", kinds=("request", "decided"), spool=spool)
    )
    try:
        run_id = app.submit("ask", job_id="n-1", input={"item": "invoice 7"}).run_id
        sink.hold = 120.0
        doomed = worker()
        wait_until(
            lambda: sink.count(x_keel_notification="request"), 60, lambda: f"a request: {logs()}"
        )
        assert outbox(db_url, run_id)["request"]["status"] == "sending"
        app.approve(run_id, by="alice")
        sink.hold = 0.0  # only the request's reply is held
        worker()
        # The second worker took the decision and put it back, the request being sent; the
        # decided run ended meanwhile (either worker may have resumed it).
        wait_until(
            lambda: app.get_run(run_id).status == "completed", 60, lambda: f"the run: {logs()}"
        )
        wait_until(
            lambda: (
                outbox(db_url, run_id)["decided"]["updated_at"]
                > outbox(db_url, run_id)["decided"]["created_at"]
            ),
            30,
            lambda: f"a deferral: {outbox(db_url, run_id)} {logs()}",
        )
        rows = outbox(db_url, run_id)
        assert rows["request"]["status"] == "sending", rows
        assert rows["decided"]["status"] in ("queued", "sending"), rows
        assert rows["decided"]["attempts"] == 0, rows  # a deferral is no attempt
        assert sink.count(x_keel_notification="decided") == 0  # not ahead of its request
        assert doomed.poll() is None, "the sender died before it was killed"

        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
        # Not stuck behind the dead sender's row: out once its claim expired and it settled.
        wait_until(
            lambda: outbox(db_url, run_id)["decided"]["status"] == "delivered",
            TTL + 30,
            lambda: f"the decision: {outbox(db_url, run_id)} {logs()}",
        )
        rows = outbox(db_url, run_id)
        assert rows["request"]["status"] == ("delivered" if reconciled else "in_doubt"), rows
        assert sink.count(x_keel_notification="request") == 1
        assert sink.count(x_keel_notification="decided") == 1
        settled = [
            e["data"]["kind"]
            for e in app.get_run(run_id).timeline
            if e["kind"].startswith("notification.")
        ]
        assert settled == ["request", "decided"], settled  # the decision after its request
        time.sleep(2 * TTL / 3)  # nothing more goes out: never sent again
        assert sink.count(x_keel_notification="request") == 1
        assert len(sink.messages) == 2
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        app.close()
