"""The outbox on the HTTP API: list the dead letters, retry one, resolve one; with scopes."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import pytest

import keel
from keel.service import create_app
from keel.testing.http import HttpSink
from tests.support.apps.service import LiveServer
from tests.support.outbox_flows import drain, enqueue, graph, serving, wait
from tests.support.service_client import ADMIN, READER, TOKENS, bearer


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[HttpSink]:
    with serving(monkeypatch) as sink:
        yield sink


def test_dead_letters_are_listed_retried_and_resolved_over_http(
    make_app: Callable[..., keel.App], provider: HttpSink
) -> None:
    app = make_app()
    app.workflow("mail", version="1")(graph(("enqueue", enqueue), ("wait", wait)))
    first = app.submit("mail", job_id="h-1", input={"to": "fa@example.com"}).run_id
    second = app.submit("mail", job_id="h-2", input={"to": "gu@example.com"}).run_id
    provider.refuse(503)
    drain(app)
    with (
        LiveServer(create_app(app, tokens=TOKENS)) as server,
        httpx.Client(base_url=server.url, headers=bearer(ADMIN), timeout=30) as http,
    ):
        dead = http.get("/v1/effects", params={"state": "dead"}).json()["items"]
        assert sorted(d["run_id"] for d in dead) == sorted([first, second])
        # The run's own page says the same of its intents.
        (shown,) = http.get(f"/v1/runs/{first}").json()["intents"]
        assert (shown["status"], shown["attempts"], shown["effect"]) == ("dead", 3, "rt_mail")
        assert "fa@example.com" in json.dumps(shown["args"]), shown  # decoded, not a string
        assert isinstance(shown["args"], dict | list), shown
        assert all(d["attempts"] == 3 and d["error"] for d in dead)
        assert http.get("/v1/effects", params={"state": "lost"}).status_code == 422
        reader = httpx.post(
            f"{server.url}/v1/effects/{dead[0]['intent_id']}/retry",
            headers=bearer(READER),
            timeout=30,
        )
        assert reader.status_code == 403
        provider.accept()
        by_run = {d["run_id"]: d["intent_id"] for d in dead}
        retried = http.post(f"/v1/effects/{by_run[first]}/retry", json={"by": "ops"})
        assert retried.status_code == 200 and retried.json()["status"] == "pending"
        again = http.post(f"/v1/effects/{by_run[first]}/retry")
        assert (again.status_code, again.json()["error"]) == (409, "wrong_state")
        # The second one a person knows reached the provider some other way: never resent.
        resolved = http.post(
            f"/v1/effects/{by_run[second]}/resolution",
            json={"performed": True, "result": {"manual": True}},
        )
        assert resolved.status_code == 200 and resolved.json()["status"] == "delivered"
        missing = http.post("/v1/effects/outbox:nope:0/retry")
        assert (missing.status_code, missing.json()["error"]) == (404, "intent_not_found")
    drain(app)
    assert app.get_run(first).status == "completed"
    assert app.get_run(second).output["result"] == {"manual": True}
    assert len(provider.deliveries) == 1  # only the retried one
    kinds = [e["kind"] for e in app.get_run(second).timeline]
    assert "outbox.resolved" in kinds
