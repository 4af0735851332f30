"""Keel's log lines: ids from contextvars, JSON that parses, and secrets never printed."""

from __future__ import annotations

import io
import json
import logging

from keel.core import logs


def capture(fmt: str) -> tuple[io.StringIO, logging.Handler]:
    out = io.StringIO()
    return out, logs.configure("info", fmt, stream=out)


def test_json_lines_carry_the_bound_ids_and_the_committed_event() -> None:
    out, handler = capture("json")
    try:
        with logs.bind(run_id="r-1", job_id="j-1", workflow="wf@1", worker_id="w-1", token=3):
            logs.event("r-1", "status.completed", {"from": "running"}, worker_id="w-1", token=3)
            logging.getLogger("user.code").info("from a node")
    finally:
        logging.getLogger().removeHandler(handler)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["event"] == "status.completed" and first["run_id"] == "r-1"
    assert (first["job_id"], first["workflow"], first["token"]) == ("j-1", "wf@1", 3)
    assert second["msg"] == "from a node" and second["worker_id"] == "w-1"


def test_secrets_are_redacted_in_text_and_json_and_tracebacks() -> None:
    logs.secret("tok-ABCDEF-123")
    leaky = (
        "postgresql://keel:pw-s3cr3t@db:5432/keel Authorization: Bearer tok-ABCDEF-123 "
        "xoxb-1234-abcd signing_secret=sl4ck-s3cr3t"
    )
    for fmt in logs.FORMATS:
        out, handler = capture(fmt)
        try:
            log = logging.getLogger("keel.test")
            log.info(leaky)
            try:
                raise RuntimeError(leaky)
            except RuntimeError:
                log.exception("failed")
        finally:
            logging.getLogger().removeHandler(handler)
        text = out.getvalue()
        for secret in ("pw-s3cr3t", "tok-ABCDEF-123", "xoxb-1234-abcd", "sl4ck-s3cr3t"):
            assert secret not in text, (fmt, secret)
        assert "postgresql://keel:***@db:5432/keel" in text
