"""Bearer tokens and their scopes.

Tokens come from `create_app(tokens=...)` or $KEEL_API_TOKENS
(`tok1=runs:read,approvals:write;tok2=*`). With no tokens configured every authenticated
endpoint answers 401: a service started without configuration is closed, not open.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from keel.core.errors import UsageError

SCOPES = ("runs:read", "runs:write", "approvals:read", "approvals:write")
ALL = "*"
ENV = "KEEL_API_TOKENS"


class AuthError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Principal:
    """Who made the request: the token's fingerprint (never the token) and its scopes."""

    fingerprint: str
    scopes: frozenset[str]

    @property
    def label(self) -> str:
        return f"token:{self.fingerprint}"


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
    found = parse_tokens(os.environ.get(ENV, "")) if tokens is None else dict(tokens)
    checked: dict[str, frozenset[str]] = {}
    for token, scopes in found.items():
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
        checked[token] = frozenset(SCOPES) if ALL in wanted else wanted
    return checked


def fingerprint(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:12]


_bearer = HTTPBearer(auto_error=False, description="A token from KEEL_API_TOKENS.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


class Authenticator:
    def __init__(self, tokens: Mapping[str, frozenset[str]]) -> None:
        # Compared as digests so every candidate costs the same, whatever its length.
        self._tokens = [
            (hashlib.sha256(t.encode()).digest(), fingerprint(t), s) for t, s in tokens.items()
        ]

    def identify(self, token: str) -> Principal | None:
        presented = hashlib.sha256(token.encode()).digest()
        found: Principal | None = None
        for digest, print_, scopes in self._tokens:
            if hmac.compare_digest(presented, digest):
                found = Principal(print_, scopes)
        return found

    def require(self, scope: str) -> Callable[..., Principal]:
        """A FastAPI dependency: the request's principal, if its token carries `scope`."""
        if scope not in SCOPES:
            raise UsageError(f"unknown scope {scope!r}")

        def dependency(request: Request, credentials: Credentials) -> Principal:
            if credentials is None or credentials.scheme.lower() != "bearer":
                raise AuthError(401, "unauthenticated", "send `Authorization: Bearer <token>`")
            principal = self.identify(credentials.credentials)
            if principal is None:
                raise AuthError(401, "unauthenticated", "unknown token")
            if scope not in principal.scopes:
                raise AuthError(403, "forbidden", f"this token lacks the scope {scope}")
            request.state.principal = principal
            return principal

        return dependency
