"""Test helpers users can import: real SMTP and HTTP sinks on 127.0.0.1, and the crash
harness as a function (see keel.chaos)."""

from keel.testing.http import HttpSink
from keel.testing.smtp import SmtpSink

__all__ = ["HttpSink", "SmtpSink"]
