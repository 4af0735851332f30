"""The Agent Server protocol's store, driven only through langgraph-sdk against a real uvicorn
server on 127.0.0.1 (Keel's whole HTTP app, `create_app`), on both backends: items put, read,
searched and deleted; namespaces listed; and the same store in a run's nodes, through their
`store` parameter and `get_store()`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient
from langgraph_sdk.errors import APIStatusError, PermissionDeniedError
from typing_extensions import TypedDict

import keel
from keel.service.api import create_app
from tests.support.apps.service import LiveServer
from tests.support.service_client import ADMIN, READER, TOKENS
from tests.support.workers import drain

ITEM_FIELDS = {"namespace", "key", "value", "created_at", "updated_at"}


class Memo(TypedDict, total=False):
    user: str
    note: str
    seen: str


def remembering() -> StateGraph:
    """`remember` writes the note under the user through its `store` parameter; `recall` reads
    what a client put for that user through `get_store()`."""

    def remember(state: Memo, store: BaseStore) -> dict[str, Any]:
        store.put(("memories", state["user"]), "last", {"note": state["note"], "by": "node"})
        return {}

    def recall(state: Memo) -> dict[str, Any]:
        item = get_store().get(("profiles", state["user"]), "profile")
        return {"seen": item.value["name"] if item is not None else "nobody"}

    g = StateGraph(Memo)
    g.add_node("remember", remember)
    g.add_node("recall", recall)
    g.add_edge(START, "remember")
    g.add_edge("remember", "recall")
    g.add_edge("recall", END)
    return g


class Served:
    def __init__(self, app: keel.App, url: str) -> None:
        self.app = app
        self.url = url
        self.client: SyncLangGraphClient = get_sync_client(url=url, api_key=ADMIN)


@pytest.fixture
def served(make_app: Callable[..., keel.App]) -> Iterator[Served]:
    app = make_app(lease_ttl=5)
    app.workflow("remembering")(remembering)
    with LiveServer(create_app(app, tokens=TOKENS)) as server:
        here = Served(app, server.url)
        yield here
        here.client.http.client.close()


def keys(items: list[dict[str, Any]]) -> list[str]:
    return [item["key"] for item in items]


def test_put_get_and_delete_items(served: Served, backend: str) -> None:
    store = served.client.store
    assert store.get_item(["docs", "u1"], key="a") is None
    store.put_item(["docs", "u1"], key="a", value={"title": "first", "n": 1})
    item = store.get_item(["docs", "u1"], key="a")
    assert set(item) == ITEM_FIELDS
    assert (item["namespace"], item["key"], item["value"]) == (
        ["docs", "u1"],
        "a",
        {"title": "first", "n": 1},
    )
    created = datetime.fromisoformat(str(item["created_at"]))
    assert datetime.fromisoformat(str(item["updated_at"])) >= created

    # A put on the same namespace and key replaces the value. On PostgreSQL the item keeps its
    # creation; upstream's SQLite store replaces the row, so its creation is the latest put's
    # (docs/agent-server.md, Store).
    store.put_item(["docs", "u1"], key="a", value={"title": "second"})
    again = store.get_item(["docs", "u1"], key="a")
    assert again["value"] == {"title": "second"}
    if backend == "postgres":
        assert again["created_at"] == item["created_at"]
    else:
        assert datetime.fromisoformat(str(again["created_at"])) >= created
    # Another namespace is another item.
    assert store.get_item(["docs", "u2"], key="a") is None

    store.delete_item(["docs", "u1"], key="a")
    assert store.get_item(["docs", "u1"], key="a") is None
    store.delete_item(["docs", "u1"], key="a")  # deleting nothing is not an error

    # A time to live is accepted (and recorded by upstream's store; nothing sweeps it yet).
    store.put_item(["docs", "u1"], key="t", value={"v": 1}, ttl=60)
    assert store.get_item(["docs", "u1"], key="t", refresh_ttl=True)["value"] == {"v": 1}


def test_search_items_with_filter_limit_and_offset(served: Served, backend: str) -> None:
    store = served.client.store
    for n in range(5):
        color = "red" if n % 2 == 0 else "blue"
        store.put_item(["shop", "items"], key=f"k{n}", value={"n": n, "color": color})
    store.put_item(["shop", "other"], key="x", value={"n": 9, "color": "red"})
    store.put_item(["elsewhere"], key="y", value={"n": 10, "color": "red"})

    everything = store.search_items(["shop"], limit=100)["items"]
    assert sorted(keys(everything)) == ["k0", "k1", "k2", "k3", "k4", "x"]
    assert all(set(i) >= ITEM_FIELDS for i in everything)

    reds = store.search_items(["shop", "items"], filter={"color": "red"}, limit=100)["items"]
    assert sorted(keys(reds)) == ["k0", "k2", "k4"]
    assert all(i["value"]["color"] == "red" for i in reds)
    big = store.search_items(["shop"], filter={"n": {"$gte": 3}}, limit=100)["items"]
    assert sorted(keys(big)) == ["k3", "k4", "x"]

    # Most recently updated first; pages cut that order.
    stamps = [i["updated_at"] for i in everything]
    assert stamps == sorted(stamps, reverse=True)
    first = store.search_items(["shop"], limit=4, offset=0)["items"]
    rest = store.search_items(["shop"], limit=4, offset=4)["items"]
    assert (len(first), len(rest)) == (4, 2)
    assert set(keys(first) + keys(rest)) <= set(keys(everything))
    if backend == "postgres":
        # Each put its own timestamp (SQLite's are whole seconds: ties come in any order).
        assert keys(first) + keys(rest) == keys(everything)
    assert store.search_items(["shop"], limit=4, offset=6)["items"] == []

    # No query: a plain filtered search (Keel configures no embedding index).
    assert sorted(keys(store.search_items(["shop", "items"], query=None)["items"])) == [
        "k0",
        "k1",
        "k2",
        "k3",
        "k4",
    ]
    # An empty prefix searches everything.
    assert "y" in keys(store.search_items([], limit=100)["items"])


def test_list_namespaces_by_prefix_suffix_and_depth(served: Served) -> None:
    store = served.client.store
    for namespace in (
        ["a", "b", "c"],
        ["a", "b", "d"],
        ["a", "e"],
        ["f", "b", "c"],
    ):
        store.put_item(namespace, key="k", value={"at": ".".join(namespace)})

    def listed(**kwargs: Any) -> list[list[str]]:
        return sorted(store.list_namespaces(**kwargs)["namespaces"])

    assert listed() == [["a", "b", "c"], ["a", "b", "d"], ["a", "e"], ["f", "b", "c"]]
    assert listed(prefix=["a"]) == [["a", "b", "c"], ["a", "b", "d"], ["a", "e"]]
    assert listed(prefix=["a", "b"]) == [["a", "b", "c"], ["a", "b", "d"]]
    assert listed(suffix=["c"]) == [["a", "b", "c"], ["f", "b", "c"]]
    assert listed(prefix=["a"], suffix=["d"]) == [["a", "b", "d"]]
    assert listed(max_depth=2) == [["a", "b"], ["a", "e"], ["f", "b"]]
    assert listed(max_depth=1) == [["a"], ["f"]]
    assert listed(prefix=["zzz"]) == []
    assert len(store.list_namespaces(limit=2)["namespaces"]) == 2
    assert len(store.list_namespaces(limit=10, offset=3)["namespaces"]) == 1


def test_what_the_protocol_refuses(served: Served) -> None:
    store = served.client.store
    # A period cannot travel in the query string's namespace: the SDK refuses it, and so does
    # the server when a client sends it in a body anyway.
    with pytest.raises(APIStatusError) as refused:
        served.client.http.put("/store/items", json={"namespace": ["a.b"], "key": "k", "value": {}})
    assert refused.value.status_code == 422
    with pytest.raises(APIStatusError) as refused:
        served.client.http.put("/store/items", json={"namespace": [], "key": "k", "value": {}})
    assert refused.value.status_code == 422
    with pytest.raises(APIStatusError) as refused:
        served.client.http.put("/store/items", json={"namespace": ["a"], "key": "k", "value": 3})
    assert refused.value.status_code == 422
    assert store.search_items(["a"])["items"] == []

    # A filter the store cannot run: 422 with the reason (it was the store's ValueError, a 500).
    store.put_item(["a"], key="k", value={"x": 1})
    for bad in ({"x": {"$bogus": 1}}, {"$or": [{}]}, {"x": {"y": 1}}, {"x y": 1}):
        with pytest.raises(APIStatusError) as refused:
            served.client.http.post(
                "/store/items/search", json={"namespace_prefix": ["a"], "filter": bad}
            )
        assert refused.value.status_code == 422, bad
        said = refused.value.response.json()
        assert said["error"] == "invalid_filter", said
    assert keys(store.search_items(["a"], filter={"x": {"$eq": 1}})["items"]) == ["k"]
    store.delete_item(["a"], key="k")

    # A reader reads; only a writer writes.
    store.put_item(["team"], key="k", value={"v": 1})
    reader = get_sync_client(url=served.url, api_key=READER)
    try:
        assert reader.store.get_item(["team"], key="k")["value"] == {"v": 1}
        assert keys(reader.store.search_items(["team"])["items"]) == ["k"]
        with pytest.raises(PermissionDeniedError):
            reader.store.put_item(["team"], key="k", value={"v": 2})
        with pytest.raises(PermissionDeniedError):
            reader.store.delete_item(["team"], key="k")
    finally:
        reader.http.client.close()
    assert store.get_item(["team"], key="k")["value"] == {"v": 1}
    anonymous = get_sync_client(url=served.url, api_key=None)
    try:
        with pytest.raises(APIStatusError) as refused:
            anonymous.store.get_item(["team"], key="k")
        assert refused.value.status_code == 401
    finally:
        anonymous.http.client.close()


def test_nodes_use_the_same_store(served: Served) -> None:
    store = served.client.store
    store.put_item(["profiles", "ada"], key="profile", value={"name": "Ada Lovelace"})
    thread = str(uuid.uuid4())
    run = served.app.submit(
        "remembering", {"user": "ada", "note": "likes engines"}, thread_id=thread
    )
    drain(served.app)
    done = served.app.get_run(run.run_id).run
    assert done["status"] == "completed", done.get("error")
    # What the node read through get_store() is what the client put.
    assert served.app.get_state(thread).values["seen"] == "Ada Lovelace"
    # What the node put through its `store` parameter, the client reads.
    item = store.get_item(["memories", "ada"], key="last")
    assert item["value"] == {"note": "likes engines", "by": "node"}
    assert ["memories", "ada"] in store.list_namespaces(prefix=["memories"])["namespaces"]
