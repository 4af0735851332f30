"""Templates and the filters they use: times, durations, JSON shown readably."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, PackageLoader, select_autoescape

from keel.core.codec import loads
from keel.runtime.summary import seconds_text

_env = Environment(
    loader=PackageLoader("keel.service.console", "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


def when(ts: float | None) -> str:
    if ts is None:
        return "—"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float | None) -> str:
    return "—" if seconds is None else seconds_text(seconds)


def pretty(value: Any) -> str:
    """JSON text or a value, indented for people; text that is not JSON is shown as it is."""
    if isinstance(value, str):
        try:
            value = loads(value)
        except ValueError:
            return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def one_line(value: Any) -> str:
    """A value as JSON on one line, its characters as they are: Jinja's `tojson` escapes
    quotes and <>& as \\u0027 and the like for scripts, which a person should not have to read
    (the page's autoescape already makes the text safe in HTML)."""
    return json.dumps(value, ensure_ascii=False, default=str)


def short(text: Any, n: int = 80) -> str:
    s = "" if text is None else str(text)
    return s if len(s) <= n else s[: n - 1] + "…"


def action_id() -> str:
    """One per rendered form: a double click on it is one decision, not two attempts."""
    return "console:" + secrets.token_urlsafe(12)


_env.filters.update(when=when, duration=duration, pretty=pretty, one_line=one_line, short=short)
_env.globals.update(action_id=action_id)


def page(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    html = _env.get_template(template).render(request=request, **context)
    return HTMLResponse(
        html,
        status_code=status_code,
        headers={
            # Pages are per session and change under the reader: never cached or framed.
            "Cache-Control": "no-store",
            "X-Frame-Options": "DENY",
            "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; "
            "form-action 'self'; base-uri 'none'",
            "Referrer-Policy": "same-origin",
        },
    )
