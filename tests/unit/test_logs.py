"""Keel's log lines: ids from contextvars, JSON that parses, and secrets never printed."""

from __future__ import annotations

import io
import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@pytest.mark.parametrize(
    ("leaky", "redacted"),
    [
        # A URL's password runs to the last `@` before the host: it may hold `/` or `@`.
        ("postgresql://keel:pa/ss@db:5432/keel", "postgresql://keel:***@db:5432/keel"),
        ("postgresql://keel:p@ss@db/keel", "postgresql://keel:***@db/keel"),
        ("redis://:s3cr3t@cache:6379/0", "redis://:***@cache:6379/0"),
        ("https://u:pw@host/p?email=a@b.c", "https://u:***@host/p?email=a@b.c"),
        # key=value, with quotes or spaces around `=`, and prefixed keys.
        ("password=s3cr3t", "password=***"),
        ("password='s3cr3t'", "password='***'"),
        ('password="s3 cr3t"', 'password="***"'),
        ("password = s3cr3t", "password = ***"),
        ("api_key=AKIA123&page=2", "api_key=***&page=2"),
        ("connect with db_password=hunter2 now", "connect with db_password=*** now"),
        # JSON keys (and a Python dict's repr).
        ('{"password": "s3cr3t", "n": 1}', '{"password": "***", "n": 1}'),
        ('{"secret":"s3cr3t"}', '{"secret":"***"}'),
        ('{"token": "t0k3n"}', '{"token": "***"}'),
        ('{"api_key": "AKIA123"}', '{"api_key": "***"}'),
        ("{'client_secret': 'zz-top'}", "{'client_secret': '***'}"),
        # Authorization headers.
        ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic ***"),
        ("authorization: bearer abc.def-ghi", "authorization: bearer ***"),
    ],
)
def test_redact_masks_common_secret_shapes(leaky: str, redacted: str) -> None:
    assert logs.redact(leaky) == redacted


@pytest.mark.parametrize(
    "plain",
    [
        "the password was reset; the token expired",
        "mail bob@example.com about https://example.com:8443/users/@alice",
        "postgresql://keel@db:5432/keel",
        "if token == expected: pass",
        '{"token": 3, "status": "running"}',
        "a secret-free line with key=value pairs: node=pay step=3",
    ],
)
def test_redact_leaves_ordinary_text_alone(plain: str) -> None:
    assert logs.redact(plain) == plain


def test_redacted_json_lines_still_parse() -> None:
    """A secret quoted inside a JSON line's string is masked without breaking its escapes."""
    message = 'password="s3cr3t" {"api_key": "k1"} postgresql://k:p/w@db Basic QQ=='
    out, handler = capture("json")
    try:
        logging.getLogger("keel.test").info(message)
    finally:
        logging.getLogger().removeHandler(handler)
    line = json.loads(out.getvalue())
    assert line["msg"] == 'password="***" {"api_key": "***"} postgresql://k:***@db Basic ***'


_FRAGMENTS = [
    "://",
    "u:p@h",
    "Bearer ",
    "BASIC ",
    "xoxb-",
    "PassWord",
    "pwd",
    "Secret",
    "TOKEN",
    "api_key",
    "Api-Key",
    "APIKEY",
    "=",
    ": ",
    '"',
    "'",
    "\\",
    " ",
    "x",
    "7",
    "@",
    "/",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=14).map("".join))
def test_the_word_screen_never_skips_a_line_a_pattern_would_change(text: str) -> None:
    # Lines with no trigger word skip the patterns (a speed-up): that must never leave a
    # secret a pattern would have masked.
    unscreened = text
    for pattern, replacement in logs._PATTERNS:
        unscreened = pattern.sub(replacement, unscreened)
    assert logs.redact(text) == unscreened
