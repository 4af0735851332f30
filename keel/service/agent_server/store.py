"""The Agent Server's store: long-term memory items under namespaces, in Keel's own database.

Every endpoint is one call of the runtime's LangGraph store (keel.langgraph.stores: upstream's
`AsyncSqliteStore` or `AsyncPostgresStore` on Keel's connections), the same store the graphs'
nodes get as their `store` parameter or through `get_store()`: what a node puts during a run,
a client reads here, and the other way round.

Where the protocol leaves a choice: a missing item is answered with `null` (200), as the SDKs
expect (`getItem` resolves to `Item | null`); a namespace label may not contain a period (the
SDKs join a namespace with periods in a query string); `query` (semantic search) needs an
embedding index, which Keel does not configure, so a search with one filters and pages as
without it. Reading needs the `runs:read` scope, writing `runs:write`.

(No `from __future__ import annotations`: FastAPI resolves the dependency aliases below.)
"""

import re
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Query, Response
from langgraph.store.base import BaseStore, InvalidNamespaceError
from pydantic import BaseModel, Field

from keel.runtime.app import App
from keel.service.agent_server.authz import Gate
from keel.service.auth import Principal
from keel.service.errors import Refused

T = TypeVar("T")
MAX_PAGE = 1000
MAX_LABELS = 100
Namespace = list[Annotated[str, Field(min_length=1, max_length=200)]]
OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
FIELD = re.compile(r"[A-Za-z0-9_.-]+")
"""A filter's field names: what both stores take (SQLite's refuses any other, PostgreSQL's
would quietly match nothing)."""


class Body(BaseModel):
    model_config = {"extra": "ignore"}


class ItemPut(Body):
    namespace: Namespace = Field(min_length=1, max_length=MAX_LABELS)
    key: str = Field(min_length=1, max_length=1000)
    value: dict[str, Any]
    index: Literal[False] | list[str] | None = None
    ttl: float | None = Field(None, gt=0)
    """Minutes the item lives unless read again (with `refresh_ttl`)."""


class ItemDelete(Body):
    namespace: Namespace = Field(min_length=1, max_length=MAX_LABELS)
    key: str = Field(min_length=1, max_length=1000)


class ItemSearch(Body):
    namespace_prefix: Namespace = Field(default_factory=list, max_length=MAX_LABELS)
    filter: dict[str, Any] | None = None
    limit: int = Field(10, ge=1, le=MAX_PAGE)
    offset: int = Field(0, ge=0)
    query: str | None = None
    refresh_ttl: bool | None = None


class NamespaceList(Body):
    prefix: Namespace | None = Field(None, max_length=MAX_LABELS)
    suffix: Namespace | None = Field(None, max_length=MAX_LABELS)
    max_depth: int | None = Field(None, ge=1)
    limit: int = Field(100, ge=1, le=MAX_PAGE)
    offset: int = Field(0, ge=0)


def checked(namespace: list[str]) -> tuple[str, ...]:
    """The namespace as the store takes it; 422 if a label holds a period."""
    for label in namespace:
        if "." in label:
            raise Refused(
                422,
                "invalid_namespace",
                f"namespace label {label!r} contains a period, which the protocol cannot carry",
            )
    return tuple(namespace)


def checked_filter(given: dict[str, Any] | None) -> dict[str, Any] | None:
    """The search filter; 422 for one the store cannot run (an unknown operator, a field name
    it refuses, an object that is not operators): before, the store's ValueError was a 500.
    A client's filter is checked before the auth handler sees it, the handler's result after."""
    if given is not None and not isinstance(given, dict):
        raise Refused(422, "invalid_filter", f"a filter is an object, not {type(given).__name__}")
    for field, wanted in (given or {}).items():
        if not FIELD.fullmatch(field):
            raise Refused(
                422,
                "invalid_filter",
                f"filter field {field[:60]!r} may only contain letters, digits, '_', '.' and '-'",
            )
        if not isinstance(wanted, dict):
            continue
        for operator in wanted:
            if operator not in OPERATORS:
                raise Refused(
                    422,
                    "invalid_filter",
                    f"filter on {field!r}: {operator[:60]!r} is not an operator (use one of "
                    f"{', '.join(OPERATORS)}; an exact value that is an object is not supported)",
                )
    return given


def store_router(keel_app: App, auth: Gate) -> APIRouter:
    router = APIRouter(tags=["store"])
    Reader = Annotated[Principal, Depends(auth.require("runs:read"))]
    Writer = Annotated[Principal, Depends(auth.require("runs:write"))]

    def call(work: Callable[[BaseStore], Awaitable[T]]) -> T:
        """`work` on the runtime's store, on the App's own event loop (the store batches its
        calls on the loop it was made on)."""

        async def on_loop() -> T:
            await keel_app.aio.open()
            return await work(keel_app.aio.runtime.langgraph_store)

        try:
            return keel_app.aio.runtime.portal.call(on_loop())
        except InvalidNamespaceError as exc:
            raise Refused(422, "invalid_namespace", str(exc)) from None

    def allowed(principal: Principal, action: str, value: dict[str, Any]) -> dict[str, Any]:
        """`value` as the project's `@auth.on.store` handler left it (it may scope the
        namespace to its user); 403 if it refused."""
        auth.check_sync(principal, "store", action, value)
        for key in ("namespace", "suffix"):
            if isinstance(value.get(key), list):
                value[key] = tuple(value[key])
        return value

    @router.put("/store/items", status_code=204, response_class=Response)
    def put_item(body: ItemPut, principal: Writer) -> Response:
        """Store an item under its namespace and key (replacing one there)."""
        asked = {
            "namespace": checked(body.namespace),
            "key": body.key,
            "value": body.value,
            "index": body.index,
        }
        value = allowed(principal, "put", asked)

        async def put(store: BaseStore) -> None:
            kwargs: dict[str, Any] = {"index": value["index"]}
            if body.ttl is not None:
                kwargs["ttl"] = body.ttl
            await store.aput(value["namespace"], value["key"], value["value"], **kwargs)

        call(put)
        return Response(status_code=204)

    @router.get("/store/items")
    def get_item(
        principal: Reader,
        key: Annotated[str, Query(min_length=1, max_length=1000)],
        namespace: Annotated[str, Query(max_length=20_000)] = "",
        refresh_ttl: bool | None = None,
    ) -> dict[str, Any] | None:
        """The item, or null if there is none. `namespace`: its labels joined with periods."""
        labels = tuple(namespace.split(".")) if namespace else ()
        value = allowed(principal, "get", {"namespace": labels, "key": key})

        async def get(store: BaseStore) -> dict[str, Any] | None:
            item = await store.aget(value["namespace"], value["key"], refresh_ttl=refresh_ttl)
            return None if item is None else item.dict()

        return call(get)

    @router.delete("/store/items", status_code=204, response_class=Response)
    def delete_item(body: ItemDelete, principal: Writer) -> Response:
        """Delete the item (nothing happens if there is none)."""
        asked = {"namespace": checked(body.namespace), "key": body.key}
        value = allowed(principal, "delete", asked)

        async def delete(store: BaseStore) -> None:
            await store.adelete(value["namespace"], value["key"])

        call(delete)
        return Response(status_code=204)

    @router.post("/store/items/search")
    def search_items(body: ItemSearch, principal: Reader) -> dict[str, Any]:
        """Items under a namespace prefix whose values match `filter` (exact values, or
        operators `$eq`, `$ne`, `$gt`, `$gte`, `$lt`, `$lte`), most recently updated first."""
        asked = {
            "namespace": checked(body.namespace_prefix),
            "filter": checked_filter(body.filter),
            "limit": body.limit,
            "offset": body.offset,
            "query": body.query,
        }
        value = allowed(principal, "search", asked)
        # The auth handler may have added conditions of its own: they reach the store too.
        value["filter"] = checked_filter(value.get("filter"))

        async def search(store: BaseStore) -> list[dict[str, Any]]:
            found = await store.asearch(
                value["namespace"],
                query=value["query"],
                filter=value["filter"],
                limit=value["limit"],
                offset=value["offset"],
                refresh_ttl=body.refresh_ttl,
            )
            return [item.dict() for item in found]

        return {"items": call(search)}

    @router.post("/store/namespaces")
    def list_namespaces(body: NamespaceList, principal: Reader) -> dict[str, Any]:
        """The namespaces holding items, matching `prefix` and `suffix` (`*` matches any one
        label), cut to `max_depth` labels."""
        asked = {
            "namespace": checked(body.prefix) if body.prefix else None,
            "suffix": checked(body.suffix) if body.suffix else None,
            "max_depth": body.max_depth,
            "limit": body.limit,
            "offset": body.offset,
        }
        value = allowed(principal, "list_namespaces", asked)

        async def namespaces(store: BaseStore) -> list[list[str]]:
            found = await store.alist_namespaces(
                prefix=value["namespace"] or None,
                suffix=value["suffix"] or None,
                max_depth=value["max_depth"],
                limit=value["limit"],
                offset=value["offset"],
            )
            return [list(namespace) for namespace in found]

        return {"namespaces": call(namespaces)}

    return router
