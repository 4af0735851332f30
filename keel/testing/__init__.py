"""Test helpers users can import: real SMTP and HTTP sinks on 127.0.0.1, real worker
processes to kill (`spawn_worker`), and the crash harness as a function (see keel.chaos)."""

from keel.testing.http import HttpSink
from keel.testing.smtp import SmtpSink
from keel.testing.workers import spawn_worker

__all__ = ["HttpSink", "SmtpSink", "spawn_worker"]
