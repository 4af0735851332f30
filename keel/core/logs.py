"""Keel's logs: one setup for every process, correlation ids from contextvars, one redactor.

The worker and the executor bind the ids of what they are doing (`bind`); every record logged
inside carries them as attributes, so a line from a node, an effect or the saver says which run,
job, workflow@version, worker, lease token, node and step it belongs to without any caller
formatting them in. Node and step come from a `locate` callable bound by the executor (the
calling node's LangGraph config), read when the record is made.

Every timeline event a transaction commits is logged once, after the commit (`event`), on the
`keel.events` logger: a rolled-back write logs nothing, and what the log says happened did. The
metrics module counts the same records, so a log line and a counter never disagree.

Secrets are removed in one place, the formatters (`redact`): passwords in URLs, bearer tokens,
Slack tokens and signing secrets, and any value registered with `secret()`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

EVENTS = logging.getLogger("keel.events")
LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")
LEVEL_ENV, FORMAT_ENV = "KEEL_LOG_LEVEL", "KEEL_LOG_FORMAT"

# The ids a record may carry, in the order a text line shows them.
FIELDS = ("run_id", "job_id", "workflow", "worker_id", "token", "node", "step")

_FINISHED = ("status.completed", "status.failed", "status.cancelled")
# Short names in text lines ("lease", not "token": `token=` values are redacted as secrets).
_LABELS = {"run_id": "run", "job_id": "job", "worker_id": "worker", "token": "lease"}

_bound: ContextVar[dict[str, Any] | None] = ContextVar("keel_log_fields", default=None)

# -- redaction --------------------------------------------------------------------------------

# Keys whose values are secrets: `password`, `db_password`, `client_secret`, `api-key`...
_KEY = r"(?:[A-Za-z0-9]+[_-])*(?:password|passwd|pwd|secret|token|api[_-]?key|apikey)"
# A quoted value, its quote in group `q` (`\"` inside a JSON line's string), escapes kept whole.
_QUOTED = r"(?P<q>\\?[\"'])(?:(?!(?P=q))(?:\\.|[^\\]))*(?P=q)"


def _masked(match: re.Match[str]) -> str:
    """The key and its separator (group `head`) kept, the value `***`, in its quotes if any."""
    quote = match["q"] or ""
    return f"{match['head']}{quote}***{quote}"


_PATTERNS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    # scheme://user:PASSWORD@host: up to the last `@` before the host (a password may hold `@`
    # or `/`), never past a `?`/`#`, a space or a JSON string's end; `host:8080/a@b` is a port.
    (re.compile(r"(://[^:/@\s\"]*:)(?!\d{1,5}/)[^\s?#\"]*@"), r"\1***@"),
    (re.compile(r"(?i)\b((?:bearer|basic)\s+)[^\s'\",\\]+"), r"\1***"),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]+"), "xox*-***"),  # Slack tokens
    # "password": "s3cr3t" (JSON, or a Python dict's repr): string values only.
    (re.compile(rf"(?i)(?P<head>(?P<kq>\\?[\"']){_KEY}(?P=kq)\s*:\s*){_QUOTED}"), _masked),
    # password=s3cr3t, password = 's3cr3t', api_key="..." (not a comparison, `token == x`).
    (
        re.compile(rf"(?i)(?P<head>\b{_KEY}\s*=(?!=)\s*)(?:{_QUOTED}|[^\s&'\",;\\]+)"),
        _masked,
    ),
)
_TRIGGERS = (
    "://", "bearer", "basic", "xox", "passw", "pwd", "secret", "token", "api_key", "api-key",
    "apikey",
)  # fmt: skip
"""Every pattern above needs one of these words (lowercase) in a line to match there. Most
lines hold none: substring searches of the lowercased line tell so in 1.5 µs, where one
case-blind regex of the same words took 12 µs and the five patterns more."""
_secrets: set[str] = set()
_longest_first: tuple[str, ...] = ()


def secret(value: str | None) -> None:
    """Never print `value` (an API token, a signing secret) in any log line from now on."""
    global _longest_first
    if value and len(value) >= 4 and value not in _secrets:
        _secrets.add(value)
        # Longest first: a secret that contains another is removed whole.
        _longest_first = tuple(sorted(_secrets, key=len, reverse=True))


def secrets_from_env() -> None:
    """Register the secrets Keel reads from its environment ($KEEL_API_TOKENS' tokens, the
    Slack signing secret and bot token)."""
    for spec in os.environ.get("KEEL_API_TOKENS", "").split(";"):
        secret(spec.split("=", 1)[0].strip())
    for name in ("KEEL_SLACK_SIGNING_SECRET", "SLACK_SIGNING_SECRET", "SLACK_BOT_TOKEN"):
        secret(os.environ.get(name))


def redact(text: str) -> str:
    """`text` without the secrets it may hold; fit for a terminal or a log."""
    lowered = text.lower()
    if any(trigger in lowered for trigger in _TRIGGERS):
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
    for value in _longest_first:
        if value in text:
            text = text.replace(value, "***")
    return text


# -- correlation ids --------------------------------------------------------------------------


@contextmanager
def bind(**fields: Any) -> Iterator[dict[str, Any]]:
    """Records logged inside carry `fields` (run_id=..., locate=callable...) as attributes."""
    merged = {**(_bound.get() or {}), **fields}
    token = _bound.set(merged)
    try:
        yield merged
    finally:
        _bound.reset(token)


def bound() -> dict[str, Any]:
    """The ids of the current context: bound fields, and node and step where a node runs."""
    fields = dict(_bound.get() or {})
    locate = fields.pop("locate", None)
    fields.pop("marks", None)
    if locate is not None:
        try:
            where = locate()
        except Exception:  # outside a node (the executor itself): no node, no step
            pass
        else:
            fields.setdefault("node", where.node)
            fields.setdefault("step", where.step)
    return {k: v for k, v in fields.items() if v is not None}


class ContextFilter(logging.Filter):
    """Copies the bound ids onto every record (a record's own `extra` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in bound().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def since_mark(run_id: str, what: str) -> float | None:
    """Seconds since the previous call for this run and `what` in this execution (step
    durations: the time since the previous step boundary); None the first time."""
    fields = _bound.get() or {}
    marks = fields.get("marks")
    if marks is None or fields.get("run_id") != run_id:
        return None
    now = time.monotonic()
    previous = marks.get(what, fields.get("started"))
    marks[what] = now
    return None if previous is None else now - previous


def event(
    run_id: str,
    kind: str,
    data: dict[str, Any],
    *,
    worker_id: str | None,
    token: int | None,
    ids: dict[str, Any] | None = None,
    took: float | None = None,
) -> None:
    """Log one committed timeline event at INFO on `keel.events`, with a duration: a step's
    since the previous step boundary, a finished run's since its claim, an event that carries
    one its own, any other the time its transaction took (`took`)."""
    if not EVENTS.isEnabledFor(logging.INFO):
        return
    extra: dict[str, Any] = {**(ids or {}), "event": kind, "run_id": run_id, "event_data": data}
    if worker_id is not None:
        extra["worker_id"] = worker_id
    if token is not None:
        extra["token"] = token
    duration = data.get("duration")
    if kind in _FINISHED:
        duration = since_mark(run_id, "run")  # this execution: claim to finish
    elif kind == "step":
        duration = since_mark(run_id, "step")
        if data.get("node"):
            extra["node"] = data["node"]
    if not isinstance(duration, int | float):
        duration = took
    if isinstance(duration, int | float):
        extra["duration"] = round(float(duration), 6)
    EVENTS.info("%s", describe(kind, data), extra=extra)


def database_error(exc: BaseException) -> dict[str, Any]:
    """The `extra` of a line about a database failure Keel rides out (logged without its
    traceback): its kind, which the metrics count (`keel_database_errors_total{kind}`)."""
    return {"db_error": type(exc).__name__}


def describe(kind: str, data: dict[str, Any]) -> str:
    """A short readable text for a timeline event."""
    shown = {k: v for k, v in data.items() if k not in ("writes", "expires_at")}
    if kind.startswith("status.") and "from" in shown:
        shown.pop("to", None)
        parts = [f"{kind} (from {shown.pop('from')})"]
    else:
        parts = [kind]
    parts += [f"{k}={_short(v)}" for k, v in shown.items()]
    return " ".join(parts)


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


# -- formatting and setup ---------------------------------------------------------------------


class TextFormatter(logging.Formatter):
    """`2026-12-01T19:30:00.123Z INFO keel.events run=... worker=... lease=2 | lease.claimed`."""

    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        ids = []
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                ids.append(f"{_LABELS.get(key, key)}={value}")
        duration = getattr(record, "duration", None)
        if duration is not None:
            ids.append(f"took={duration * 1000:.1f}ms")
        line = f"{when}.{int(record.msecs):03d}Z {record.levelname} {record.name}"
        line += (" " + " ".join(ids) if ids else "") + " | " + record.getMessage()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return redact(line)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the ids, event, duration, exc."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in (*FIELDS, "event", "duration"):
            value = getattr(record, key, None)
            if value is not None:
                doc[key] = value
        if (data := getattr(record, "event_data", None)) is not None:
            doc["data"] = data
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return redact(json.dumps(doc, default=str))


class CurrentStderr(logging.StreamHandler):
    """Writes to `sys.stderr` as it is when a record is written, not as it was when logging was
    configured: after a redirect ends (a test runner's capture, `contextlib.redirect_stderr`)
    records from any thread still reach the live stderr instead of a closed stream."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # always the current stderr


def configure(
    level: str | None = None, fmt: str | None = None, *, stream: Any = None
) -> logging.Handler:
    """Send every logger's records (Keel's, uvicorn's, the user's) to stderr, as text or JSON
    lines, from `level` up; defaults from $KEEL_LOG_LEVEL and $KEEL_LOG_FORMAT (info, text).
    Calling it again replaces the handler it installed."""
    level = (level or os.environ.get(LEVEL_ENV) or "info").lower()
    fmt = (fmt or os.environ.get(FORMAT_ENV) or "text").lower()
    if level not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")
    secrets_from_env()
    handler = logging.StreamHandler(stream) if stream is not None else CurrentStderr()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    handler.set_name("keel")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "keel"]:
        root.removeHandler(old)
    root.addHandler(handler)
    numeric = logging.getLevelName(level.upper())
    handler.setLevel(numeric)
    root.setLevel(numeric)
    logging.getLogger("keel").setLevel(numeric)
    return handler


def keep_info(logger: logging.Logger = EVENTS) -> None:
    """Let INFO records of `logger` reach in-process handlers (metrics) even when the output
    shows only warnings: the output handler's own level still filters what is printed."""
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
