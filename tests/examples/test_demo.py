"""`keel demo` end to end: real worker subprocesses killed mid-send, a real SMTP server."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

import keel
from keel.demo import story as demo
from keel.demo.story import run_demo


def capture() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=160, color_system=None, force_terminal=False), buf


@pytest.mark.slow
def test_demo_sends_each_email_once_across_two_kills(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    console, buf = capture()
    code = run_demo(workdir, console=console)
    text = buf.getvalue()
    assert code == 0, text
    assert "checks held" in text and "FAILED" not in text
    assert text.count("killed by SIGKILL (exit signal -9)") == 2
    for ticket in ("4711", "4712"):
        assert f"the SMTP server received exactly 1 email for ticket {ticket} (got 1)" in text
    # The sink's spool is the outside world's own record: one file per accepted Message-ID.
    assert len(list((workdir / "spool").glob("*.eml"))) == 2
    with keel.App(f"sqlite:///{workdir / 'keel.db'}", artifacts_dir=workdir / "artifacts") as app:
        runs = app.list_runs()
        assert sorted((r["job_id"], r["status"], r["decision"]) for r in runs) == [
            ("ticket-4711-reply", "completed", "approved"),
            ("ticket-4712-reply", "completed", "approved"),
        ]
        ledger = {
            r["job_id"]: [e["status"] for e in app.get_run(r["run_id"]).effects] for r in runs
        }
    assert ledger == {"ticket-4711-reply": ["sent"], "ticket-4712-reply": ["confirmed"]}


def test_demo_reports_failure_when_workers_cannot_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Workers that cannot even import their app: the demo must say so and exit 1, not
    # print a success it did not see.
    monkeypatch.setattr(demo, "APP_SPEC", "examples.no_such_module:app")
    console, buf = capture()
    code = run_demo(tmp_path / "demo", console=console)
    text = buf.getvalue()
    assert code == 1
    assert "FAILED: the worker exited normally" in text
    assert "checks failed" in text
    assert "checks held" not in text
