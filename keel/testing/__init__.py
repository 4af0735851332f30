"""Test helpers users can import: a real SMTP sink on 127.0.0.1 (more in later releases)."""

from keel.testing.smtp import SmtpSink

__all__ = ["SmtpSink"]
