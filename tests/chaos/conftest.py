"""Fixtures of the crash tests: a real SMTP sink and the harness driving worker processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import keel
from keel.testing.smtp import SmtpSink
from tests.chaos import mailer_app
from tests.chaos.harness import Chaos


@pytest.fixture
def chaos(db_url: str, tmp_path: Path) -> Iterator[Chaos]:
    spool = tmp_path / "spool"
    app = mailer_app.register(keel.App(db_url, artifacts_dir=tmp_path / "artifacts"))
    with SmtpSink(spool=spool) as sink:
        harness = Chaos(app=app, db_url=db_url, sink=sink, spool=spool, tmp_path=tmp_path)
        try:
            yield harness
        finally:
            harness.stop_all()
            app.close()
