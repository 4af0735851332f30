"""Metadata searches (threads, assistants and their versions) are JSON containment as
PostgreSQL's `@>` decides it, with the same answers on SQLite: there the queries call
`keel_json_contains`, which is keel.core.codec.json_contains, compared here with `@>` itself
on values drawn to tell them apart (`true` and `1`, `2` and `2.0`, a missing key and `null`,
objects in another key order, arrays holding a part of another)."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keel
from keel.core.codec import json_contains
from keel.core.store.store import Store
from tests.support.by_hand import WORKFLOW, one_node

AppFactory = Callable[..., keel.App]
T = TypeVar("T")

THREADS: dict[str, dict[str, Any]] = {
    "t-ann": {
        "user": "ann",
        "vip": 1,
        "tier": 2,
        "obj": {"b": 1, "a": 2},
        "tags": ["new", "vip"],
        "owner": None,
        'say "hi"': 1,
    },
    "t-bob": {"user": "bob", "vip": True, "tier": 2.0, "tags": ["old"]},
    "t-cy": {"user": "cy", "tier": "2", "obj": {"a": 2}},
}
SEARCHES: list[tuple[dict[str, Any], set[str]]] = [
    ({}, {"t-ann", "t-bob", "t-cy"}),
    ({"vip": True}, {"t-bob"}),  # true is not 1
    ({"vip": 1}, {"t-ann"}),
    ({"owner": None}, {"t-ann"}),  # a present null, not a missing key
    ({"nobody": None}, set()),
    ({"tier": 2}, {"t-ann", "t-bob"}),  # 2 is 2.0 ...
    ({"tier": "2"}, {"t-cy"}),  # ... but not "2"
    ({"obj": {"a": 2, "b": 1}}, {"t-ann"}),  # the keys in another order
    ({"obj": {"a": 2}}, {"t-ann", "t-cy"}),  # a part of an object
    ({"obj": {"a": 2, "c": None}}, set()),
    ({"tags": ["vip"]}, {"t-ann"}),  # a part of an array
    ({"tags": []}, {"t-ann", "t-bob"}),
    ({"tags": "vip"}, set()),  # an array does not contain a scalar below the top
    ({"user": "ann", "vip": True}, set()),
    ({'say "hi"': 1}, {"t-ann"}),
]


def test_thread_search_is_json_containment(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow(WORKFLOW)(one_node)
    app.migrate()
    for thread_id, metadata in THREADS.items():
        app.create_thread(WORKFLOW, thread_id=thread_id, metadata=metadata)
    for wanted, expected in SEARCHES:
        found = {t["thread_id"] for t in app.search_threads(metadata=wanted, limit=100)}
        assert found == expected, wanted


def on_store(app: keel.App, work: Callable[[Store], Coroutine[Any, Any, T]]) -> T:
    async def go() -> T:
        await app.aio.open()
        return await work(app.aio.runtime.store)

    return app.aio.runtime.portal.call(go())


def test_assistant_searches_are_json_containment(make_app: AppFactory) -> None:
    app = make_app()
    app.migrate()
    for assistant_id, metadata in (("a-ann", THREADS["t-ann"]), ("a-bob", THREADS["t-bob"])):
        on_store(
            app,
            lambda store, a=assistant_id, m=metadata: store.create_assistant(
                a,
                graph_id="g",
                name=a,
                description=None,
                config="{}",
                context="{}",
                metadata=json.dumps(m),
            ),
        )
    for wanted, expected in SEARCHES:
        rows = on_store(
            app, lambda store, w=wanted: store.search_assistants(graph_id="g", metadata=w)
        )
        assert {r["assistant_id"] for r in rows} == {
            t.replace("t-", "a-") for t in expected if t != "t-cy"
        }, wanted
        versions = on_store(
            app,
            lambda store, w=wanted: store.assistant_versions(
                "a-ann", metadata=w, limit=10, offset=0
            ),
        )
        assert len(versions) == int("t-ann" in expected), wanted


# -- the rule against PostgreSQL's `@>` ------------------------------------------------------

# Few distinct keys and values, so that filters often hit, miss by a little, or mistake one
# JSON type for another.
keys = st.sampled_from(["a", "b", "c", 'q"k', "é"])
scalars = (
    st.none()
    | st.booleans()
    | st.sampled_from([0, 1, 2, -1, 10**20])
    | st.sampled_from([0.0, 1.0, 2.0, 1.5, -0.5, 1e20])
    | st.sampled_from(["", "a", "1", "true", "null", "é"])
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)
documents = st.dictionaries(keys, values, max_size=5)


@st.composite
def part_of(draw: st.DrawFn, value: Any) -> Any:
    """A value `value` may well contain: some of its keys or elements, each a part of its own,
    now and then a scalar swapped for another."""
    if isinstance(value, dict):
        kept = draw(st.lists(st.sampled_from(sorted(value)), unique=True)) if value else []
        return {k: draw(part_of(value[k])) for k in reversed(kept)}
    if isinstance(value, list):
        if not value:
            return []
        picked = draw(st.lists(st.sampled_from(range(len(value))), max_size=len(value) + 1))
        return [draw(part_of(value[i])) for i in picked]
    return draw(st.just(value) | st.just(value) | scalars)


@st.composite
def document_and_filter(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    document = draw(documents)
    wanted = draw(part_of(document) | documents)
    return document, wanted


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_sqlites_rule_decides_as_postgres_jsonb_containment(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:

        @settings(
            database=None,
            max_examples=400,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture],
        )
        @given(document_and_filter())
        def agree(case: tuple[dict[str, Any], dict[str, Any]]) -> None:
            document, wanted = (json.dumps(v) for v in case)
            [(postgres,)] = conn.execute("SELECT %s::jsonb @> %s::jsonb", (document, wanted))
            assert bool(json_contains(document, wanted)) is postgres, case

        agree()
