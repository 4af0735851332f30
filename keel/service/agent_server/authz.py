"""Who may do what on the Agent Server's routes: Keel's tokens, or the `auth` of langgraph.json.

Without an `auth` section the routes take Keel's tokens (keel.service.auth) and every request
that carries the scope sees everything. With one (`{"auth": {"path": "./auth.py:auth"}}`, a
`langgraph_sdk.Auth` object) the protocol's routes answer to it alone, as the Agent Server
does; Keel's own API under /v1, the console and /metrics keep Keel's tokens.

- Its `@auth.authenticate` function gets, by parameter name, `request`, `body`, `path`,
  `method`, `path_params`, `query_params`, `headers` (bytes to bytes, lowercase names) and
  `authorization`; it returns the user's identity (a string), a dict with `identity` (and
  `permissions`, `display_name`, `is_authenticated`), or an object with an `identity`.
  Raising `Auth.exceptions.HTTPException` answers its status (401 by default).
- Before each operation the most specific handler registered for it runs (resource and
  action, then the resource, then the action, then `@auth.on`), with `ctx` (an AuthContext:
  user, permissions, resource, action) and `value` (what the request asks, which it may
  change: a create's `metadata`, a store operation's `namespace`). It returns None or True
  (allowed), False (403), or a filter on metadata (`{"owner": "alice"}`, with `$eq` and
  `$contains`): a thread or assistant whose metadata does not match is not found (404), and
  searches see only those that match.

Runs belong to their thread: creating one is the threads resource's `create_run`, reading,
joining or streaming one is the thread's `read`, cancelling it the thread's `update`, deleting
it the thread's `delete`.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio.from_thread
from fastapi import Request

from keel.core.errors import ThreadNotFound
from keel.core.store.base import Row
from keel.runtime.app import App
from keel.runtime.project import GraphEntry, ProjectError, import_target, project_of
from keel.service.agent_server.shapes import thread_shape
from keel.service.auth import SCOPES, Authenticator, AuthError, Principal
from keel.service.errors import Refused

Filters = dict[str, Any]
PARAMETERS = frozenset(
    {"request", "body", "path", "method", "path_params", "query_params", "headers", "authorization"}
)


class User:
    """The user `@auth.authenticate` returned, as handlers read it (`ctx.user`): `identity`,
    `display_name`, `permissions`, `is_authenticated`, and its other keys by subscript."""

    def __init__(self, found: Any) -> None:
        if isinstance(found, str):
            found = {"identity": found}
        if isinstance(found, Mapping):
            fields = dict(found)
        else:
            fields = {
                name: getattr(found, name)
                for name in ("identity", "display_name", "permissions", "is_authenticated")
                if hasattr(found, name)
            }
        identity = fields.get("identity")
        if not isinstance(identity, str) or not identity:
            raise TypeError("the authenticate handler returned a user without an identity")
        fields.setdefault("display_name", identity)
        fields.setdefault("is_authenticated", True)
        fields["permissions"] = list(fields.get("permissions") or [])
        self._fields = fields

    @property
    def identity(self) -> str:
        return str(self._fields["identity"])

    @property
    def display_name(self) -> str:
        return str(self._fields["display_name"])

    @property
    def is_authenticated(self) -> bool:
        return bool(self._fields["is_authenticated"])

    @property
    def permissions(self) -> list[str]:
        return list(self._fields["permissions"])

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __contains__(self, key: object) -> bool:
        return key in self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __repr__(self) -> str:
        return f"User({self.identity!r})"


@dataclass(frozen=True)
class UserPrincipal(Principal):
    """A request the project's `auth` authenticated: labelled `user:<identity>`."""

    user: User | None = field(default=None, compare=False)


# -- filters ---------------------------------------------------------------------------------


def matches(metadata: Mapping[str, Any] | None, filters: Filters | None) -> bool:
    """Whether `metadata` passes every condition of `filters` (exact values, `$eq`, `$contains`
    one value or each of a list)."""
    metadata = metadata or {}
    for key, wanted in (filters or {}).items():
        if key not in metadata:
            return False
        have = metadata[key]
        if isinstance(wanted, Mapping):
            for op, operand in wanted.items():
                if op == "$eq" and have != operand:
                    return False
                if op == "$contains":
                    if not isinstance(have, list):
                        return False
                    needed = operand if isinstance(operand, list) else [operand]
                    if any(item not in have for item in needed):
                        return False
                if op not in ("$eq", "$contains"):
                    raise Refused(500, "auth_filter", f"unknown filter operator {op!r}")
        elif have != wanted:
            return False
    return True


def exact_part(filters: Filters | None) -> tuple[Filters, Filters]:
    """The conditions Keel's store matches itself (a key holding one JSON value), and the rest
    (operators other than `$eq`), which a reader applies row by row."""
    exact: Filters = {}
    rest: Filters = {}
    for key, wanted in (filters or {}).items():
        if isinstance(wanted, Mapping) and set(wanted) == {"$eq"}:
            exact[key] = wanted["$eq"]
        elif isinstance(wanted, Mapping):
            rest[key] = wanted
        else:
            exact[key] = wanted
    return exact, rest


def merged(metadata: Mapping[str, Any] | None, exact: Filters) -> Filters | None:
    """A search's own metadata filter and the handler's exact conditions together; None if they
    contradict each other (nothing can match)."""
    out = dict(metadata or {})
    for key, value in exact.items():
        if key in out and json.dumps(out[key], sort_keys=True) != json.dumps(value, sort_keys=True):
            return None
        out[key] = value
    return out


# -- the gate --------------------------------------------------------------------------------


class Gate:
    """The Agent Server routes' authentication and authorization: Keel's tokens (`user_auth`
    None), or a `langgraph_sdk.Auth` object's handlers."""

    def __init__(self, tokens: Authenticator, user_auth: Any = None) -> None:
        self.tokens = tokens
        self.user_auth = user_auth
        if user_auth is not None:
            _check_auth(user_auth)

    @property
    def custom(self) -> bool:
        return self.user_auth is not None

    def require(self, scope: str) -> Callable[..., Any]:
        """A FastAPI dependency: the request's principal (Keel's tokens and their `scope`, or
        the user the project's `authenticate` names)."""
        if self.user_auth is None:
            return self.tokens.require(scope)
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}")
        authenticate = self.user_auth._authenticate_handler

        async def dependency(request: Request) -> Principal:
            if authenticate is None:
                user = User({"identity": "anonymous", "is_authenticated": False})
            else:
                user = await _authenticate(authenticate, request)
            principal = UserPrincipal(user.identity, frozenset(SCOPES), kind="user", user=user)
            request.state.principal = principal
            return principal

        return dependency

    async def check(
        self, principal: Principal, resource: str, action: str, value: dict[str, Any]
    ) -> Filters | None:
        """Run the handler for (`resource`, `action`) on `value` (which it may change): the
        filter it returns, None when everything is allowed; 403 `forbidden` when it refuses."""
        if self.user_auth is None or not isinstance(principal, UserPrincipal):
            return None
        handler = _handler(self.user_auth, resource, action)
        if handler is None:
            return None
        from langgraph_sdk.auth.exceptions import HTTPException
        from langgraph_sdk.auth.types import AuthContext

        user = principal.user
        assert user is not None
        ctx = AuthContext(
            permissions=user.permissions,
            user=user,
            resource=resource,  # type: ignore[arg-type]
            action=action,  # type: ignore[arg-type]
        )
        try:
            result = await handler(ctx=ctx, value=value)
        except HTTPException as exc:
            raise _refusal(exc) from None
        except AssertionError as exc:
            raise Refused(403, "forbidden", str(exc) or "refused by the auth handler") from None
        if result is None or result is True:
            return None
        if result is False:
            raise Refused(403, "forbidden", f"{resource}.{action} refused by the auth handler")
        if not isinstance(result, dict):
            raise Refused(
                500, "auth_handler", f"the {resource}.{action} handler returned {result!r}"
            )
        return result or None

    def check_sync(
        self, principal: Principal, resource: str, action: str, value: dict[str, Any]
    ) -> Filters | None:
        """`check`, from a route FastAPI runs in a worker thread."""
        if self.user_auth is None:
            return None
        return anyio.from_thread.run(self.check, principal, resource, action, value)


def visible_thread(
    gate: Gate, keel_app: App, principal: Principal, thread_id: str, action: str, **asked: Any
) -> Row:
    """The thread, if the auth handler lets `principal` do `action` on it (`asked`: the rest of
    the handler's value); a thread its filter hides is not found, as the Agent Server answers."""
    filters = gate.check_sync(principal, "threads", action, {"thread_id": thread_id, **asked})
    row = keel_app.get_thread(thread_id)
    if filters and not matches(thread_shape(row)["metadata"], filters):
        raise ThreadNotFound(f"no thread {thread_id!r}")
    return row


def gate_for(keel_app: App, tokens: Authenticator, user_auth: Any = None) -> Gate:
    """The gate of `keel_app`'s Agent Server routes: `user_auth` if given, else the `auth` of
    the langgraph.json it was loaded from, else Keel's tokens."""
    if user_auth is None:
        project = project_of(keel_app)
        if project is not None and project.auth is not None:
            user_auth = load_auth(str(project.auth["path"]), project.root)
    return Gate(tokens, user_auth)


def load_auth(spec: str, root: Any) -> Any:
    """The `langgraph_sdk.Auth` object `spec` (`./auth.py:auth` or `module:attr`) names."""
    from langgraph_sdk import Auth

    try:
        found = import_target(GraphEntry("auth", spec), root)
    except ProjectError as exc:
        raise ProjectError(f"auth.path {spec!r}: {exc}") from exc
    if not isinstance(found, Auth):
        raise ProjectError(
            f"auth.path {spec!r} names a {type(found).__name__}, not a langgraph_sdk.Auth"
        )
    return found


def _check_auth(user_auth: Any) -> None:
    authenticate = user_auth._authenticate_handler
    if authenticate is None:
        return
    unknown = set(inspect.signature(authenticate).parameters) - PARAMETERS
    if unknown:
        raise ProjectError(
            f"the authenticate handler asks for {', '.join(sorted(unknown))}: it may take "
            f"{', '.join(sorted(PARAMETERS))}"
        )


def _handler(user_auth: Any, resource: str, action: str) -> Callable[..., Awaitable[Any]] | None:
    """The most specific handler for (`resource`, `action`), as the Agent Server picks it."""
    handlers: dict[tuple[str, str], list[Any]] = user_auth._handlers
    for key in ((resource, action), (resource, "*"), ("*", action), ("*", "*")):
        if key in handlers:
            found: Callable[..., Awaitable[Any]] = handlers[key][-1]
            return found
    global_handlers: Sequence[Any] = user_auth._global_handlers
    return global_handlers[-1] if global_handlers else None


async def _authenticate(authenticate: Callable[..., Awaitable[Any]], request: Request) -> User:
    from langgraph_sdk.auth.exceptions import HTTPException

    wanted = set(inspect.signature(authenticate).parameters)
    headers = dict(request.scope.get("headers") or [])
    offered: dict[str, Any] = {
        "request": request,
        "path": request.url.path,
        "method": request.method,
        "path_params": dict(request.path_params),
        "query_params": dict(request.query_params),
        "headers": headers,
        "authorization": request.headers.get("authorization"),
    }
    if "body" in wanted:
        raw = await request.body()
        try:
            offered["body"] = json.loads(raw) if raw else None
        except ValueError:
            offered["body"] = None
    try:
        found = await authenticate(**{k: v for k, v in offered.items() if k in wanted})
    except HTTPException as exc:
        refusal = _refusal(exc)
        raise AuthError(refusal.status, refusal.code, refusal.message) from None
    except AssertionError as exc:
        raise AuthError(401, "unauthenticated", str(exc) or "not authenticated") from None
    try:
        return User(found)
    except TypeError as exc:
        raise AuthError(401, "unauthenticated", str(exc)) from None


def _refusal(exc: Any) -> Refused:
    status = int(exc.status_code)
    code = {401: "unauthenticated", 403: "forbidden", 404: "not_found"}.get(status, "refused")
    return Refused(status, code, str(exc.detail))
