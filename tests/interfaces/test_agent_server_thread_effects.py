"""The Agent Server's DELETE of a run and of a thread, and a thread's `key=` effects, driven
through langgraph-sdk against a real uvicorn server on 127.0.0.1, on both backends.

Deleting a finished run keeps the record of a call its thread's runs share (`key=` on a
thread): the thread's next run that asks for the same order is served it, and the provider,
which counts what the outside world saw, is charged once. Deleting the thread (one by one or
`threads.prune`) ends the thread's scope and takes the record along. Runs execute in a worker in
this process (`drain`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from fastapi import FastAPI
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient

import keel
from keel.service.agent_server import agent_server_router
from keel.service.auth import Authenticator, load_tokens
from keel.service.errors import install
from tests.support.apps.service import LiveServer
from tests.support.providers import Provider
from tests.support.service_client import ADMIN, TOKENS
from tests.support.thread_effects import ledger, runs_left, shop
from tests.support.workers import drain

ORDER = {"order_id": "o-17", "amount": 40}


@dataclass
class Shop:
    app: keel.App
    client: SyncLangGraphClient
    charges: Provider
    mails: Provider


@pytest.fixture
def served(make_app: Callable[..., keel.App]) -> Iterator[Shop]:
    charges, mails = Provider(), Provider()
    app = make_app()
    app.workflow("shop")(shop(charges, mails))
    api = FastAPI()
    install(api)
    api.include_router(agent_server_router(app, Authenticator(load_tokens(TOKENS))))
    with LiveServer(api) as live:
        yield Shop(app, get_sync_client(url=live.url, api_key=ADMIN), charges, mails)


def ordered(served: Shop, thread_id: str) -> str:
    """One order on the thread, run to its end; its run id."""
    client = served.client
    run = client.runs.create(thread_id, "shop", input=ORDER)
    drain(served.app)
    assert client.runs.join(thread_id, run["run_id"])["charges"]
    assert client.runs.get(thread_id, run["run_id"])["status"] == "success"
    return str(run["run_id"])


@pytest.mark.parametrize("ending", ["delete", "prune"])
def test_deleting_a_run_keeps_its_threads_key_effects_and_the_thread_takes_them(
    served: Shop, db_url: str, ending: str
) -> None:
    client = served.client
    thread = str(client.threads.create()["thread_id"])
    first = ordered(served, thread)
    [kept] = [k for k, row in ledger(db_url).items() if row == ("charge", first)]
    client.runs.delete(thread, first)
    assert runs_left(db_url, [first]) == []
    assert client.runs.list(thread) == []

    second = ordered(served, thread)
    assert served.charges.deliveries == [kept]  # the second run was served the record
    assert len(served.mails.deliveries) == 2  # a receipt is every turn's (no `key=`)
    assert client.threads.get_state(thread)["values"]["charges"] == ["p-1", "p-1"]
    assert ledger(db_url)[kept] == ("charge", first)

    if ending == "delete":
        client.threads.delete(thread)
    else:
        assert client.threads.prune([thread]) == {"pruned_count": 1}
    assert sorted(ledger(db_url).values()) == [("receipt", second)]
