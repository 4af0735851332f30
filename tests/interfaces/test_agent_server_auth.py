"""The `auth` section of langgraph.json on the Agent Server routes, driven through langgraph-sdk
against a real server on 127.0.0.1, on both backends.

The project's auth.py authenticates three users by bearer token and, as LangGraph's docs teach,
stamps an owner on what a user creates and filters everything else by it; carol is refused
every operation. Two users must not see each other's threads, runs, states or store items.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient
from langgraph_sdk.errors import (
    AuthenticationError,
    PermissionDeniedError,
    UnprocessableEntityError,
)

import keel
from keel.runtime.project import ProjectError, load_project
from keel.service.agent_server import agent_server_router
from keel.service.auth import Authenticator, load_tokens
from keel.service.errors import install
from tests.interfaces.test_agent_server_threads import contents, live_worker, say
from tests.support.apps.service import LiveServer
from tests.support.service_client import ADMIN, TOKENS

ALICE, BOB, CAROL = "tok-alice", "tok-bob", "tok-carol"

AUTH_PY = """
from langgraph_sdk import Auth

auth = Auth()
USERS = {"tok-alice": "alice", "tok-bob": "bob", "tok-carol": "carol"}
SEEN = []


@auth.authenticate
async def authenticate(authorization: str | None, method: str, path: str) -> dict:
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or token not in USERS:
        raise Auth.exceptions.HTTPException(status_code=401, detail="who are you?")
    return {"identity": USERS[token], "permissions": ["threads:write"]}


@auth.on
async def owners_only(ctx: Auth.types.AuthContext, value: dict) -> object:
    SEEN.append((ctx.user.identity, ctx.resource, ctx.action))
    if ctx.user.identity == "carol":
        return False
    if ctx.action in ("create", "create_run"):
        value.setdefault("metadata", {})["owner"] = ctx.user.identity
    return {"owner": ctx.user.identity}


@auth.on.assistants
async def assistants_for_all(ctx: Auth.types.AuthContext, value: dict) -> bool:
    return ctx.user.identity != "carol"


@auth.on.store
async def own_namespace(ctx: Auth.types.AuthContext, value: dict) -> None:
    value["namespace"] = (ctx.user.identity, *(value.get("namespace") or ()))
    if ctx.user.identity == "carol" and ctx.action == "search":
        # A handler's mistake: an operator the store cannot run.
        value["filter"] = {**(value.get("filter") or {}), "team": {"$in": ["a", "b"]}}
"""


class Served:
    def __init__(self, app: keel.App, url: str, root: Path) -> None:
        self.app = app
        self.url = url
        self.root = root
        self.opened: list[SyncLangGraphClient] = []

    def as_(self, token: str | None) -> SyncLangGraphClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client = get_sync_client(url=self.url, api_key=None, headers=headers)
        self.opened.append(client)
        return client


def write_project(root: Path) -> Path:
    (root / "auth.py").write_text(textwrap.dedent(AUTH_PY))
    config = {
        "graphs": {"chat": "tests.support.thread_graphs:chat"},
        "auth": {"path": "./auth.py:auth"},
    }
    (root / "langgraph.json").write_text(json.dumps(config))
    return root / "langgraph.json"


@pytest.fixture
def served(tmp_path: Path, db_url: str) -> Iterator[Served]:
    app = load_project(write_project(tmp_path), url=db_url)
    api = FastAPI()
    install(api)
    api.include_router(agent_server_router(app, Authenticator(load_tokens(TOKENS))))
    try:
        with LiveServer(api) as server:
            here = Served(app, server.url, tmp_path)
            yield here
            for client in here.opened:
                client.http.client.close()
    finally:
        app.close()


def test_two_users_see_only_their_own_threads_and_runs(served: Served) -> None:
    alice, bob = served.as_(ALICE), served.as_(BOB)
    mine = alice.threads.create(metadata={"topic": "a"})
    theirs = bob.threads.create(metadata={"topic": "b"})
    # The create handler stamped the owner; a caller cannot choose another one.
    assert mine["metadata"] == {"topic": "a", "owner": "alice"}
    forged = bob.threads.create(metadata={"owner": "alice"})
    assert (forged["metadata"] or {})["owner"] == "bob"
    with live_worker(served.app):
        done = alice.runs.wait(mine["thread_id"], "chat", input=say("hi"))
        assert isinstance(done, dict) and contents(done) == ["hi", "echo: hi"]
        bob.runs.wait(theirs["thread_id"], "chat", input=say("yo"))
        # A run's own new thread carries the owner its create_run handler stamped.
        stateless = alice.runs.create(None, "chat", input=say("one-off"), on_completion="keep")
        alice.runs.join(stateless["thread_id"], stateless["run_id"])
    run_id = alice.runs.list(mine["thread_id"])[0]["run_id"]

    found = alice.threads.search(limit=100)
    assert sorted(t["thread_id"] for t in found) == sorted(
        [mine["thread_id"], stateless["thread_id"]]
    )
    assert all((t["metadata"] or {})["owner"] == "alice" for t in found)
    assert {t["thread_id"] for t in bob.threads.search(limit=100)} == {
        theirs["thread_id"],
        forged["thread_id"],
    }
    assert alice.threads.count() == 2 and bob.threads.count() == 2
    # Asking for another owner's threads finds none, rather than being overridden.
    assert bob.threads.search(metadata={"owner": "alice"}) == []
    assert bob.threads.search(ids=[mine["thread_id"]]) == []
    values = alice.threads.get_state(mine["thread_id"])["values"]
    assert isinstance(values, dict) and values["turns"] == 1

    tid = mine["thread_id"]
    refused = [
        lambda: bob.threads.get(tid),
        lambda: bob.threads.get_state(tid),
        lambda: bob.threads.get_history(tid),
        lambda: bob.threads.update(tid, metadata={"owner": "bob"}),
        lambda: bob.threads.delete(tid),
        lambda: bob.threads.copy(tid),
        lambda: bob.runs.list(tid),
        lambda: bob.runs.get(tid, run_id),
        lambda: bob.runs.join(tid, run_id),
        lambda: list(bob.runs.join_stream(tid, run_id)),
        lambda: bob.runs.create(tid, "chat", input=say("let me in")),
        lambda: bob.runs.cancel(tid, run_id),
    ]
    for attempt in refused:
        # The SDK maps most answers to NotFoundError; `join` leaves httpx's error as it is.
        with pytest.raises(httpx.HTTPStatusError) as caught:
            attempt()
        assert caught.value.response.status_code == 404
    # Nothing bob tried changed alice's thread.
    assert (alice.threads.get(tid)["metadata"] or {})["owner"] == "alice"
    assert len(alice.runs.list(tid)) == 1
    assert served.app.get_state(tid).values["turns"] == 1


def test_unauthenticated_is_401_and_a_refusing_handler_is_403(served: Served) -> None:
    for token in (None, "tok-nobody", ADMIN):  # Keel's own tokens do not pass the project's auth
        client = served.as_(token)
        with pytest.raises(AuthenticationError) as caught:
            client.threads.search()
        assert caught.value.response.json()["message"] == "who are you?"
    carol = served.as_(CAROL)
    with pytest.raises(PermissionDeniedError):
        carol.threads.search()
    with pytest.raises(PermissionDeniedError):
        carol.threads.create()
    with pytest.raises(PermissionDeniedError):
        carol.assistants.search()
    assert served.app.search_threads() == []
    auth_py = str(served.root / "auth.py")
    module = next(m for m in list(sys.modules.values()) if getattr(m, "__file__", "") == auth_py)
    seen = module.SEEN
    assert ("carol", "threads", "create") in seen and ("carol", "threads", "search") in seen


def test_store_items_are_scoped_to_their_user(served: Served) -> None:
    alice, bob = served.as_(ALICE), served.as_(BOB)
    alice.store.put_item(["notes"], "k", {"text": "alice's"})
    bob.store.put_item(["notes"], "k", {"text": "bob's"})
    got = alice.store.get_item(["notes"], "k")
    assert got is not None and got["value"] == {"text": "alice's"}
    assert got["namespace"] == ["alice", "notes"]
    assert [i["value"] for i in bob.store.search_items(["notes"])["items"]] == [{"text": "bob's"}]
    assert bob.store.list_namespaces()["namespaces"] == [["bob", "notes"]]
    bob.store.delete_item(["notes"], "k")
    assert bob.store.get_item(["notes"], "k") is None
    # A filter the handler added is checked as a client's is: 422 naming it, not a 500.
    with pytest.raises(UnprocessableEntityError) as refused:
        served.as_(CAROL).store.search_items(["notes"])
    assert "'$in' is not an operator" in refused.value.body["message"]  # type: ignore[index]
    after = alice.store.get_item(["notes"], "k")
    assert after is not None and after["value"] == {"text": "alice's"}


def test_crons_are_stamped_and_filtered_by_their_owner(served: Served) -> None:
    alice, bob = served.as_(ALICE), served.as_(BOB)
    yearly = "0 0 1 1 *"
    mine = alice.crons.create("chat", schedule=yearly, input=say("hi"), metadata={"topic": "a"})
    # The create handler stamped the owner, over what the caller sent.
    forged = bob.crons.create("chat", schedule=yearly, input=say("yo"), metadata={"owner": "alice"})
    assert [c["metadata"] for c in (mine, forged)] == [
        {"topic": "a", "owner": "alice"},
        {"owner": "bob"},
    ]
    theirs_thread = bob.threads.create()["thread_id"]
    with pytest.raises(httpx.HTTPStatusError) as hidden:
        alice.crons.create_for_thread(theirs_thread, "chat", schedule=yearly, input=say("x"))
    assert hidden.value.response.status_code == 404
    assert [c["cron_id"] for c in alice.crons.search()] == [mine["cron_id"]]
    assert [c["cron_id"] for c in bob.crons.search()] == [forged["cron_id"]]
    assert (alice.crons.count(), bob.crons.count()) == (1, 1)
    for attempt in (
        lambda: bob.crons.delete(mine["cron_id"]),
        lambda: bob.crons.update(mine["cron_id"], schedule="0 0 2 1 *"),
    ):
        with pytest.raises(httpx.HTTPStatusError) as caught:
            attempt()
        assert caught.value.response.status_code == 404
    # Nothing bob tried changed alice's cron; she changes and deletes it herself.
    (kept,) = alice.crons.search()
    assert kept["schedule"] == yearly
    assert alice.crons.update(mine["cron_id"], schedule="0 0 2 1 *")["schedule"] == "0 0 2 1 *"
    alice.crons.delete(mine["cron_id"])
    assert alice.crons.search() == [] and len(bob.crons.search()) == 1
    with pytest.raises(PermissionDeniedError):
        served.as_(CAROL).crons.search()


def test_an_auth_path_naming_something_else_is_refused(tmp_path: Path) -> None:
    write_project(tmp_path)
    (tmp_path / "auth.py").write_text("auth = 42\n")
    app = load_project(tmp_path, url=f"sqlite:///{tmp_path}/k.db")
    try:
        with pytest.raises(ProjectError, match=r"not a langgraph_sdk\.Auth"):
            agent_server_router(app, Authenticator({}))
    finally:
        app.close()
