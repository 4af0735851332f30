"""Bearer tokens, their scopes, their labels, and the limit on failed attempts.

Tokens come from `create_app(tokens=...)` or $KEEL_API_TOKENS
(`tok1=runs:read,approvals:write;tok2=*`). With no tokens configured every authenticated
endpoint answers 401: a service started without configuration is closed, not open. A token
too weak to survive an offline guess (under 128 bits by `weak_token_reason`) is refused at
start. A request carries its token as `Authorization: Bearer <token>` or, as langgraph-sdk and
LangGraph Studio send it, `x-api-key: <token>` (the Bearer header wins when both come).

A token is never stored or shown: a request is labelled `token:<fingerprint>`, 12 hex digits of
an HMAC-SHA256 of the token keyed by a server secret ($KEEL_TOKEN_SECRET, else a random one per
process), so a label cannot be reversed by hashing guesses.

Failed attempts are counted per client address (`FailureLimit`): after too many, that client
gets 429 with `Retry-After` until its block passes, whatever token it sends.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import os
import secrets
import string
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from keel.core import logs
from keel.core.errors import UsageError

SCOPES = ("runs:read", "runs:write", "approvals:read", "approvals:write")
ALL = "*"
ENV = "KEEL_API_TOKENS"
SECRET_ENV = "KEEL_TOKEN_SECRET"
MIN_BITS = 128
MIN_DISTINCT = 8
MAKE_ONE = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'


def no_tokens(from_env: bool) -> str:
    """The one warning of a service started without tokens (`create_app` logs it)."""
    why = f"${ENV} is empty" if from_env else "tokens= is empty"
    return (
        f"no API tokens: {why}, so every request but /healthz and /readyz gets 401 "
        f'(e.g. {ENV}="$({MAKE_ONE})=*"; see docs/http.md)'
    )


class AuthError(Exception):
    def __init__(
        self, status: int, code: str, message: str, *, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        """The response headers this refusal needs (`WWW-Authenticate`, `Retry-After`)."""
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return headers


@dataclass(frozen=True)
class Principal:
    """Who made the request: the token's fingerprint (never the token) and its scopes."""

    fingerprint: str
    scopes: frozenset[str]
    kind: str = "token"

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.fingerprint}"


LOOPBACK = Principal("loopback", frozenset(SCOPES), kind="dev")
"""Who a tokenless request from this machine is under `keel dev` (`open_loopback`)."""


def is_loopback(client: str) -> bool:
    """Whether `client` (an address from `client_of`) is this machine: 127.0.0.0/8 or ::1."""
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


def loopback_page(request: Request, origins: frozenset[str]) -> bool:
    """Whether a tokenless loopback request may act as this machine: not sent by a browser page
    of another site, unless that origin is one the server lets in (`cors_origins`: Studio's,
    a chat UI's). A page's request carries `Origin` (a POST always does) or, without it,
    `Sec-Fetch-Site`. The server must be named as this machine names itself (`localhost` or an
    address): a page of another name that DNS points at 127.0.0.1 (rebinding) is refused, even
    its same-origin reads, which carry no `Origin`."""
    host = request.headers.get("host", "")
    origin = request.headers.get("origin")
    if origin is None:
        sent_by = request.headers.get("sec-fetch-site", "none")
        return sent_by in ("none", "same-origin") and _named_here(host)
    origin = origin.rstrip("/")
    if origin in origins or "*" in origins:
        return True
    return _named_here(host) and origin == f"{request.url.scheme}://{host}"


def _named_here(host: str) -> bool:
    """Whether a Host header names the server as only it can be named: `localhost` or an IP
    address (what a rebinding page sends is its own DNS name). No Host: not a browser's."""
    if not host:
        return True
    name = host[1:].split("]", 1)[0] if host.startswith("[") else host.rsplit(":", 1)[0]
    if name.lower() == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


# -- token strength -------------------------------------------------------------------------

_LOWER, _UPPER, _DIGITS = string.ascii_lowercase, string.ascii_uppercase, string.digits
# The smallest of these that holds every character of a token is taken as the alphabet it was
# drawn from: an estimate in the token's favour only where a generator would use that alphabet.
_ALPHABETS: tuple[frozenset[str], ...] = tuple(
    frozenset(chars)
    for chars in (
        _DIGITS,
        _DIGITS + "abcdef",
        _DIGITS + "ABCDEF",
        _DIGITS + _LOWER,
        _DIGITS + _UPPER,
        _DIGITS + _LOWER + _UPPER,
        _DIGITS + _LOWER + _UPPER + "-_",  # secrets.token_urlsafe
        _DIGITS + _LOWER + _UPPER + "+/=-_",  # base64, either flavour, with padding
    )
)
_PRINTABLE = 95  # any other character counts as one of printable ASCII's


def token_bits(token: str) -> float:
    """A conservative estimate of `token`'s entropy in bits: its length times log2 of the
    smallest usual alphabet (digits, hex, alphanumerics, base64...) holding all its characters."""
    used = set(token)
    size = next((len(a) for a in _ALPHABETS if used <= a), _PRINTABLE)
    return len(token) * math.log2(size)


def weak_token_reason(token: str) -> str | None:
    """Why `token` is too weak to use as an API token (or a token secret), or None if it is not.

    Weak means under 128 bits by `token_bits`, or fewer than 8 distinct characters (`aaaa...`).
    A heuristic: it refuses short and repetitive tokens; it cannot prove one random, so make
    tokens with `secrets.token_urlsafe(32)` (43 characters, always accepted). The shortest
    generated tokens sit at the edge: a rare `token_urlsafe(16)` without any upper- or
    lowercase letter (about 1 in 250 000) is refused. The reason never quotes the token.
    """
    bits = token_bits(token)
    if bits < MIN_BITS:
        return f"its {len(token)} characters give about {bits:.0f} bits, fewer than {MIN_BITS}"
    distinct = len(set(token))
    if distinct < MIN_DISTINCT:
        return f"it uses only {distinct} distinct characters, fewer than {MIN_DISTINCT}"
    return None


def _refuse_weak(what: str, reason: str) -> UsageError:
    return UsageError(f"{what} is too weak: {reason}; make one with: {MAKE_ONE}")


# -- loading --------------------------------------------------------------------------------


def parse_tokens(text: str) -> dict[str, frozenset[str]]:
    """`tok1=runs:read,approvals:write;tok2=*` -> {token: scopes}."""
    tokens: dict[str, frozenset[str]] = {}
    for entry in text.split(";"):
        entry = entry.strip()
        if not entry:
            continue
        token, sep, scopes = entry.partition("=")
        if not sep or not token.strip():
            raise UsageError(f"{ENV}: expected TOKEN=SCOPE[,SCOPE...] entries separated by ';'")
        tokens[token.strip()] = frozenset(s.strip() for s in scopes.split(",") if s.strip())
    return tokens


def load_tokens(tokens: Mapping[str, Iterable[str]] | None) -> dict[str, frozenset[str]]:
    """The configured tokens and their scopes, checked: known scopes, strong tokens."""
    source = f"${ENV}" if tokens is None else "tokens="
    found = parse_tokens(os.environ.get(ENV, "")) if tokens is None else dict(tokens)
    checked: dict[str, frozenset[str]] = {}
    for number, (token, scopes) in enumerate(found.items(), start=1):
        if isinstance(scopes, str):
            raise UsageError(f"the scopes of a token must be a list of strings, not {scopes!r}")
        wanted = frozenset(scopes)
        unknown = wanted - {*SCOPES, ALL}
        if unknown:
            raise UsageError(
                f"unknown scope(s) {', '.join(sorted(unknown))}: use {', '.join(SCOPES)} or *"
            )
        if not token or token != token.strip():
            raise UsageError("a token must be non-empty and have no surrounding spaces")
        reason = weak_token_reason(token)
        if reason is not None:
            shown = ",".join(sorted(wanted)) or "no scopes"
            raise _refuse_weak(f"{source}: token {number} of {len(found)} ({shown})", reason)
        logs.secret(token)
        checked[token] = frozenset(SCOPES) if ALL in wanted else wanted
    return checked


# -- fingerprints ---------------------------------------------------------------------------

_process_secret = secrets.token_bytes(32)


def token_secret() -> bytes:
    """The key of token fingerprints: $KEEL_TOKEN_SECRET, else this process's random secret
    (then labels differ between processes and restarts)."""
    configured = os.environ.get(SECRET_ENV, "")
    if not configured:
        return _process_secret
    reason = weak_token_reason(configured)
    if reason is not None:
        raise _refuse_weak(f"${SECRET_ENV}", reason)
    logs.secret(configured)
    return configured.encode()


def _digest(token: str, secret: bytes) -> bytes:
    return hmac.new(secret, token.encode(), hashlib.sha256).digest()


def fingerprint(token: str, secret: bytes | None = None) -> str:
    """12 hex digits of HMAC-SHA256(secret, token): a label that names a token without
    revealing it, even to someone who can hash guesses; `secret` defaults to `token_secret()`."""
    return _digest(token, token_secret() if secret is None else secret).hex()[:12]


# -- failed attempts ------------------------------------------------------------------------


@dataclass
class _Record:
    started: float  # the first failure of the current window
    failures: int
    blocked_until: float = 0.0


class FailureLimit:
    """Failed authentications per client: `failures` within `window` seconds block the client
    for `window` seconds, whatever it sends then (a right token included, so a block cannot be
    used to tell a right guess from a wrong one).

    In-process: behind a load balancer each server counts on its own. At most `max_clients`
    clients are remembered; past that the one whose failure is oldest is forgotten. `clock` is
    a monotonic clock in seconds (a test passes its own).
    """

    def __init__(
        self,
        failures: int = 10,
        window: float = 60.0,
        *,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures < 1 or window <= 0 or max_clients < 1:
            raise UsageError("FailureLimit needs failures >= 1, window > 0 and max_clients >= 1")
        self.failures = failures
        self.window = window
        self.max_clients = max_clients
        self.clock = clock
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """How many clients are remembered."""
        return len(self._records)

    def blocked_for(self, client: str) -> float:
        """Seconds until `client` may try again; 0 when it may now."""
        now = self.clock()
        with self._lock:
            record = self._records.get(client)
            if record is None:
                return 0.0
            if record.blocked_until > now:
                return record.blocked_until - now
            if record.blocked_until or now - record.started >= self.window:
                del self._records[client]  # its block or its window is over
            return 0.0

    def failed(self, client: str) -> None:
        """Count one failed attempt of `client`."""
        now = self.clock()
        with self._lock:
            record = self._records.get(client)
            if record is None or record.blocked_until or now - record.started >= self.window:
                record = _Record(started=now, failures=0)
            record.failures += 1
            if record.failures >= self.failures:
                record.blocked_until = now + self.window
            self._records[client] = record
            self._records.move_to_end(client)
            while len(self._records) > self.max_clients:
                self._records.popitem(last=False)

    def check(self, client: str) -> None:
        """Raise a 429 `AuthError` if `client` is blocked."""
        left = self.blocked_for(client)
        if left > 0:
            raise AuthError(
                429,
                "too_many_failures",
                f"too many failed authentications from this address: retry in {math.ceil(left)} s",
                retry_after=math.ceil(left),
            )


def client_of(request: Request) -> str:
    """The address a request came from (the proxy's, behind a proxy)."""
    return request.client.host if request.client else "unknown"


# -- requests -------------------------------------------------------------------------------

_bearer = HTTPBearer(auto_error=False, description="A token from KEEL_API_TOKENS.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
# How langgraph-sdk, LangGraph Studio and agent-chat-ui send a key (`api_key=`).
_api_key = APIKeyHeader(
    name="x-api-key", auto_error=False, description="A token from KEEL_API_TOKENS."
)
ApiKey = Annotated[str | None, Depends(_api_key)]


class Authenticator:
    def __init__(
        self,
        tokens: Mapping[str, frozenset[str]],
        *,
        secret: bytes | None = None,
        limit: FailureLimit | None = None,
        open_loopback: bool = False,
        loopback_origins: Iterable[str] = (),
    ) -> None:
        """`open_loopback` (`keel dev` only): a request from a loopback address that sends no
        token is `LOOPBACK`, with every scope, unless a browser page of another origin than
        `loopback_origins` (the CORS origins) sent it (`loopback_page`); one that sends a
        token is judged as always."""
        self._secret = token_secret() if secret is None else secret
        self.open_loopback = open_loopback
        self.loopback_origins = frozenset(o.rstrip("/") for o in loopback_origins)
        self.limit = FailureLimit() if limit is None else limit
        # Compared as digests so every candidate costs the same, whatever its length.
        self._tokens: list[tuple[bytes, str, frozenset[str]]] = []
        for token, scopes in tokens.items():
            digest = _digest(token, self._secret)
            self._tokens.append((digest, digest.hex()[:12], scopes))

    def fingerprint(self, token: str) -> str:
        return _digest(token, self._secret).hex()[:12]

    def identify(self, token: str) -> Principal | None:
        """The principal of `token`, or None; no counting (see `authenticate`)."""
        presented = _digest(token, self._secret)
        found: Principal | None = None
        for digest, print_, scopes in self._tokens:
            if hmac.compare_digest(presented, digest):
                found = Principal(print_, scopes)
        return found

    def authenticate(self, client: str, token: str) -> Principal | None:
        """`identify`, under the failure limit: a 429 `AuthError` while `client` is blocked,
        and an unknown token counts as one failure of `client`."""
        self.limit.check(client)
        principal = self.identify(token)
        if principal is None:
            self.limit.failed(client)
        return principal

    def require(self, scope: str) -> Callable[..., Awaitable[Principal]]:
        """A FastAPI dependency: the request's principal, if its token carries `scope`."""
        if scope not in SCOPES:
            raise UsageError(f"unknown scope {scope!r}")

        # A coroutine, though it awaits nothing: FastAPI runs a plain function dependency in
        # its thread pool, a hop there and back per request for an HMAC and a dict lookup.
        async def dependency(
            request: Request, credentials: Credentials, api_key: ApiKey
        ) -> Principal:
            client = client_of(request)
            self.limit.check(client)
            token = credentials.credentials if credentials is not None else api_key
            if token is None and self.open_loopback and is_loopback(client):
                if loopback_page(request, self.loopback_origins):
                    request.state.principal = LOOPBACK
                    return LOOPBACK
                raise AuthError(
                    401,
                    "unauthenticated",
                    "a page of another site gets no token-free access to keel dev: send "
                    "`Authorization: Bearer <token>`, or let its origin in with --cors-origin",
                )
            if token is None:
                raise AuthError(
                    401,
                    "unauthenticated",
                    "send `Authorization: Bearer <token>` (or `x-api-key: <token>`)",
                )
            principal = self.authenticate(client, token)
            if principal is None:
                raise AuthError(401, "unauthenticated", "unknown token")
            if scope not in principal.scopes:
                raise AuthError(403, "forbidden", f"this token lacks the scope {scope}")
            request.state.principal = principal
            return principal

        return dependency
