"""API tokens that cannot be reversed (issue 28): HMAC fingerprints keyed by a server secret,
weak tokens refused at start, failed attempts limited per client.

The limit's clock is injected (`FailureLimit(clock=...)`): no test sleeps through a window.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import subprocess
import sys
from collections.abc import Callable

import httpx
import pytest

import keel
from keel.core.errors import UsageError
from keel.service import create_app
from keel.service.auth import (
    MAKE_ONE,
    SECRET_ENV,
    FailureLimit,
    fingerprint,
    load_tokens,
    weak_token_reason,
)
from tests.support import REPO
from tests.support.apps.service import register
from tests.support.service_client import ADMIN, APPROVER, Service, bearer

SECRET_A = "fleet-a-1Jc4Gm0oX2hIYzYb8m3h0pQ3tMa5Yp4r7Vq5Hs2yC1s"
SECRET_B = "fleet-b-V5q8ZrLk2sNw0xT3eB7uD1aQ9yH6cJ4mF8gR2pK0iW3"
WEAK = ("ops-7f3c9a", "x", "a" * 60, "ab" * 40)
STRONG = (
    "bG-x09MEkbLIdft3TxKG9Q",  # secrets.token_urlsafe(16): 22 characters
    "0a5d9807bebeeaf4b8327bb3698d4ee6",  # secrets.token_hex(16): 32 hex digits
    "bY32yskZ1bzXXmj40L6d-rXlleAFx5FevlV7rBQXcs0",  # secrets.token_urlsafe(32)
    "0123456789" * 3 + "987654321",  # 39 digits: 129.6 bits
)


@pytest.fixture
def backend() -> str:
    # Authentication never reaches the database's dialect; tests/store checks both.
    return "sqlite"


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sha256_label(token: str) -> str:
    return f"token:{hashlib.sha256(token.encode()).hexdigest()[:12]}"


def hmac_label(secret: str, token: str) -> str:
    return f"token:{hmac.new(secret.encode(), token.encode(), hashlib.sha256).hexdigest()[:12]}"


# -- fingerprints ---------------------------------------------------------------------------


def test_a_decision_is_labelled_by_an_hmac_keyed_by_the_server_secret(
    serve: Callable[..., Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    labels = []
    for secret, job in ((SECRET_A, "fp-a"), (SECRET_B, "fp-b")):
        monkeypatch.setenv(SECRET_ENV, secret)
        svc = serve()
        run_id, approval_id = svc.waiting_run(job)
        approver = svc.as_(APPROVER)
        decided = approver.post(
            f"/v1/approvals/{approval_id}/decision", json={"decision": "approve"}
        )
        assert decided.status_code == 200, decided.text
        label = decided.json()["decided_by"]
        assert label == decided.json()["principal"] == hmac_label(secret, APPROVER)
        # Not the bare hash a review reversed offline, and nowhere in the run's record.
        assert label != sha256_label(APPROVER)
        shown = svc.http.get(f"/v1/runs/{run_id}").text
        assert sha256_label(APPROVER) not in shown and APPROVER not in shown
        labels.append(label)
    # The same token, another secret: another label.
    assert labels[0] != labels[1]


def test_without_a_configured_secret_each_process_has_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    here = fingerprint(ADMIN)
    assert fingerprint(ADMIN) == here  # stable within a process
    assert f"token:{here}" != sha256_label(ADMIN)
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    code = f"from keel.service.auth import fingerprint; print(fingerprint({ADMIN!r}))"

    def elsewhere() -> str:
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    others = {elsewhere(), elsewhere()}
    assert len(others) == 2 and here not in others
    # With the secret configured, every process agrees.
    env[SECRET_ENV] = SECRET_A
    assert elsewhere() == elsewhere() == hmac_label(SECRET_A, ADMIN).removeprefix("token:")


# -- weak tokens ----------------------------------------------------------------------------


def test_weak_token_reason_estimates_entropy_conservatively() -> None:
    for token in WEAK:
        reason = weak_token_reason(token)
        assert reason is not None, token
        assert token not in reason
    for token in STRONG:
        assert weak_token_reason(token) is None, token
    # The edge: one character fewer than token_urlsafe(16) is 126 bits.
    assert "126 bits" in (weak_token_reason(STRONG[0][:-1]) or "")
    assert "15 characters" in (weak_token_reason("ops-Kx77-s3cret") or "")


@pytest.mark.parametrize("token", ["ops-7f3c9a", "x"])
def test_a_weak_token_is_refused_at_start_with_the_fix_in_one_line(
    make_app: Callable[..., keel.App], monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    app = register(make_app())
    with pytest.raises(UsageError) as given:
        create_app(app, tokens={ADMIN: ["*"], token: ["runs:read"]})
    message = str(given.value)
    assert "\n" not in message
    assert MAKE_ONE in message
    assert "token 2 of 2 (runs:read)" in message and "too weak" in message
    assert token not in message.replace(MAKE_ONE, "")
    # The same from $KEEL_API_TOKENS (what `keel serve` reads before it starts).
    monkeypatch.setenv("KEEL_API_TOKENS", f"{ADMIN}=*;{token}=runs:read")
    with pytest.raises(UsageError, match="KEEL_API_TOKENS: token 2 of 2"):
        create_app(app)
    with pytest.raises(UsageError, match="too weak"):
        load_tokens(None)


def test_strong_tokens_and_secrets_are_accepted_weak_secrets_are_not(
    make_app: Callable[..., keel.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = register(make_app())
    assert set(load_tokens({token: ["*"] for token in STRONG})) == set(STRONG)
    create_app(app, tokens={token: ["*"] for token in STRONG})
    monkeypatch.setenv(SECRET_ENV, "fleet-secret")
    with pytest.raises(UsageError, match=f"{SECRET_ENV} is too weak.*token_urlsafe"):
        create_app(app, tokens={ADMIN: ["*"]})
    monkeypatch.setenv(SECRET_ENV, SECRET_A)
    create_app(app, tokens={ADMIN: ["*"]})


# -- failed attempts ------------------------------------------------------------------------


def test_failed_attempts_block_the_client_then_the_block_lifts(
    serve: Callable[..., Service],
) -> None:
    clock = Clock()
    svc = serve(failure_limit=FailureLimit(10, 60, clock=clock))
    client = svc.as_(None)
    # Successes in between reset nothing: the tenth failure still counts as the tenth.
    for attempt in range(10):
        assert client.get("/v1/runs", headers=bearer(ADMIN)).status_code == 200
        wrong = client.get("/v1/runs", headers=bearer(f"guess-{attempt}"))
        assert wrong.status_code == 401, (attempt, wrong.text)
        clock.now += 1
    for headers in (bearer("guess-11"), bearer(ADMIN), {}):
        blocked = client.get("/v1/runs", headers=headers)
        assert blocked.status_code == 429, blocked.text
        assert blocked.json()["error"] == "too_many_failures"
        assert set(blocked.json()) == {"error", "message"}
        assert blocked.headers["Retry-After"] == "59"  # blocked at t=9 for 60 s; now t=10
    clock.now += 58.5
    assert client.get("/v1/runs", headers=bearer(ADMIN)).headers["Retry-After"] == "1"
    clock.now += 0.5
    assert client.get("/v1/runs", headers=bearer(ADMIN)).status_code == 200
    # A fresh count: one failure is a 401 again, not a 429.
    assert client.get("/v1/runs", headers=bearer("guess-12")).status_code == 401


def test_the_limit_is_per_client_address(serve: Callable[..., Service]) -> None:
    clock = Clock()
    svc = serve(failure_limit=FailureLimit(3, 60, clock=clock))
    here = svc.as_(None)
    there = svc.as_(None, transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    for _ in range(3):
        assert here.get("/v1/runs", headers=bearer("guess")).status_code == 401
    assert here.get("/v1/runs", headers=bearer(ADMIN)).status_code == 429
    # Another address is neither blocked nor able to lift the block by succeeding.
    assert there.get("/v1/runs", headers=bearer(ADMIN)).status_code == 200
    assert there.get("/v1/runs", headers=bearer("guess")).status_code == 401
    assert here.get("/v1/runs", headers=bearer(ADMIN)).status_code == 429


def test_the_console_login_and_cookie_share_the_limit(serve: Callable[..., Service]) -> None:
    clock = Clock()
    svc = serve(failure_limit=FailureLimit(4, 60, clock=clock))
    browser = svc.as_(None, follow_redirects=False)

    def log_in(token: str) -> httpx.Response:
        assert browser.get("/ui/login").status_code == 200
        nonce = browser.cookies["keel_login_csrf"]
        return browser.post("/ui/login", data={"token": token, "csrf": nonce})

    assert log_in("guess-1").status_code == 401
    assert log_in("guess-2").status_code == 401
    # A guessed session cookie counts too, and is dropped so that it is not sent again.
    for guess in ("guess-3", "guess-4"):
        page = svc.as_(None, cookies={"keel_session": guess}).get("/ui/runs")
        assert page.status_code == 303
        assert 'keel_session=""' in page.headers["set-cookie"]
    refused = log_in(ADMIN)
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"] == "60"
    assert "too many failed authentications" in refused.text
    assert "keel_session" not in refused.headers.get("set-cookie", "")
    clock.now += 60
    assert log_in(ADMIN).status_code == 303
    assert browser.get("/ui/runs").status_code == 200


def test_the_table_of_clients_is_bounded() -> None:
    clock = Clock()
    limit = FailureLimit(2, 60, max_clients=3, clock=clock)
    for client in ("a", "b", "c", "d", "e"):
        limit.failed(client)
        limit.failed(client)
        clock.now += 1
    assert len(limit) == 3
    # The oldest were forgotten; the newest are still blocked.
    assert limit.blocked_for("a") == limit.blocked_for("b") == 0
    assert limit.blocked_for("e") == 59  # blocked at t+4 for 60 s, now t+5
    clock.now += 60
    assert [limit.blocked_for(c) for c in "cde"] == [0, 0, 0]
    assert len(limit) == 0
