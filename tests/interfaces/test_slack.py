"""Slack approvals end to end, on both backends: messages counted at a local Slack stand-in,
clicks signed like Slack's and sent to a real uvicorn with httpx."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypedDict

import httpx
import pytest
from fastapi import FastAPI
from langgraph.graph import END, START, StateGraph

import keel
from keel.core.errors import UsageError
from keel.core.notifications import Notification
from keel.notifiers.slack import APPROVE, REJECT, SlackNotifier, message, outcome_text
from keel.service.slack import parse_action, slack_router
from tests.support.slack_fake import (
    CHANNEL,
    SECRET,
    Failure,
    SlackServer,
    action_body,
    claim_and_die,
    deliver,
    meta,
    run_to_idle,
    sign,
    signed_headers,
    sweep,
    uvicorn_server,
)

API_TOKEN = "slack-uDeR5dRA6xRND-i2YDAU9oqX9TiuMYR_llVUKXGVjNA"  # secrets.token_urlsafe(32)


class State(TypedDict, total=False):
    decision: str
    by: str


def ask(state: State) -> State:
    answer = keel.approval(
        "editor",
        payload={"title": "Weekly <digest>", "summary": "Three notes on reliability."},
        approvers=["U0EDITOR"],
        remind_after="1h",
        escalate_after="2h",
        escalate_to=["U0CHIEF"],
        timeout="3h",
    )
    return {"decision": answer.decision, "by": answer.by or ""}


def build() -> StateGraph:
    g = StateGraph(State)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


@pytest.fixture
def slack() -> Iterator[SlackServer]:
    with SlackServer() as server:
        yield server


@pytest.fixture
def clock() -> keel.ManualClock:
    return keel.ManualClock()


@pytest.fixture
def setup(
    make_app: Callable[..., keel.App], slack: SlackServer, clock: keel.ManualClock
) -> tuple[keel.App, SlackNotifier]:
    app = make_app(clock=clock, lease_ttl=30)
    app.workflow("ask")(build)
    notifier = SlackNotifier(slack.client(), CHANNEL)
    app.add_notifier(notifier)
    return app, notifier


@pytest.fixture
def service(setup: tuple[keel.App, SlackNotifier], clock: keel.ManualClock) -> Iterator[str]:
    api = FastAPI()
    api.include_router(slack_router(setup[0], SECRET, clock=clock))
    with uvicorn_server(api) as url:
        yield url


NOTIFICATION_FIELDS = {
    "intent_id",
    "wait_id",
    "notifier",
    "kind",
    "status",
    "attempts",
    "error",
    "created_at",
    "updated_at",
}


def waiting_run(app: keel.App, job: str = "weekly") -> tuple[str, str]:
    run_id = app.submit("ask", job_id=job, input={})["run_id"]
    run_to_idle(app)
    (wait,) = app.get_run(run_id).waits
    return run_id, wait["wait_id"]


def click(url: str, body: bytes, ts: int, **headers: str) -> httpx.Response:
    sent = {**signed_headers(body, ts), **headers}
    return httpx.post(f"{url}/slack/actions", content=body, headers=sent, timeout=10)


def decisions(app: keel.App, run_id: str) -> int:
    return [e["kind"] for e in app.get_run(run_id).timeline].count("decision.recorded")


def test_one_message_per_wait_replies_in_its_thread_and_one_update_per_decision(
    setup: tuple[keel.App, SlackNotifier],
    slack: SlackServer,
    service: str,
    clock: keel.ManualClock,
) -> None:
    app, _ = setup
    run_id, wait_id = waiting_run(app)
    assert deliver(app) == 1
    assert deliver(app) == 0
    (post,) = slack.made("chat.postMessage")
    (msg,) = slack.top_level()
    request_intent = next(n for n in app.get_run(run_id).notifications if n["kind"] == "request")
    assert post["metadata"]["event_type"] == "keel_notification"
    assert meta(msg) == {
        "intent_id": request_intent["intent_id"],
        "wait_id": wait_id,
        "run_id": run_id,
    }
    buttons = next(b for b in post["blocks"] if b["type"] == "actions")["elements"]
    assert [(b["action_id"], b["value"]) for b in buttons] == [
        (APPROVE, wait_id),
        (REJECT, wait_id),
    ]
    shown = str(post["blocks"])
    assert "Weekly &lt;digest&gt;" in shown and "Three notes on reliability." in shown
    assert "<@U0EDITOR>" in shown and post["text"] == "Approval needed: editor (weekly)"

    clock.advance(3600)
    sweep(app)
    sweep(app)
    deliver(app)
    clock.advance(3600)
    sweep(app)
    deliver(app)
    deliver(app)
    remind, escalate = slack.replies(msg["ts"])
    assert "Reminder for <@U0EDITOR>" in remind["text"]
    assert "Escalated to <@U0CHIEF>" in escalate["text"]
    assert [p.get("reply_broadcast") for p in slack.made("chat.postMessage")[1:]] == [False, True]

    body = action_body(wait_id, user="U0CHIEF")
    answer = click(service, body, int(clock.now()))
    assert answer.status_code == 200, answer.text
    assert answer.json()["recorded"] is True and answer.json()["decision"] == "approved"
    assert deliver(app) == 1
    assert deliver(app) == 0
    (update,) = slack.made("chat.update")
    assert (update["channel"], update["ts"]) == (CHANNEL, msg["ts"])
    assert not [b for b in update["blocks"] if b["type"] == "actions"], "buttons are gone"
    assert "*Approved* by <@U0CHIEF> via slack" in str(update["blocks"])
    assert meta(slack.top_level()[0])["intent_id"] == request_intent["intent_id"]
    assert len(slack.made("chat.postMessage")) == 3

    run_to_idle(app)
    done = app.get_run(run_id)
    assert (done.status, done.decision, done.termination_reason) == (
        "completed",
        "approved",
        "approved",
    )
    (wait,) = done.waits
    assert (wait["decided_by"], wait["channel"]) == ("slack:U0CHIEF", "slack")
    assert done.output == {"decision": "approved", "by": "slack:U0CHIEF"}


def test_a_dispatcher_that_died_after_posting_or_updating_is_not_repeated(
    setup: tuple[keel.App, SlackNotifier], slack: SlackServer, clock: keel.ManualClock
) -> None:
    app, notifier = setup
    run_id, _ = waiting_run(app)
    note, posted = claim_and_die(app, notifier)
    assert note.kind == "request" and len(slack.made("chat.postMessage")) == 1
    assert deliver(app) == 0, "the dead dispatcher's claim holds until its TTL"
    clock.advance(31)
    assert deliver(app) == 1
    assert len(slack.made("chat.postMessage")) == 1, "reconcile found it: no second post"
    (request,) = app.get_run(run_id).notifications
    assert request["status"] == "delivered"

    assert app.approve(run_id, by="U0EDITOR").recorded
    note, updated = claim_and_die(app, notifier)
    assert note.kind == "decided" and updated["ts"] == posted["ts"]
    clock.advance(31)
    assert deliver(app) == 1
    assert len(slack.made("chat.update")) == 1, "reconcile saw the edit: no second update"
    assert len(slack.made("chat.postMessage")) == 1
    rows = app.get_run(run_id).notifications
    statuses = sorted((n["kind"], n["status"]) for n in rows)
    assert statuses == [("decided", "delivered"), ("request", "delivered")]
    # The HTTP run page shows each intent's stored columns as they are (no claim, no payload).
    from keel.service import create_app

    with uvicorn_server(create_app(app, tokens={API_TOKEN: ["*"]})) as url:
        page = httpx.get(
            f"{url}/v1/runs/{run_id}", headers={"Authorization": f"Bearer {API_TOKEN}"}
        )
    assert page.status_code == 200, page.text
    shown = page.json()["notifications"]
    assert shown and all(set(n) == NOTIFICATION_FIELDS for n in shown)
    assert shown == [{k: r[k] for k in sorted(NOTIFICATION_FIELDS)} for r in rows]


class SlowToPost(SlackServer):
    """Slack answering the first `chat.postMessage` late: the request is on its way out."""

    def __init__(self) -> None:
        super().__init__()
        self.posting = threading.Event()

    def _handle(self, req: Any) -> None:
        if req.path.endswith("chat.postMessage") and not self.posting.is_set():
            self.posting.set()
            time.sleep(1.5)
        super()._handle(req)


def test_a_decision_while_its_request_is_being_posted_edits_that_request(
    make_app: Callable[..., keel.App], clock: keel.ManualClock
) -> None:
    """Two workers' dispatchers: one is posting the request (Slack slow to answer) when the
    decision comes and the other takes its `decided`. The decision waits for the request and
    edits its message: no request is left in the channel with live buttons."""
    with SlowToPost() as slow:
        apps = [make_app(clock=clock, lease_ttl=30) for _ in range(2)]
        for app in apps:
            app.workflow("ask")(build)
            app.add_notifier(SlackNotifier(slow.client(), CHANNEL))
        run_id, wait_id = waiting_run(apps[0])
        posting = threading.Thread(target=deliver, args=(apps[0], "dispatcher-1"))
        posting.start()
        assert slow.posting.wait(10)
        apps[0].approve(run_id, wait_id=wait_id, by="alice")
        deliver(apps[1], "dispatcher-2")  # the `decided`, while the request is in flight
        posting.join(30)
        clock.advance(5)
        deliver(apps[1], "dispatcher-2")
        (posted,) = slow.top_level()
        assert "decided" in posted["text"], posted["text"]
        assert not [b for b in posted.get("blocks", []) if b["type"] == "actions"]
        assert len(slow.made("chat.update")) == 1
        kinds = {
            (n["kind"], n["status"], n["attempts"]) for n in apps[0].get_run(run_id).notifications
        }
        # Waiting for the request is no attempt of the decision's (a backoff counts them).
        assert kinds == {("request", "delivered", 1), ("decided", "delivered", 1)}


def test_rate_limits_and_server_errors_are_retried_without_duplicates(
    setup: tuple[keel.App, SlackNotifier], slack: SlackServer, clock: keel.ManualClock
) -> None:
    app, _ = setup
    run_id, _ = waiting_run(app)
    slack.fail("chat.postMessage", Failure(429, retry_after=7))
    assert deliver(app) == 1  # settled as "queued" for later
    assert slack.top_level() == []
    (intent,) = app.get_run(run_id).notifications
    assert intent["status"] == "queued" and intent["available_at"] == pytest.approx(clock.now() + 7)
    assert deliver(app) == 0, "not before Retry-After"
    # Slack posts it but answers 500: the retry must look before posting again.
    slack.fail("chat.postMessage", Failure(500, commit=True))
    clock.advance(7)
    deliver(app)
    assert len(slack.top_level()) == 1
    clock.advance(60)
    deliver(app)
    (intent,) = app.get_run(run_id).notifications
    assert intent["status"] == "delivered"
    assert len(slack.top_level()) == 1, "one approval message, though Slack answered 500"
    assert len(slack.made("chat.postMessage")) == 0
    assert [c.status for c in slack.calls if c.method == "chat.postMessage"] == [429, 500]


def test_signed_clicks_are_accepted_and_everything_else_changes_nothing(
    setup: tuple[keel.App, SlackNotifier], service: str, clock: keel.ManualClock
) -> None:
    app, _ = setup
    run_id, wait_id = waiting_run(app)
    now = int(clock.now())
    body = action_body(wait_id)
    url = f"{service}/slack/actions"

    def post(content: bytes, headers: dict[str, str]) -> httpx.Response:
        return httpx.post(url, content=content, headers=headers, timeout=10)

    refused = {
        "forged": post(body, {**signed_headers(body, now), "X-Slack-Signature": "v0=" + "0" * 64}),
        "other secret": post(body, signed_headers(body, now, secret="not-the-secret")),
        "stale": post(body, signed_headers(body, now - 301)),
        "future": post(body, signed_headers(body, now + 301)),
        "tampered": post(
            action_body(wait_id, action_id=REJECT),
            {**signed_headers(body, now)},
        ),
        "no signature": post(body, {"X-Slack-Request-Timestamp": str(now)}),
        "no timestamp": post(body, {"X-Slack-Signature": sign(body, now)}),
        "no headers": post(body, {}),
        "bad timestamp": post(
            body, {**signed_headers(body, now), "X-Slack-Request-Timestamp": "soon"}
        ),
    }
    statuses = {name: r.status_code for name, r in refused.items()}
    assert statuses == {
        "forged": 401,
        "other secret": 401,
        "stale": 401,
        "future": 401,
        "tampered": 401,
        "no signature": 400,
        "no timestamp": 400,
        "no headers": 400,
        "bad timestamp": 400,
    }
    malformed = [
        b"payload=%7Bnot+json",
        b"not a form at all\xff",
        b"other=1",
        action_body(wait_id).replace(b"block_actions", b"view_submission"),
        b"payload=" + b"%5B%5D",
        b"payload=%7B%22type%22%3A%22block_actions%22%2C%22actions%22%3A%5B%5D%7D",
        action_body("", user="U0EDITOR"),
        # Nested past what the parser follows, an id that is not valid text, a NUL: each was a
        # 500 (RecursionError, then UnicodeEncodeError or DataError from the wait's lookup).
        b"payload=" + b"%5B" * 5000 + b"%5D" * 5000,
        action_body("\ud800"),
        action_body("w-\x00"),
        action_body(wait_id, user="U0\ud800"),
    ]
    for content in malformed:
        answer = post(content, signed_headers(content, now))
        assert answer.status_code == 400, (content, answer.text)
        assert answer.json()["error"] == "malformed_payload"
    oversized = action_body(wait_id, padding="x" * 70_000)
    assert post(oversized, signed_headers(oversized, now)).status_code == 413
    assert decisions(app, run_id) == 0
    assert app.get_run(run_id).status == "waiting"
    (wait,) = app.get_run(run_id).waits
    assert wait["status"] == "pending"

    other = action_body(wait_id, action_id="something_else")
    assert post(other, signed_headers(other, now)).json()["ignored"]
    unknown = action_body("w-" + "0" * 24)
    assert post(unknown, signed_headers(unknown, now)).status_code == 404

    first = post(body, signed_headers(body, now))
    assert first.status_code == 200 and first.json()["recorded"] is True
    replay = post(body, signed_headers(body, now + 5))
    late = action_body(wait_id, action_id=REJECT, user="U0OTHER", action_ts="1800000009.1")
    second = post(late, signed_headers(late, now + 9))
    for answer in (replay, second):
        assert answer.status_code == 200
        assert answer.json()["recorded"] is False and answer.json()["decision"] == "approved"
    assert decisions(app, run_id) == 1
    (wait,) = app.get_run(run_id).waits
    assert (wait["decision"], wait["decided_by"], wait["action_id"]) == (
        "approved",
        "slack:U0EDITOR",
        "slack:1800000000.000100",
    )
    run_to_idle(app)
    assert app.get_run(run_id).status == "completed"
    # Once the run finished (a worker is often quicker than the last click), a late click is
    # still told what was recorded: Slack would show any other status as an error.
    after = post(late, signed_headers(late, now + 10))
    assert after.status_code == 200, after.text
    assert (after.json()["recorded"], after.json()["decision"]) == (False, "approved")
    assert decisions(app, run_id) == 1


def test_a_click_after_the_deadline_policy_is_refused(
    setup: tuple[keel.App, SlackNotifier],
    slack: SlackServer,
    service: str,
    clock: keel.ManualClock,
) -> None:
    app, _ = setup
    run_id, wait_id = waiting_run(app)
    deliver(app)
    clock.advance(3 * 3600 + 1)
    sweep(app)
    sweep(app)
    deliver(app)
    (wait,) = app.get_run(run_id).waits
    assert (wait["status"], wait["decision"]) == ("expired", "rejected")
    late = click(service, action_body(wait_id), int(clock.now()))
    assert late.status_code == 409 and late.json()["error"] == "run_finished"
    assert decisions(app, run_id) == 0
    (update,) = slack.made("chat.update")
    assert "deadline passed: *rejected* (policy `reject`)" in str(update["blocks"])
    run_to_idle(app)
    done = app.get_run(run_id)
    assert (done.status, done.decision, done.termination_reason) == (
        "completed",
        "rejected",
        "timed_out",
    )


def test_concurrent_clicks_record_one_decision_and_tell_everyone(
    setup: tuple[keel.App, SlackNotifier], service: str, clock: keel.ManualClock
) -> None:
    app, _ = setup
    run_id, wait_id = waiting_run(app)
    now = int(clock.now())
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        action = APPROVE if i % 2 else REJECT
        body = action_body(wait_id, action_id=action, user=f"U{i:04d}", action_ts=f"{now}.{i}")
        answer = click(service, body, now)
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [a.status_code for a in answers] == [200] * 24
    assert sum(a.json()["recorded"] for a in answers) == 1
    (wait,) = app.get_run(run_id).waits
    assert {a.json()["decision"] for a in answers} == {wait["decision"]}
    assert decisions(app, run_id) == 1
    run_to_idle(app)
    done = app.get_run(run_id)
    assert (done.status, done.decision) == ("completed", wait["decision"])


def _note(kind: str, wait_kind: str = "approval", **details: Any) -> Notification:
    return Notification(
        intent_id="n:" + "ab" * 16,
        kind=kind,
        run_id="r-1",
        job_id="job-1",
        workflow="wf",
        wait={
            "wait_id": "w-1",
            "kind": wait_kind,
            "name": "x",
            "payload": {"k": "v"},
            "approvers": [],
            "deadline": None,
        },
        details=details,
    )


def test_effect_waits_get_no_buttons_and_payloads_parse_strictly() -> None:
    _, blocks = message(_note("request", wait_kind="effect"))
    assert not [b for b in blocks if b["type"] == "actions"]
    assert "keel resolve-effect r-1" in str(blocks)
    _, blocks = message(_note("request"))
    assert [b for b in blocks if b["type"] == "actions"]
    parsed = parse_action(action_body("w-1", action_id=REJECT, user="U9"))
    assert parsed == {
        "action_id": REJECT,
        "wait_id": "w-1",
        "user": "U9",
        "click": "1800000000.000100",
    }
    with pytest.raises(Exception, match="names no user"):
        parse_action(action_body("w-1", user=""))
    with pytest.raises(UsageError, match="channel id"):
        SlackNotifier(None, "#approvals")  # type: ignore[arg-type]


def test_only_a_slack_signed_decider_is_a_mention_any_other_by_is_plain_text() -> None:
    def shown(**details: Any) -> str:
        return outcome_text(_note("decided", decision="approved", **details))

    clicked = shown(by="slack:U0CHIEF", principal="slack:U0CHIEF", channel="slack")
    assert clicked == ":white_check_mark: *Approved* by <@U0CHIEF> via slack"
    typed = shown(by="U0CFO", principal="token:4eaca468bba4", channel="http")
    assert typed == ":white_check_mark: *Approved* by U0CFO (as token:4eaca468bba4) via http"
    for by in ("@channel", "@here", "@Everyone", "<!channel>", "<@U0CFO>", "slack:U0CFO"):
        for channel in ("http", "console", "cli"):
            text = shown(by=by, principal="token:4eaca468bba4", channel=channel, comment=by)
            assert "<@" not in text and "<!" not in text and "<#" not in text, text
            for word in ("channel", "here", "everyone"):
                assert f"@{word}" not in text.lower(), text
    assert "by &lt;!channel&gt; (as" in shown(by="<!channel>", principal="p", channel="http")
    # Slack's channel without Slack's signature behind it (a Python caller naming someone
    # else): what was typed, not a mention.
    other = shown(by="slack:U0CFO", principal="slack:U0EDITOR", channel="slack")
    assert "<@" not in other and "slack:U0CFO (as slack:U0EDITOR)" in other


def test_the_service_serves_slack_actions_when_a_signing_secret_is_configured(
    make_app: Callable[..., keel.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    from keel.service import create_app

    monkeypatch.delenv("KEEL_SLACK_SIGNING_SECRET", raising=False)
    app = make_app()
    app.workflow("ask")(build)
    run_id, wait_id = waiting_run(app)
    now = int(time.time())  # the service verifies against the real clock
    body = action_body(wait_id, user="U0BOSS")
    with uvicorn_server(create_app(app, tokens={API_TOKEN: ["*"]})) as url:
        unwired = click(url, body, now)
        assert unwired.status_code == 404, "no signing secret, no Slack endpoint"
    api = create_app(app, tokens={API_TOKEN: ["*"]}, slack_signing_secret=SECRET)
    with uvicorn_server(api) as url:
        assert click(url, body, now - 400).status_code == 401
        answer = click(url, body, now)  # no bearer token: Slack signs instead
        assert answer.status_code == 200, answer.text
        assert answer.json()["recorded"] is True
    (wait,) = app.get_run(run_id).waits
    assert (wait["decision"], wait["decided_by"]) == ("approved", "slack:U0BOSS")


def test_restricted_to_approvers_only_named_users_decide(
    setup: tuple[keel.App, SlackNotifier], clock: keel.ManualClock
) -> None:
    app, _ = setup
    run_id, wait_id = waiting_run(app)
    api = FastAPI()
    api.include_router(slack_router(app, SECRET, clock=clock, restrict_to_approvers=True))
    now = int(clock.now())
    with uvicorn_server(api) as url:
        stranger = click(url, action_body(wait_id, user="U0STRANGER"), now)
        assert (stranger.status_code, stranger.json()["error"]) == (403, "not_an_approver")
        assert decisions(app, run_id) == 0
        chief = click(url, action_body(wait_id, action_id=REJECT, user="U0CHIEF"), now)
        assert chief.status_code == 200 and chief.json()["recorded"] is True
    (wait,) = app.get_run(run_id).waits
    assert (wait["decision"], wait["decided_by"]) == ("rejected", "slack:U0CHIEF")


def escalating() -> StateGraph:
    """An approval whose deadline escalates it (`on_timeout="escalate"`), without a stage."""

    def ask_chief(state: State) -> State:
        answer = keel.approval(
            "editor",
            payload={"title": "Q3 budget"},
            approvers=["U0EDITOR"],
            escalate_to=["U0CHIEF"],
            timeout="1h",
            on_timeout="escalate",
        )
        return {"decision": answer.decision, "by": answer.by or ""}

    g = StateGraph(State)
    g.add_node("ask", ask_chief)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


def test_the_deadline_escalates_to_escalate_to_who_may_then_decide(
    setup: tuple[keel.App, SlackNotifier], slack: SlackServer, clock: keel.ManualClock
) -> None:
    app, _ = setup
    app.workflow("escalating")(escalating)
    run_id = app.submit("escalating", job_id="budget", input={})["run_id"]
    run_to_idle(app)
    (wait,) = app.get_run(run_id).waits
    deliver(app)
    clock.advance(3600 + 1)
    sweep(app)
    deliver(app)
    (msg,) = slack.top_level()
    (escalation,) = slack.replies(msg["ts"])
    assert "Escalated to <@U0CHIEF>" in escalation["text"]
    assert "U0EDITOR" not in escalation["text"]
    api = FastAPI()
    api.include_router(slack_router(app, SECRET, clock=clock, restrict_to_approvers=True))
    with uvicorn_server(api) as url:
        chief = click(url, action_body(wait["wait_id"], user="U0CHIEF"), int(clock.now()))
        assert chief.status_code == 200, chief.text
        assert chief.json()["recorded"] is True


class Plain:
    """A second notifier on the same waits, to see it is not held up by Slack's trouble."""

    kinds = ("request",)

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[str] = []

    def send(self, note: Notification) -> dict[str, Any]:
        self.sent.append(note.intent_id)
        return {"ok": True}

    def reconcile(self, note: Notification) -> None:
        return None


@pytest.mark.parametrize("other", ["a-plain", "z-plain"])
def test_a_failing_history_lookup_neither_posts_twice_nor_blocks_the_outbox(
    other: str,
    make_app: Callable[..., keel.App],
    slack: SlackServer,
    clock: keel.ManualClock,
) -> None:
    app = make_app(clock=clock, lease_ttl=30)
    app.workflow("ask")(build)
    notifier = SlackNotifier(slack.client(), CHANNEL)
    plain = Plain(other)
    app.add_notifier(notifier)
    app.add_notifier(plain)
    run_id, _ = waiting_run(app)
    posts = [claim_and_die(app, notifier)[1] for _ in range(2)]
    (posted,) = [p for p in posts if p is not None]
    clock.advance(31)
    slack.fail("conversations.history", Failure(503))
    deliver(app)
    assert len(plain.sent) == 1, "the other notifier's intent was not held up"
    statuses = {n["notifier"]: n["status"] for n in app.get_run(run_id).notifications}
    assert statuses == {"slack": "sending", other: "delivered"}
    clock.advance(31)
    deliver(app)
    assert len(slack.top_level()) == 1 and slack.top_level()[0]["ts"] == posted["ts"]
    statuses = {n["notifier"]: n["status"] for n in app.get_run(run_id).notifications}
    assert statuses == {"slack": "delivered", other: "delivered"}
