"""Inbound webhooks on a real uvicorn, on both backends: every refusal answers a clear status
and admits no run; a replayed delivery id answers the same run; 50 identical deliveries at once
admit one run."""

from __future__ import annotations

import concurrent.futures
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import keel
from keel.core.webhooks import new_secret, signed_headers, stripe_header
from keel.service.api import create_app
from tests.support.graphs import echo_graph
from tests.support.slack_fake import uvicorn_server

SECRET = new_secret()
GITHUB_SECRET = "gh-secret-for-tests"
STRIPE_SECRET = "whsec_stripe_for_tests"
TOKEN = "hooks-uDeR5dRA6xRND-i2YDAU9oqX9TiuMYR_llVUKXGVjNA"


@pytest.fixture
def served(make_app: Callable[..., keel.App]) -> Iterator[tuple[keel.App, str]]:
    app = make_app()
    app.workflow("echo")(echo_graph)
    app.webhook(
        "orders",
        workflow="echo",
        secret=SECRET,
        max_bytes=4096,
        input=lambda p: {"text": p["text"]},
    )
    app.webhook(
        "gh",
        workflow="echo",
        verify="github",
        secret=GITHUB_SECRET,
        job_id="pr-{pull_request.number}",
        input=lambda p: {"text": p["action"]},
    )
    app.webhook(
        "pay",
        workflow="echo",
        verify="stripe",
        secret=STRIPE_SECRET,
        input=lambda p: {"text": p["id"]},
    )
    app.webhook(
        "mine",
        workflow="echo",
        verify=lambda headers, body: headers.get("x-token") == "let-me-in",
        input=lambda p: {"text": "custom"},
    )
    api = create_app(app, tokens={TOKEN: ["*"]}, max_body_bytes=1_000_000)
    with uvicorn_server(api) as url:
        yield app, url


def standard(
    url: str,
    body: bytes,
    delivery: str = "msg_1",
    *,
    ts: int | None = None,
    secret: str = SECRET,
    hook: str = "orders",
) -> httpx.Response:
    headers = signed_headers(secret, delivery, int(time.time()) if ts is None else ts, body)
    headers["content-type"] = "application/json"
    return httpx.post(f"{url}/hooks/{hook}", content=body, headers=headers, timeout=30)


def runs(app: keel.App) -> list[dict[str, Any]]:
    return app.list_runs(limit=1000)


def test_each_refusal_has_its_status_and_admits_nothing(served: tuple[keel.App, str]) -> None:
    app, url = served
    body = json.dumps({"text": "hi"}).encode()
    good = signed_headers(SECRET, "msg_1", int(time.time()), body)
    forged = {**good, "webhook-signature": "v1," + "A" * 43 + "="}
    refusals = [
        (httpx.post(f"{url}/hooks/orders", content=body, headers=forged), 401, "bad_signature"),
        (standard(url, body, secret=new_secret()), 401, "bad_signature"),
        (standard(url, body, ts=int(time.time()) - 3600), 401, "stale_timestamp"),
        (httpx.post(f"{url}/hooks/orders", content=body), 401, "missing_signature"),
        (standard(url, b'{"text": "hi"' + b" " * 5000 + b"}"), 413, "body_too_large"),
        (standard(url, b'{"text": '), 400, "malformed_json"),
        (standard(url, b"[" * 2000 + b"]" * 2000), 400, "malformed_json"),  # RecursionError
        (standard(url, body, hook="nobody"), 404, "unknown_hook"),
        (
            httpx.post(f"{url}/hooks/mine", content=body, headers={"x-token": "guess"}),
            401,
            "bad_signature",
        ),
    ]
    for answer, status, code in refusals:
        assert (answer.status_code, answer.json()["error"]) == (status, code), answer.text
        assert SECRET not in answer.text
    assert runs(app) == []
    scraped = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    counted = {
        line.split('reason="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in scraped.splitlines()
        if line.startswith("keel_webhook_refusals_total{")
    }
    assert counted == {
        "bad_signature": 3.0,
        "stale_timestamp": 1.0,
        "missing_signature": 1.0,
        "body_too_large": 1.0,
        "malformed_json": 2.0,
        "unknown_hook": 1.0,
    }


def test_a_replayed_delivery_answers_the_same_run(served: tuple[keel.App, str]) -> None:
    app, url = served
    first = standard(url, b'{"text": "one"}', "msg_a")
    assert first.status_code == 202 and first.json()["duplicate"] is False
    # The sender's retry: a new timestamp and signature, the same id, even another body.
    again = standard(url, b'{"text": "one", "retry": 1}', "msg_a")
    assert again.status_code == 200, again.text
    assert again.json()["run_id"] == first.json()["run_id"] and again.json()["duplicate"]
    other = standard(url, b'{"text": "two"}', "msg_b")
    assert other.status_code == 202 and other.json()["run_id"] != first.json()["run_id"]
    assert sorted(r["run_id"] for r in runs(app)) == sorted(
        [first.json()["run_id"], other.json()["run_id"]]
    )
    assert json.loads(app.get_run(first.json()["run_id"]).run["input"]) == {"text": "one"}


def test_a_delivery_its_workflow_refuses_is_not_remembered(
    served: tuple[keel.App, str], caplog: pytest.LogCaptureFixture
) -> None:
    """The hook maps the payload, and the workflow refuses the input's shape (a 400): the
    delivery is not remembered, so the sender's fixed delivery under the same id admits its
    run as a first delivery. A new delivery folded into its job's run says so in the log."""
    app, url = served
    refused = standard(url, b'{"text": 5}', "msg_fix")
    assert (refused.status_code, refused.json()["error"]) == (400, "bad_payload")
    assert runs(app) == []
    fixed = standard(url, b'{"text": "five"}', "msg_fix")
    assert fixed.status_code == 202, fixed.text
    assert fixed.json()["duplicate"] is False
    assert [r["run_id"] for r in runs(app)] == [fixed.json()["run_id"]]

    gh = {"x-github-delivery": "", "content-type": "application/json"}
    answers = []
    for delivery, action in (("gh-1", "opened"), ("gh-2", "synchronize")):
        body = json.dumps({"action": action, "pull_request": {"number": 7}}).encode()
        digest = hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
        headers = {**gh, "x-github-delivery": delivery, "x-hub-signature-256": f"sha256={digest}"}
        answers.append(httpx.post(f"{url}/hooks/gh", content=body, headers=headers).json())
    assert answers[0]["run_id"] == answers[1]["run_id"]
    folded = [r for r in caplog.records if getattr(r, "event", None) == "webhook.folded"]
    assert [r.getMessage() for r in folded] == [
        f"webhook gh: delivery gh-2 admitted no run: its job pr-7 already has run "
        f"{answers[0]['run_id']}"
    ]


def test_fifty_identical_deliveries_at_once_admit_one_run(served: tuple[keel.App, str]) -> None:
    app, url = served
    body = b'{"text": "storm"}'
    headers = signed_headers(SECRET, "msg_storm", int(time.time()), body)

    def send(_: int) -> httpx.Response:
        return httpx.post(f"{url}/hooks/orders", content=body, headers=headers, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(send, range(50)))
    # The database's unique insert picks the first; every other one is told it is a replay.
    statuses = [a.status_code for a in answers]
    assert statuses.count(202) == 1 and statuses.count(200) == 49
    assert len({a.json()["run_id"] for a in answers}) == 1
    assert len(runs(app)) == 1


def test_github_stripe_and_custom_verification(served: tuple[keel.App, str]) -> None:
    app, url = served
    body = json.dumps({"action": "opened", "pull_request": {"number": 42}}).encode()
    signature = "sha256=" + hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    gh = {
        "x-hub-signature-256": signature,
        "x-github-delivery": "72d3162e-cc78",
        "content-type": "application/json",
    }
    answer = httpx.post(f"{url}/hooks/gh", content=body, headers=gh)
    assert answer.status_code == 202 and answer.json()["job_id"] == "pr-42"
    assert httpx.post(f"{url}/hooks/gh", content=body, headers=gh).json()["duplicate"]
    wrong = {**gh, "x-hub-signature-256": "sha256=" + "0" * 64}
    assert httpx.post(f"{url}/hooks/gh", content=body, headers=wrong).status_code == 401

    event = json.dumps({"id": "evt_1", "type": "charge.succeeded"}).encode()
    stripe = {
        "stripe-signature": stripe_header(STRIPE_SECRET, int(time.time()), event),
        "content-type": "application/json",
    }
    paid = httpx.post(f"{url}/hooks/pay", content=event, headers=stripe)
    assert paid.status_code == 202 and paid.json()["delivery_id"] == "evt_1"
    stale = {"stripe-signature": stripe_header(STRIPE_SECRET, int(time.time()) - 900, event)}
    assert httpx.post(f"{url}/hooks/pay", content=event, headers=stale).json()["error"] == (
        "stale_timestamp"
    )

    mine = httpx.post(f"{url}/hooks/mine", content=b"{}", headers={"x-token": "let-me-in"})
    assert mine.status_code == 202
    assert len(runs(app)) == 3


def test_a_signed_body_the_hook_cannot_map_is_a_bad_payload(
    served: tuple[keel.App, str], make_app: Callable[..., keel.App]
) -> None:
    """A validly signed body that is JSON but not what the hook maps (a list, a string, an
    object without the field its `input=` reads, text with a lone surrogate or a NUL) is the
    sender's mistake: 400 `bad_payload`, no run, and the same delivery fixed later is admitted
    (nothing was remembered)."""
    app, url = served
    deep = b'{"text": "t", "more": ' + b"[" * 120 + b"]" * 120 + b"}"  # past what can be kept
    bodies = [b"[1, 2]", b'"text"', b"42", b"null", b'{"other": 1}', b'{"text": "\\ud800"}', deep]
    bodies.append(b'{"text": "a\\u0000b"}')  # a NUL, which PostgreSQL cannot store
    for n, body in enumerate(bodies):  # (a lone surrogate: JSON but not Unicode)
        answer = standard(url, body, delivery=f"msg_bad_{n}")
        assert (answer.status_code, answer.json()["error"]) == (400, "bad_payload"), answer.text
    assert runs(app) == []
    fixed = standard(url, json.dumps({"text": "ok"}).encode(), delivery="msg_bad_0")
    assert fixed.status_code == 202, fixed.text
    assert len(runs(app)) == 1


def test_a_hook_without_input_takes_only_an_object(make_app: Callable[..., keel.App]) -> None:
    """With no `input=`, the payload itself is the run's input: one that is not a JSON object
    could never start a graph's state, so it is refused at the door, not failed later."""
    app = make_app()
    app.workflow("echo")(echo_graph)
    app.webhook("raw", workflow="echo", secret=SECRET)
    api = create_app(app, tokens={TOKEN: ["*"]}, max_body_bytes=1_000_000)
    with uvicorn_server(api) as url:
        for n, body in enumerate([b"[1, 2]", b'"text"', b"42", b"null"]):
            answer = standard(url, body, delivery=f"raw_{n}", hook="raw")
            assert (answer.status_code, answer.json()["error"]) == (400, "bad_payload")
            assert "object" in answer.json()["message"]
        assert runs(app) == []
        ok = standard(url, json.dumps({"text": "hé ✓"}).encode(), delivery="raw_ok", hook="raw")
        assert ok.status_code == 202, ok.text
    assert [r["status"] for r in runs(app)] == ["queued"]
