"""The console's sessions: the API's bearer tokens, kept in a cookie, and CSRF tokens.

A person logs in by pasting a token from KEEL_API_TOKENS; the console keeps it in an http-only,
SameSite=Strict cookie scoped to /ui (JavaScript cannot read it, other sites cannot send it) and
judges every request with the HTTP API's own `Authenticator`: the same tokens, the same scopes,
the same limit on failed attempts per client (a wrong token pasted in the form or sent in the
cookie counts). Nothing is stored on the server, so a token removed from the configuration ends
its sessions at the next request.

Every form carries a CSRF token derived from the session's token (an HMAC keyed by it), so it
is stable across restarts and workers, and cannot be made without the session's secret. The
login form, which has no session yet, uses a double-submit cookie instead.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from fastapi import Request

from keel.service.auth import Authenticator, AuthError, Principal, client_of

COOKIE = "keel_session"
LOGIN_COOKIE = "keel_login_csrf"
PATH = "/ui"
_UNJUDGED = object()


class ConsoleRefusal(Exception):
    """A console request refused: 401 sends a person to the login form, 403 says why."""

    def __init__(self, status: int, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


HOMES = (("runs:read", "/ui/runs"), ("approvals:read", "/ui/approvals"))
"""The console's first pages, in order, and the scope each needs: an approver's is the inbox."""


def home_of(principal: Principal) -> str | None:
    """The first console page `principal` can read; None if none (a `runs:write` token)."""
    return next((path for scope, path in HOMES if scope in principal.scopes), None)


@dataclass(frozen=True)
class Session:
    """A logged-in request: whose token its cookie carries, and its forms' CSRF token."""

    principal: Principal
    csrf: str

    def can(self, scope: str) -> bool:
        return scope in self.principal.scopes

    @property
    def home(self) -> str | None:
        """The first console page the token can read (the brand's and the error page's link);
        None if it can read none."""
        return home_of(self.principal)


def csrf_for(token: str) -> str:
    """An HMAC keyed by the session's token: the same on every worker, unforgeable without it."""
    return hmac.new(token.encode(), b"keel-console-csrf", hashlib.sha256).hexdigest()


def new_login_nonce() -> str:
    return secrets.token_urlsafe(24)


class Sessions:
    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    def current(self, request: Request) -> Session | None:
        """The request's session; None without one, or while its client is blocked."""
        try:
            return self._session(request)
        except ConsoleRefusal:
            return None

    def _session(self, request: Request) -> Session | None:
        # Judged once per request: an error page asking again counts no second failure.
        known = getattr(request.state, "keel_session", _UNJUDGED)
        if known is not _UNJUDGED:
            assert known is None or isinstance(known, Session)
            return known
        token = request.cookies.get(COOKIE)
        principal = self.login(request, token) if token else None
        session = Session(principal, csrf_for(token)) if token and principal else None
        request.state.keel_session = session
        return session

    def login(self, request: Request, token: str) -> Principal | None:
        """`token`'s principal, under the failure limit of the request's client: a wrong token
        counts; a blocked client gets `ConsoleRefusal(429)`, whatever token it sends."""
        try:
            return self.auth.authenticate(client_of(request), token)
        except AuthError as exc:
            raise ConsoleRefusal(exc.status, exc.message, retry_after=exc.retry_after) from exc

    def require(self, request: Request, scope: str) -> Session:
        session = self._session(request)
        if session is None:
            raise ConsoleRefusal(401, "log in with a token to see this page")
        if not session.can(scope):
            raise ConsoleRefusal(403, f"your token lacks the scope {scope}")
        return session

    def require_action(self, request: Request, scope: str, csrf: str | None) -> Session:
        """A form post: a session with `scope`, and the form's CSRF token for that session."""
        session = self.require(request, scope)
        if not csrf or not hmac.compare_digest(csrf, session.csrf):
            raise ConsoleRefusal(
                403, "this form's security token is missing or wrong: reload the page and retry"
            )
        return session


def secure(request: Request) -> bool:
    """Mark cookies Secure when the console is reached over HTTPS (directly or via a proxy)."""
    forwarded = request.headers.get("x-forwarded-proto", "")
    return request.url.scheme == "https" or forwarded.split(",")[0].strip() == "https"
