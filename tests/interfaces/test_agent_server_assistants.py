"""The Agent Server's assistants of one's own (create, update as versions, set latest, delete,
search and count) and runs started with them, and static interrupts (`interrupt_before`,
`interrupt_after`) on run create, on both backends, driven only through langgraph-sdk against a
real uvicorn server on 127.0.0.1 and a real worker in this process.

The shapes are what `langgraph dev` (langgraph-api 0.16.7) answered to the same requests: its
key sets (`ORACLE_*`), its statuses, and its values where no id or timestamp is in them (an
assistant's context mirrored into its `configurable`, metadata merged by an update, a run's
config and context merged over its assistant's, a statically paused thread's `next`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_config
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import get_runtime
from langgraph_sdk import get_sync_client
from langgraph_sdk.errors import BadRequestError, ConflictError, NotFoundError
from typing_extensions import TypedDict

import keel
from keel.runtime.project import load_project
from keel.runtime.snapshot_json import jsonable
from keel.service.agent_server import agent_server_router
from keel.service.agent_server.shapes import assistant_id_of
from keel.service.auth import Authenticator, load_tokens
from keel.service.errors import install
from tests.interfaces.test_agent_server_runs import Served, data_parts, live_worker, three_steps
from tests.support.apps.service import LiveServer
from tests.support.service_client import ADMIN, TOKENS

ORACLE_ASSISTANT = {
    "assistant_id",
    "graph_id",
    "config",
    "context",
    "metadata",
    "name",
    "created_at",
    "updated_at",
    "version",
    "description",
}
ORACLE_VERSION = ORACLE_ASSISTANT - {"updated_at"}


class Seen(TypedDict, total=False):
    conf: dict[str, Any]
    context: Any
    tags: list[str]


def seeing() -> StateGraph:
    """One node that keeps what its run was configured with."""

    def look(state: Seen) -> dict[str, Any]:
        config = get_config()
        shown = {k: v for k, v in config["configurable"].items() if k in ("k", "z", "c", "d")}
        return {
            "conf": shown,
            "context": get_runtime().context,
            "tags": list(config.get("tags") or []),
        }

    g = StateGraph(Seen)
    g.add_node("look", look)
    g.add_edge(START, "look")
    g.add_edge("look", END)
    return g


@pytest.fixture
def served(make_app: Callable[..., keel.App]) -> Iterator[Served]:
    app = make_app(lease_ttl=5)
    app.workflow("steps")(three_steps)
    app.workflow("seeing")(seeing)
    api = FastAPI()
    install(api)
    api.include_router(agent_server_router(app, Authenticator(load_tokens(TOKENS))))
    with LiveServer(api) as live:
        yield Served(app, live.url, get_sync_client(url=live.url, api_key=ADMIN))


@pytest.fixture
def svc(served: Served) -> Iterator[Served]:
    with live_worker(served.app):
        yield served


def test_an_assistant_is_created_updated_versioned_and_deleted(served: Served) -> None:
    c = served.client
    made = c.assistants.create(
        "seeing",
        config={"tags": ["t"]},
        context={"c": 1},
        metadata={"owner": "x"},
        name="mine",
        description="d",
    )
    assert set(made) == ORACLE_ASSISTANT
    aid = made["assistant_id"]
    assert (made["graph_id"], made["version"], made["name"], made["description"]) == (
        "seeing",
        1,
        "mine",
        "d",
    )
    # As langgraph dev keeps it: the context is also the config's `configurable`.
    assert made["config"] == {"tags": ["t"], "configurable": {"c": 1}}
    assert (made["context"], made["metadata"]) == ({"c": 1}, {"owner": "x"})
    assert c.assistants.get(aid) == made

    with pytest.raises(ConflictError):
        c.assistants.create("seeing", assistant_id=aid)
    again = c.assistants.create("seeing", assistant_id=aid, if_exists="do_nothing", name="other")
    assert again == made
    with pytest.raises(NotFoundError):
        c.assistants.create("no-such-graph")
    with pytest.raises(BadRequestError):
        c.assistants.create("seeing", config={"configurable": {"k": 1}}, context={"c": 1})

    second = c.assistants.update(aid, metadata={"m2": 2}, name="renamed")
    assert (second["version"], second["name"]) == (2, "renamed")
    assert second["metadata"] == {"owner": "x", "m2": 2}  # merged, as langgraph dev does
    assert second["config"] == made["config"] and second["created_at"] == made["created_at"]
    third = c.assistants.update(aid, context={"c": 2})
    assert (third["version"], third["context"]) == (3, {"c": 2})
    assert third["config"] == {"configurable": {"c": 2}}

    versions = c.assistants.get_versions(aid)
    assert [v["version"] for v in versions] == [3, 2, 1]
    assert all(set(v) == ORACLE_VERSION for v in versions)
    assert [v["name"] for v in versions] == ["renamed", "renamed", "mine"]
    assert [v["version"] for v in c.assistants.get_versions(aid, limit=1, offset=1)] == [2]
    assert [v["version"] for v in c.assistants.get_versions(aid, metadata={"m2": 2})] == [3, 2]

    first = c.assistants.set_latest(aid, 1)
    assert (first["version"], first["name"], first["context"]) == (1, "mine", {"c": 1})
    assert first["metadata"] == {"owner": "x"} and c.assistants.get(aid) == first
    with pytest.raises(NotFoundError):
        c.assistants.set_latest(aid, 9)
    # An update after going back is still a new version, the latest of all.
    assert c.assistants.update(aid, description="e")["version"] == 4

    c.assistants.delete(aid)
    with pytest.raises(NotFoundError):
        c.assistants.get(aid)
    with pytest.raises(NotFoundError):
        c.assistants.delete(aid)
    with pytest.raises(NotFoundError):
        c.assistants.get_versions(aid)


def test_search_and_count_see_defaults_and_assistants_of_ones_own(served: Served) -> None:
    c = served.client
    default_steps = assistant_id_of("steps")
    a = c.assistants.create("seeing", metadata={"team": "a"}, name="Alpha")
    b = c.assistants.create("seeing", metadata={"team": "b"}, name="Beta")
    s = c.assistants.create("steps", metadata={"team": "a"}, name="Steps two")
    assert c.assistants.count() == 5
    assert c.assistants.count(graph_id="seeing") == 3
    assert c.assistants.count(metadata={"team": "a"}) == 2
    by_graph = c.assistants.search(graph_id="seeing", limit=10)
    # Newest first, as langgraph dev lists them; the defaults (made at start) last.
    assert [x["assistant_id"] for x in by_graph] == [
        b["assistant_id"],
        a["assistant_id"],
        assistant_id_of("seeing"),
    ]
    assert [x["assistant_id"] for x in c.assistants.search(name="two")] == [s["assistant_id"]]
    assert [x["name"] for x in c.assistants.search(metadata={"team": "a"}, graph_id="steps")] == [
        "Steps two"
    ]
    page = c.assistants.search(limit=2, offset=0, response_format="object")
    assert len(page["assistants"]) == 2 and page["next"] == "2"

    # A default assistant can be updated (it is stored from then on), not deleted.
    updated = c.assistants.update(default_steps, metadata={"tuned": True}, name="steps v2")
    assert (updated["version"], updated["name"]) == (2, "steps v2")
    assert updated["metadata"]["created_by"] == "system" and updated["metadata"]["tuned"] is True
    assert c.assistants.get("steps") == updated  # the graph id still names it
    assert [v["version"] for v in c.assistants.get_versions("steps")] == [2, 1]
    assert c.assistants.count() == 5
    with pytest.raises(ConflictError) as refused:
        c.assistants.delete(default_steps)
    assert refused.value.body["error"] == "assistant_is_default"  # type: ignore[index]
    assert c.assistants.set_latest("steps", 1)["name"] == "steps"


def test_a_run_applies_its_assistants_config_and_context(svc: Served) -> None:
    c = svc.client
    made = c.assistants.create("seeing", config={"tags": ["t"]}, context={"c": 1, "d": 1})
    aid = made["assistant_id"]
    thread = c.threads.create()["thread_id"]
    final = c.runs.wait(thread, aid, input={}, context={"d": 2}, metadata={"who": "me"})
    assert final["context"] == {"c": 1, "d": 2}  # the run's own over the assistant's
    assert final["tags"] == ["t"] and final["conf"]["c"] == 1
    run = c.runs.list(thread)[0]
    assert run["assistant_id"] == aid and run["status"] == "success"
    assert run["metadata"]["assistant_id"] == aid and run["metadata"]["who"] == "me"
    assert run["kwargs"]["context"] == {"c": 1, "d": 2}
    shown = c.threads.get(thread)
    assert shown["metadata"]["assistant_id"] == aid and shown["metadata"]["graph_id"] == "seeing"
    assert [t["thread_id"] for t in c.threads.search(metadata={"assistant_id": aid})] == [thread]

    # A run's config over the assistant's (a later version's, once it is updated).
    c.assistants.update(aid, config={"configurable": {"k": 1}, "tags": ["u"]})
    final = c.runs.wait(thread, aid, input={}, config={"configurable": {"z": 3}})
    # (The assistant's context reads as configurable keys too, as on LangGraph's server.)
    assert final["conf"] == {"c": 1, "d": 1, "k": 1, "z": 3} and final["tags"] == ["u"]

    c.assistants.delete(aid, delete_threads=True)
    with pytest.raises(NotFoundError):
        c.threads.get(thread)
    with pytest.raises(NotFoundError):
        c.runs.create(None, aid, input={})


def test_interrupt_before_pauses_the_run_and_a_run_without_input_goes_on(svc: Served) -> None:
    c = svc.client
    thread = c.threads.create()["thread_id"]
    run = c.runs.create(thread, "steps", input={"log": []}, interrupt_before=["last"])
    assert run["kwargs"]["interrupt_before"] == ["last"]
    assert c.runs.join(thread, run["run_id"]) == {"log": ["first"], "n": 1}
    # As langgraph dev: the run succeeded, its thread is interrupted with `next` set, and no
    # interrupt is listed.
    assert c.runs.get(thread, run["run_id"])["status"] == "success"
    shown = c.threads.get(thread)
    assert (shown["status"], shown["interrupts"]) == ("interrupted", {})
    state = c.threads.get_state(thread)
    assert (state["next"], state["interrupts"]) == (["last"], [])
    assert [t["name"] for t in state["tasks"]] == ["last"]

    final = c.runs.wait(thread, "steps", input=None)
    assert final == {"log": ["first", "last"], "n": 1}
    assert c.threads.get(thread)["status"] == "idle"
    assert c.threads.get_state(thread)["next"] == []


@pytest.mark.parametrize("pause", [{"interrupt_before": ["last"]}, {"interrupt_after": ["first"]}])
def test_going_on_from_a_breakpoint_streams_from_there_as_in_langgraph(
    svc: Served, pause: dict[str, list[str]]
) -> None:
    """The stream of a run without input on a thread paused at a breakpoint: it started over
    from the run's first event (its input's values, the steps before the pause again)."""
    c = svc.client
    modes = ["values", "updates"]
    thread = c.threads.create()["thread_id"]
    first = list(c.runs.stream(thread, "steps", input={"log": []}, stream_mode=modes, **pause))
    going_on = list(c.runs.stream(thread, "steps", input=None, stream_mode=modes))
    graph = three_steps().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    expected = [
        [
            (m, jsonable(p))
            for m, p in graph.stream(given, config, stream_mode=modes, **options)
            if p != {"__interrupt__": ()}  # not sent by Keel (docs/agent-server.md)
        ]
        for given, options in [({"log": []}, pause), (None, {})]
    ]
    assert [data_parts(first), data_parts(going_on)] == expected
    assert not {p.id for p in first} & {p.id for p in going_on}


def test_interrupt_after_pauses_and_a_resume_goes_on(svc: Served) -> None:
    c = svc.client
    thread = c.threads.create()["thread_id"]
    paused = c.runs.wait(thread, "steps", input={"log": []}, interrupt_after="*")
    assert paused == {"log": ["first"], "n": 1}
    assert c.threads.get(thread)["status"] == "interrupted"
    assert c.threads.get_state(thread)["next"] == ["quiet"]
    # Each boundary pauses again (`*`: after every node); each resume goes one step on.
    c.runs.wait(thread, "steps", command={"resume": "go"})
    assert c.threads.get_state(thread)["next"] == ["last"]
    final = c.runs.wait(thread, "steps", command={"resume": "go"})
    assert final == {"log": ["first", "last"], "n": 1}
    assert c.threads.get(thread)["status"] == "idle"


# -- the auth of langgraph.json on assistants -----------------------------------------------

OWNERS_AUTH_PY = """
from langgraph_sdk import Auth

auth = Auth()
USERS = {"tok-alice": "alice", "tok-bob": "bob"}


@auth.authenticate
async def authenticate(authorization: str | None) -> dict:
    scheme, _, token = (authorization or "").partition(" ")
    if token not in USERS:
        raise Auth.exceptions.HTTPException(status_code=401, detail="who are you?")
    return {"identity": USERS[token]}


@auth.on.assistants
async def own_assistants(ctx: Auth.types.AuthContext, value: dict) -> object:
    if ctx.action == "create":
        value.setdefault("metadata", {})["owner"] = ctx.user.identity
    return {"owner": ctx.user.identity}
"""


@pytest.fixture
def owners(tmp_path: Path, db_url: str) -> Iterator[tuple[str, keel.App]]:
    (tmp_path / "auth.py").write_text(OWNERS_AUTH_PY)
    config = {
        "graphs": {"chat": "tests.support.thread_graphs:chat"},
        "auth": {"path": "./auth.py:auth"},
    }
    (tmp_path / "langgraph.json").write_text(json.dumps(config))
    app = load_project(tmp_path / "langgraph.json", url=db_url)
    api = FastAPI()
    install(api)
    api.include_router(agent_server_router(app, Authenticator(load_tokens(TOKENS))))
    try:
        with LiveServer(api) as live:
            yield live.url, app
    finally:
        app.close()


def test_the_auth_handler_stamps_and_filters_assistants(owners: tuple[str, keel.App]) -> None:
    url, _app = owners
    alice = get_sync_client(url=url, api_key=None, headers={"Authorization": "Bearer tok-alice"})
    bob = get_sync_client(url=url, api_key=None, headers={"Authorization": "Bearer tok-bob"})
    mine = alice.assistants.create("chat", name="mine", metadata={"owner": "bob"})
    assert mine["metadata"] == {"owner": "alice"}  # stamped: a caller cannot choose another
    theirs = bob.assistants.create("chat", name="theirs")
    # Each sees only their own (the defaults have no owner: nobody sees them here).
    assert [a["name"] for a in alice.assistants.search()] == ["mine"]
    assert [a["name"] for a in bob.assistants.search()] == ["theirs"]
    assert alice.assistants.count() == bob.assistants.count() == 1
    aid = mine["assistant_id"]
    for call in (
        lambda: bob.assistants.get(aid),
        lambda: bob.assistants.get_versions(aid),
        lambda: bob.assistants.update(aid, name="taken"),
        lambda: bob.assistants.set_latest(aid, 1),
        lambda: bob.assistants.delete(aid),
    ):
        with pytest.raises(NotFoundError):
            call()
    assert alice.assistants.get(aid) == mine  # nothing bob tried changed it
    assert alice.assistants.update(aid, name="still mine")["version"] == 2
    alice.assistants.delete(aid)
    assert bob.assistants.get(theirs["assistant_id"])["name"] == "theirs"
    for client in (alice, bob):
        client.http.client.close()
