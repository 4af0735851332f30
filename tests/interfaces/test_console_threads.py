"""The console's thread pages at /ui/threads: find a conversation, read its runs, state and
history, and answer the interrupt it waits on with a JSON value.

A real App is served on 127.0.0.1 (uvicorn). The HTTP tests log in through the login form and
read the pages' HTML on SQLite and PostgreSQL; one test drives Debian's Chromium through
Playwright, every request of its page checked to stay on this machine. What the tests check is
what the database recorded and what the graph's `interrupt()` returned, not only the page.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

import keel
from keel.runtime.snapshot_json import jsonable
from keel.service import create_app
from tests.support import REPO
from tests.support.apps.service import LiveServer
from tests.support.apps.service import register as register_review
from tests.support.checks import event_kinds
from tests.support.thread_graphs import asking
from tests.support.workers import drain

ADMIN = "admin-Qm3v8WfB0yT1kZpN4sRj7uXc2eHd6gLa9oVi5nKt_wE"  # secrets.token_urlsafe(32)
READER = "reader-Lp4Xw9qTz2Nc7Vb1Mh6Kd3Rj8Fs0Gy5Ua_eOiYtQnWm"
RUNNER = "runner-Bn8Zr2Tq6Wy0Lc4Xv9Mk1Hp7Ds3Fj5Ga_uEoIeRtYw"
TOKENS = {ADMIN: ["*"], READER: ["runs:read", "approvals:read"], RUNNER: ["runs:write"]}


class Console:
    """One served App; `client(token)` is a person logged in through the form."""

    def __init__(self, app: keel.App, url: str) -> None:
        self.app = app
        self.url = url
        self.clients: list[httpx.Client] = []

    def client(self, token: str | None = ADMIN) -> httpx.Client:
        client = httpx.Client(base_url=self.url, follow_redirects=False, timeout=60)
        self.clients.append(client)
        if token is not None:
            assert client.get("/ui/login").status_code == 200
            nonce = client.cookies["keel_login_csrf"]
            logged = client.post("/ui/login", data={"token": token, "csrf": nonce})
            assert logged.status_code == 303, logged.text
        return client


@pytest.fixture
def console() -> Iterator[Callable[[keel.App], Console]]:
    made: list[tuple[LiveServer, Console]] = []

    def serve(app: keel.App) -> Console:
        server = LiveServer(create_app(app, tokens=TOKENS)).__enter__()
        made.append((server, Console(app, server.url)))
        return made[-1][1]

    yield serve
    for server, c in made:
        for client in c.clients:
            client.close()
        server.__exit__(None, None, None)


def ask_app(make_app: Callable[..., keel.App]) -> keel.App:
    app = make_app()
    app.workflow("ask")(asking)
    return app


def waiting_thread(app: keel.App, thread_id: str, question: str, **submit: Any) -> str:
    run_id = app.submit("ask", {"question": question}, thread_id=thread_id, **submit).run_id
    drain(app)
    assert app.get_run(run_id).status == "waiting"
    return run_id


# -- reading the HTML ------------------------------------------------------------------------


def listed(page: str) -> list[str]:
    return re.findall(r'<tr class="thread" data-thread-id="([^"]+)">', page)


def run_rows(page: str) -> list[dict[str, Any]]:
    found = re.findall(r'<tr class="run ([^"]*)" data-run-id="([^"]+)">(.*?)</tr>', page, re.S)
    return [
        {
            "run_id": run_id,
            "classes": classes.split(),
            "cells": [text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)],
            "links": re.findall(r'href="([^"]+)"', body),
        }
        for classes, run_id, body in found
    ]


def history_rows(page: str) -> list[dict[str, Any]]:
    found = re.findall(
        r'<tr class="checkpoint[^"]*" data-checkpoint-id="([^"]+)">(.*?)</tr>', page, re.S
    )
    return [
        {
            "checkpoint_id": checkpoint_id,
            "cells": [text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)],
            "links": re.findall(r'href="([^"]+)"', body),
        }
        for checkpoint_id, body in found
    ]


def pre(page: str, cls: str) -> str:
    match = re.search(rf'<pre class="{cls}">(.*?)</pre>', page, re.S)
    assert match, f"no <pre class={cls}> on the page"
    return html.unescape(match.group(1))


def field(page: str, name: str) -> str:
    match = re.search(rf'name="{name}"[^>]*? value="([^"]*)"', page)
    assert match, f"no field {name} on the page"
    return html.unescape(match.group(1))


def text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def textarea(page: str) -> str:
    match = re.search(r'<textarea name="value"[^>]*>(.*?)</textarea>', page, re.S)
    assert match, "no answer form on the page"
    return html.unescape(match.group(1))


def answer_form(page: str) -> dict[str, str]:
    return {n: field(page, n) for n in ("csrf", "action_id", "wait_id")}


# -- the list --------------------------------------------------------------------------------


def test_threads_are_found_by_metadata_status_and_workflow(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = ask_app(make_app)
    app.workflow("other")(asking)
    waiting_thread(app, "t-ann", "color?", metadata={"user": "ann", "tier": 2})
    app.create_thread(
        "ask", thread_id="t-bob", metadata={"user": "bob", "tier": "2", "note": "two words"}
    )
    app.create_thread("other", thread_id="t-other", metadata={"user": "ann", "tier": 3})
    c = console(app).client()

    page = c.get("/ui/threads")
    assert page.status_code == 200
    assert sorted(listed(page.text)) == ["t-ann", "t-bob", "t-other"]
    assert 'href="/ui/threads" aria-current="page">Threads' in page.text  # the nav link
    searches = {
        "metadata=user%3Dann": ["t-ann", "t-other"],
        "metadata=user%3Dann+tier%3D2": ["t-ann"],  # every pair must match
        "metadata=tier%3D2": ["t-ann"],  # 2 is the number...
        "metadata=tier%3D%222%22": ["t-bob"],  # ..."2" the text
        "status=interrupted": ["t-ann"],
        "status=idle": ["t-bob", "t-other"],
        "workflow=other": ["t-other"],
        "metadata=user%3Dnobody": [],
        "metadata=note%3D%22two+words%22+user%3Dbob": ["t-bob"],
    }
    for query, expected in searches.items():
        page = c.get(f"/ui/threads?{query}")
        assert (page.status_code, sorted(listed(page.text))) == (200, expected), query
    page = c.get("/ui/threads?metadata=user%3Dann")
    assert 'href="/ui/threads/t-ann"' in page.text
    assert '<span class="badge s-waiting" data-field="status">interrupted</span>' in page.text

    refusals = {
        "status=lost": "status 'lost' is not one of idle, busy, interrupted, error",
        "metadata=user": "metadata 'user' is not key=value",
        "metadata=note%3D%22open": "metadata 'note=\"open' is not key=value",
        "offset=-1": "offset '-1' is not a whole number",
    }
    for query, message in refusals.items():
        page = c.get(f"/ui/threads?{query}")
        assert page.status_code == 400, query
        assert 'role="alert"' in page.text and message in html.unescape(page.text), query
        assert listed(page.text) == []


def test_the_list_pages_through_many_threads(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = ask_app(make_app)
    for n in range(53):
        app.create_thread("ask", thread_id=f"t-{n:02d}", metadata={"batch": 1})
    c = console(app).client()
    first = c.get("/ui/threads?metadata=batch%3D1")
    second = c.get("/ui/threads?metadata=batch%3D1&offset=50")
    assert len(listed(first.text)) == 50 and len(listed(second.text)) == 3
    assert sorted(listed(first.text) + listed(second.text)) == [f"t-{n:02d}" for n in range(53)]
    assert 'rel="next" href="?metadata=batch%3D1&amp;offset=50"' in first.text
    assert 'rel="next"' not in second.text


# -- a thread --------------------------------------------------------------------------------


def test_a_thread_shows_its_runs_in_order_its_history_and_its_interrupt(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = ask_app(make_app)
    first = waiting_thread(app, "t-1", "keep", metadata={"user": "ann"})
    app.resume("t-1", "kept")
    drain(app)
    stopped = waiting_thread(app, "t-1", "stop")
    rolled = waiting_thread(app, "t-1", "drop", multitask_strategy="interrupt")
    active = waiting_thread(app, "t-1", "new", multitask_strategy="rollback")
    assert [app.get_run(r).termination_reason for r in (stopped, rolled)] == [
        "interrupted",
        "rolled_back",
    ]
    c = console(app).client()
    page = c.get("/ui/threads/t-1")
    assert page.status_code == 200
    body = page.text
    assert json.loads(pre(body, "metadata")) == {"user": "ann"}
    assert '<span class="badge s-waiting" data-field="status">interrupted</span>' in body

    rows = run_rows(body)
    assert [r["run_id"] for r in rows] == [first, stopped, rolled, active]
    assert [r["cells"][0] for r in rows] == ["1", "2", "3", "4"]
    statuses = [r["cells"][2] for r in rows]
    assert statuses == [
        "completed completed",
        "cancelled interrupted",
        "cancelled rolled_back",
        "waiting",
    ]
    assert [r["cells"][3] for r in rows] == ["enqueue", "enqueue", "interrupt", "rollback"]
    assert all(f"/ui/runs/{r['run_id']}" in r["links"] for r in rows)

    history = history_rows(body)
    expected = app.get_history("t-1")
    assert [h["checkpoint_id"] for h in history] == [
        s.config["configurable"]["checkpoint_id"] for s in expected
    ]
    for row, snapshot in zip(history, expected, strict=True):
        writer = snapshot.metadata["keel_run_id"]
        assert row["cells"][2] == str(snapshot.metadata["step"])
        assert row["cells"][3] == snapshot.metadata["source"]
        assert f"/ui/runs/{writer}" in row["links"]
        assert row["cells"][5].startswith(", ".join(snapshot.next) or "—")
    # Nothing the rolled-back run wrote is left in the history; the interrupted run's is.
    writers = {h["links"][1] for h in history}
    assert f"/ui/runs/{rolled}" not in writers and f"/ui/runs/{stopped}" in writers

    latest = app.get_state("t-1")
    assert json.loads(pre(body, "values")) == jsonable(latest.values)
    assert json.loads(pre(body, "values"))["answer"] == "kept"
    assert json.loads(pre(body, "interrupt-value")) == {"question": "new"}
    assert answer_form(body)["wait_id"] == app.get_run(active).waits[0]["wait_id"]

    # A past checkpoint's state, by its link in the history.
    oldest = history[-1]["checkpoint_id"]
    past = c.get(f"/ui/threads/t-1?at={oldest}").text
    assert f'State at checkpoint <span class="mono">{oldest}</span>' in past
    assert json.loads(pre(past, "values")) == jsonable(app.get_state("t-1", oldest).values)

    # Each run's page links back to its thread, and says why a stopped run stopped.
    run_page = c.get(f"/ui/runs/{rolled}").text
    assert 'Turn 3 of thread <a href="/ui/threads/t-1">t-1</a>' in run_page
    assert "stopped by a later run on it (rolled back)" in run_page
    alone = app.submit("ask", {"question": "solo"}).run_id  # a run of its own thread
    assert "of thread" not in c.get(f"/ui/runs/{alone}").text


def test_the_history_pages_through_long_conversations(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = ask_app(make_app)
    for turn in range(14):  # four checkpoints a turn
        waiting_thread(app, "t-long", f"q{turn}")
        app.resume("t-long", turn)
        drain(app)
    expected = [s.config["configurable"]["checkpoint_id"] for s in app.get_history("t-long")]
    assert len(expected) > 50
    c = console(app).client()
    first = c.get("/ui/threads/t-long").text
    shown = [h["checkpoint_id"] for h in history_rows(first)]
    assert shown == expected[:50]
    older = re.search(r'rel="next" href="\?before=([^"#]+)#history"', first)
    assert older and older.group(1) == expected[49]
    rest = c.get(f"/ui/threads/t-long?before={older.group(1)}").text
    assert [h["checkpoint_id"] for h in history_rows(rest)] == expected[50:]
    assert 'rel="next"' not in rest


def test_a_thread_whose_workflow_this_server_lacks_still_shows_its_runs(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = ask_app(make_app)
    run = waiting_thread(app, "t-away", "where?")
    elsewhere = make_app()  # the same database, without the workflow
    page = console(elsewhere).client().get("/ui/threads/t-away")
    assert page.status_code == 200
    assert [r["run_id"] for r in run_rows(page.text)] == [run]
    assert "The state cannot be read here:" in page.text and "ask" in page.text
    assert history_rows(page.text) == []


def test_an_unknown_or_invalid_thread_is_a_page_that_says_so(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    c = console(ask_app(make_app)).client()
    missing = c.get("/ui/threads/no-such-thread")
    assert missing.status_code == 404 and "no thread &#39;no-such-thread&#39;" in missing.text
    bad = c.get("/ui/threads/-bad-")
    assert bad.status_code == 400 and "<html" in bad.text and "thread_id" in bad.text


# -- answering -------------------------------------------------------------------------------


def test_answer_an_interrupt_with_json_over_the_form(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = ask_app(make_app)
    run = waiting_thread(app, "t-ans", "color?")
    c = console(app).client()
    form = answer_form(c.get("/ui/threads/t-ans").text)
    url = "/ui/threads/t-ans/answer"

    for value, message in (
        ("teal", "The answer is not JSON"),
        ("", "Write the answer as a JSON value"),
        ("NaN", "NaN is not JSON"),
        ('{"a": 1', "The answer is not JSON"),
    ):
        refused = c.post(url, data={**form, "value": value, "by": "alice"})
        assert refused.status_code == 400, value
        assert message in html.unescape(refused.text), value
        assert "nothing was recorded" in refused.text
        # The page again, what was typed still in its form.
        assert textarea(refused.text) == value
        assert field(refused.text, "by") == "alice"
    (wait,) = app.get_run(run).waits
    assert wait["status"] == "pending"
    assert "decision.recorded" not in event_kinds(app, run)

    value = {"color": "teal", "shades": [1, 2], "note": "<b>&</b>"}
    answered = c.post(url, data={**form, "value": json.dumps(value), "by": "alice"})
    assert answered.status_code == 303
    target = answered.headers["location"]
    assert parse_qs(urlsplit(target).query) == {
        "answered": [form["wait_id"]],
        "notice": ["recorded"],
    }
    shown = c.get(target).text
    assert "<strong>Recorded.</strong>" in shown
    assert json.loads(pre(shown, "answer")) == value
    # A double click posts the same form again: the same answer, told as recorded.
    again = c.post(url, data={**form, "value": json.dumps(value), "by": "alice"})
    assert parse_qs(urlsplit(again.headers["location"]).query)["notice"] == ["recorded"]

    (wait,) = app.get_run(run).waits
    assert (wait["decided_by"], wait["channel"], wait["action_id"]) == (
        "alice",
        "console",
        form["action_id"],
    )
    drain(app)
    assert app.get_run(run).status == "completed"
    final = app.get_state("t-ans").values
    assert final["answer"] == value  # what interrupt() returned: the value itself
    assert final["log"] == ["asked color?", "done"]
    after = c.get("/ui/threads/t-ans").text
    assert "Waiting for input" not in after and 'name="value"' not in after
    assert '<span class="badge s-idle" data-field="status">idle</span>' in after


def test_a_name_left_empty_records_the_tokens_label(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = ask_app(make_app)
    run = waiting_thread(app, "t-anon", "yes?")
    c = console(app).client()
    page = c.get("/ui/threads/t-anon").text
    label = re.search(r'name="by"[^>]*placeholder="([^"]+)"', page)
    assert label and label.group(1).startswith("token:")
    c.post("/ui/threads/t-anon/answer", data={**answer_form(page), "value": "true", "by": " "})
    (wait,) = app.get_run(run).waits
    assert wait["decided_by"] == label.group(1)


def test_a_losing_answer_is_shown_the_recorded_one_and_changes_nothing(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = ask_app(make_app)
    run = waiting_thread(app, "t-race", "color?")
    c = console(app).client()
    form = answer_form(c.get("/ui/threads/t-race").text)
    stale = answer_form(c.get("/ui/threads/t-race").text)  # a second tab, its own action id
    app.resume("t-race", {"color": "red"}, by="bob", channel="api")  # while the pages are open

    lost = c.post("/ui/threads/t-race/answer", data={**form, "value": '"blue"', "by": "alice"})
    assert parse_qs(urlsplit(lost.headers["location"]).query)["notice"] == ["already"]
    shown = c.get(lost.headers["location"]).text
    assert "Someone answered first:" in shown and "<strong>bob</strong> via api" in shown
    assert json.loads(pre(shown, "answer")) == {"color": "red"}

    drain(app)  # the run goes on with bob's answer and ends
    assert app.get_run(run).status == "completed"
    late = c.post("/ui/threads/t-race/answer", data={**stale, "value": '"green"', "by": "carol"})
    assert parse_qs(urlsplit(late.headers["location"]).query)["notice"] == ["already"]
    assert "<strong>bob</strong> via api" in c.get(late.headers["location"]).text

    (wait,) = app.get_run(run).waits
    assert (wait["decided_by"], wait["channel"]) == ("bob", "api")
    assert app.get_state("t-race").values["answer"] == {"color": "red"}
    assert event_kinds(app, run).count("decision.recorded") == 1


def test_an_approval_on_a_thread_is_decided_in_the_inbox_not_with_json(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = register_review(make_app())
    run = app.submit("review", {"topic": "launch"}, thread_id="t-review").run_id
    drain(app)
    (wait,) = app.get_run(run).waits
    c = console(app).client()
    page = c.get("/ui/threads/t-review").text
    link = f"/ui/approvals?wait={wait['wait_id']}#{wait['wait_id']}"
    assert f'href="{link}"' in page
    assert 'name="value"' not in page
    csrf = field(page, "csrf")
    forged = {"csrf": csrf, "wait_id": wait["wait_id"], "value": '"approve"', "action_id": "x"}
    refused = c.post("/ui/threads/t-review/answer", data=forged)
    assert parse_qs(urlsplit(refused.headers["location"]).query)["notice"][0].startswith("refused:")
    shown = c.get(refused.headers["location"]).text
    assert "Not recorded." in shown and "not a plain interrupt" in shown
    assert app.get_run(run).waits[0]["status"] == "pending"


def test_answering_needs_a_session_its_scope_and_the_forms_token(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = ask_app(make_app)
    run = waiting_thread(app, "t-guard", "who?")
    c = console(app)
    admin_form = answer_form(c.client().get("/ui/threads/t-guard").text)
    post = {**admin_form, "value": '"mallory"', "by": "mallory"}

    anonymous = c.client(None)
    assert anonymous.get("/ui/threads").status_code == 303  # to the login form
    assert anonymous.get("/ui/threads/t-guard").headers["location"].startswith("/ui/login")
    assert anonymous.post("/ui/threads/t-guard/answer", data=post).status_code == 401

    reader = c.client(READER)
    page = reader.get("/ui/threads/t-guard").text
    assert "lacks approvals:write" in page and 'name="value"' not in page
    own = {**post, "csrf": re.findall(r'name="csrf" value="([^"]+)"', page)[0]}
    refused = reader.post("/ui/threads/t-guard/answer", data=own)
    assert refused.status_code == 403 and "lacks the scope approvals:write" in refused.text

    assert c.client(RUNNER).get("/ui/threads").status_code == 403

    admin = c.client()
    for forged in ("", "0" * 64):
        answer = admin.post("/ui/threads/t-guard/answer", data={**post, "csrf": forged})
        assert answer.status_code == 403 and "security token" in answer.text
    # Over the service's body limit (64 KiB): refused before anything reads it.
    too_long = {**admin_form, "value": '"' + "x" * 70_000 + '"'}
    assert admin.post("/ui/threads/t-guard/answer", data=too_long).status_code == 413
    (wait,) = app.get_run(run).waits
    assert wait["status"] == "pending" and wait["decided_by"] is None


# -- in a browser ----------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
SHOTS = REPO / "docs" / "img"
WAIT_MS = 30_000  # a bounded wait for the page, never a timing assertion


@pytest.fixture
def chromium() -> Iterator[Any]:
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        message = f"no Chromium at {CHROMIUM}: apt-get install -y chromium"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        yield browser
        browser.close()


def shot(page: Any, name: str) -> None:
    """KEEL_CONSOLE_SCREENSHOTS=1 writes the screenshot docs/console.md shows."""
    if os.environ.get("KEEL_CONSOLE_SCREENSHOTS") == "1":
        page.screenshot(path=str(SHOTS / f"console-{name}.png"), full_page=True)


@pytest.mark.browser
@pytest.mark.parametrize("backend", ["sqlite"])
def test_in_a_browser_find_a_thread_answer_its_interrupt_and_the_graph_gets_the_value(
    backend: str,
    chromium: Any,
    console: Callable[[keel.App], Console],
    make_app: Callable[..., keel.App],
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)  # its own 5 s is short on a machine running many tests
    app = ask_app(make_app)
    run = waiting_thread(app, "t-browser", "which plan?", metadata={"customer": "acme"})
    app.create_thread("ask", thread_id="t-quiet", metadata={"customer": "other"})
    c = console(app)
    offsite: list[str] = []
    context = chromium.new_context(base_url=c.url)
    context.set_default_timeout(WAIT_MS)

    def guard(route: Any) -> None:
        if urlsplit(route.request.url).hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            offsite.append(route.request.url)
            route.abort()

    context.route("**/*", guard)
    try:
        page = context.new_page()
        page.goto("/ui/login?next=/ui/runs")
        page.get_by_label("Token").fill(ADMIN)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url("**/ui/runs")
        page.get_by_role("link", name="Threads").click()
        page.wait_for_url("**/ui/threads")
        expect(page.locator("tr.thread")).to_have_count(2)
        page.get_by_label("Metadata").fill("customer=acme")
        page.get_by_role("button", name="Search").click()
        expect(page.locator("tr.thread")).to_have_count(1)
        shot(page, "threads")
        page.get_by_role("link", name="t-browser").click()
        page.wait_for_url("**/ui/threads/t-browser")
        expect(page.locator("pre.interrupt-value")).to_contain_text('"which plan?"')

        answer = {"plan": "pro", "seats": 12}
        form = page.locator("form.resume")
        form.get_by_label("Answer").fill(json.dumps(answer))
        form.get_by_label("Your name").fill("dana")
        shot(page, "thread")
        form.get_by_label("Answer").fill("pro plan")  # not JSON: refused, kept
        form.get_by_role("button", name="Resume").click()
        expect(page.get_by_role("alert")).to_contain_text("The answer is not JSON")
        form = page.locator("form.resume")
        expect(form.get_by_label("Answer")).to_have_value("pro plan")
        expect(form.get_by_label("Your name")).to_have_value("dana")
        assert app.get_run(run).waits[0]["status"] == "pending"

        form.get_by_label("Answer").fill(json.dumps(answer))
        form.get_by_role("button", name="Resume").click()
        expect(page.locator("#outcome")).to_contain_text("Recorded.")
        expect(page.locator("#outcome pre.answer")).to_contain_text('"seats": 12')

        page.evaluate("window.keptAcrossUpdates = true")
        drain(app)
        assert app.get_run(run).status == "completed"
        assert app.get_state("t-browser").values["answer"] == answer
        (wait,) = app.get_run(run).waits
        assert (wait["decided_by"], wait["channel"]) == ("dana", "console")

        # The open page follows the thread without a reload (it refreshes every 5 s).
        status = page.locator("#summary [data-field=status]")
        expect(status).to_have_text("idle", timeout=WAIT_MS)
        assert page.evaluate("window.keptAcrossUpdates") is True
        expect(page.locator("pre.values")).to_contain_text('"plan": "pro"')
        expect(page.locator("form.resume")).to_have_count(0)
        page.locator("#runs").get_by_role("link", name=run).click()
        page.wait_for_url(f"**/ui/runs/{run}")
        page.get_by_role("link", name="t-browser").click()
        page.wait_for_url("**/ui/threads/t-browser")
    finally:
        context.close()
    assert offsite == [], f"the pages asked for URLs off this machine: {offsite}"


def test_the_inbox_link_shows_its_approval_whatever_page_it_is_on(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    """More open approvals than a page holds: a run's "decide in the inbox" link still lands on
    a page with that approval's card (it led to the first page, without it)."""
    app = register_review(make_app())
    runs = [
        app.submit("review", {"topic": f"t{n}", "timeout": f"{n + 1}h"}, job_id=f"j-{n}").run_id
        for n in range(51)
    ]
    drain(app)
    c = console(app).client()
    last = runs[-1]  # the furthest deadline: past the inbox's first page of 50
    (wait,) = app.get_run(last).waits
    card = f'id="{wait["wait_id"]}"'
    assert card not in c.get("/ui/approvals").text
    linked = re.findall(r'href="(/ui/approvals\?wait=[^"#]+)#', c.get(f"/ui/runs/{last}").text)
    assert linked == [f"/ui/approvals?wait={wait['wait_id']}"]
    assert card in c.get(linked[0]).text
    # Another id, or one decided since, shows the inbox as it is.
    assert c.get("/ui/approvals?wait=w-nope").status_code == 200
    app.approve(last, by="alice")
    assert card not in c.get(linked[0]).text
