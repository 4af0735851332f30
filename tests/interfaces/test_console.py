"""The web console at /ui, driven in a real browser (Debian's Chromium through Playwright).

Each test serves a real App on 127.0.0.1 (uvicorn) and clicks through the pages as a person
would. Every browser context routes all its requests through a guard that refuses any URL off
the loopback interface, so a page that needs the internet fails its test. What the tests check
is what the database recorded and what the provider saw, not only what the page says.

KEEL_CONSOLE_SCREENSHOTS=1 writes the screenshots of docs/console.md to docs/img/.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import keel
from keel.service import create_app
from keel.service.auth import fingerprint
from keel.testing import spawn_worker
from tests.support import REPO
from tests.support.apps.service import LiveServer, register
from tests.support.checks import wait_until
from tests.support.graphs import echo_graph
from tests.support.in_doubt import in_doubt
from tests.support.outbox_flows import drain as outbox_drain
from tests.support.outbox_flows import enqueue, graph, serving
from tests.support.outbox_flows import wait as outbox_wait
from tests.support.providers import Provider
from tests.support.workers import drain

playwright_sync = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ADMIN = "admin-2dNf_RkAC6DaZVNINIy0Pxi0V6wEIZUuLbWeH0kNAs4"  # secrets.token_urlsafe(32)
READER = "reader-9bctThjwFTNyheih3JUEKtn5RnPWqpYRXSjdXJc8qjk"
RUNNER = "runner-6vF-YHYgLownQk0q0Pge_CVHL_3p2B93EYQdNbM4JbM"
APPROVER = "approver-Xq3v9mJ2kLr8sT0wYb5nHc7dFg1pZa4eUi6oKj2lMn0"
TOKENS = {
    ADMIN: ["*"],
    READER: ["runs:read", "approvals:read"],
    RUNNER: ["runs:write"],
    APPROVER: ["approvals:read", "approvals:write"],  # docs/console.md's approver
}
SHOTS = REPO / "docs" / "img"
WAIT = 30_000  # ms: a bounded wait for the page, never a timing assertion
# expect()'s own 5 s is short for a page on a machine that runs several tests at once.
playwright_sync.expect.set_options(timeout=WAIT)

pytestmark = pytest.mark.browser


@pytest.fixture
def backend() -> str:
    # The pages read through the same Store methods whose both dialects tests/store checks.
    return "sqlite"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        message = f"no Chromium at {CHROMIUM}: apt-get install -y chromium"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


class Console:
    """One served App, and browser pages on it whose every request is checked."""

    def __init__(self, app: keel.App, url: str, browser: Any) -> None:
        self.app = app
        self.url = url
        self.browser = browser
        self.offsite: list[str] = []
        self.contexts: list[Any] = []

    def page(self) -> Any:
        context = self.browser.new_context(
            base_url=self.url, viewport={"width": 1280, "height": 900}
        )
        context.set_default_timeout(WAIT)

        def guard(route: Any) -> None:
            host = urlsplit(route.request.url).hostname
            if route.request.url.startswith(("data:", "blob:")) or host in (
                "127.0.0.1",
                "localhost",
            ):
                route.continue_()
            else:
                self.offsite.append(route.request.url)
                route.abort()

        context.route("**/*", guard)
        self.contexts.append(context)
        return context.new_page()

    def login(self, token: str = ADMIN, next: str = "/ui/runs") -> Any:
        page = self.page()
        page.goto(f"/ui/login?next={next}")
        page.get_by_label("Token").fill(token)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(re.compile(re.escape(next) + r"(\?.*)?$"))
        return page

    def close(self) -> None:
        for context in self.contexts:
            context.close()


@pytest.fixture
def console(browser: Any) -> Iterator[Callable[[keel.App], Console]]:
    made: list[tuple[LiveServer, Console]] = []

    def serve(app: keel.App) -> Console:
        server = LiveServer(create_app(app, tokens=TOKENS)).__enter__()
        made.append((server, Console(app, server.url, browser)))
        return made[-1][1]

    yield serve
    for server, c in made:
        c.close()
        server.__exit__(None, None, None)
        assert c.offsite == [], f"the pages asked for URLs off this machine: {c.offsite}"


def shot(page: Any, name: str) -> None:
    if os.environ.get("KEEL_CONSOLE_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"console-{name}.png"), full_page=True)


def waiting_runs(app: keel.App, *jobs: str) -> list[str]:
    runs = [app.submit("review", job_id=j, input={"topic": j})["run_id"] for j in jobs]
    app.run_worker(stop_when_idle=True, handle_signals=False)
    for run in runs:
        assert app.get_run(run).status == "waiting"
    return runs


def expect(locator: Any) -> Any:
    return playwright_sync.expect(locator)


# -- reading ---------------------------------------------------------------------------------


def test_log_in_find_a_run_by_job_id_and_see_its_timeline_and_artifacts(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App], tmp_path: Path
) -> None:
    app = register(make_app())
    run, *_ = waiting_runs(app, "ticket-4711", "ticket-4712", "invoice-88")
    c = console(app)
    page = c.login()
    expect(page.locator("tr.run")).to_have_count(3)
    shot(page, "runs")

    page.get_by_label("Job id").fill("ticket-4711")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("tr.run")).to_have_count(1)
    page.get_by_role("link", name="ticket-4711").click()
    page.wait_for_url(f"**/ui/runs/{run}")

    expect(page.locator("#summary .outcome")).to_contain_text("waiting for editor")
    expect(page.locator("svg.gantt rect.bar.step")).to_have_count(2)  # prepare, review
    kinds = page.locator("#timeline td.kind").all_inner_texts()
    assert kinds == [e["kind"] for e in app.get_run(run).timeline]
    assert "wait.registered" in kinds
    expect(page.locator("#artifacts pre")).to_contain_text("A draft about ticket-4711")
    with page.expect_download() as download:
        page.get_by_role("link", name="draft.md").click()
    saved = tmp_path / "downloaded.md"
    download.value.save_as(saved)
    on_disk = Path(app.aio.runtime.artifacts_root) / run / "draft.md"
    assert saved.read_bytes() == on_disk.read_bytes()
    shot(page, "run")


def test_a_runs_outbox_intents_are_shown_with_their_state_and_error(
    console: Callable[[keel.App], Console],
    make_app: Callable[..., keel.App],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = make_app()
    app.workflow("mail", version="1")(graph(("enqueue", enqueue), ("wait", outbox_wait)))
    run = app.submit("mail", job_id="outbox-1", input={"to": "ida@example.com"}).run_id
    with serving(monkeypatch) as provider:
        provider.refuse(503)  # every attempt fails: a dead letter
        outbox_drain(app)
    (intent,) = app.effect_intents(run_id=run)
    assert intent["status"] == "dead"
    page = console(app).login(next=f"/ui/runs/{run}")
    row = page.locator("#intents tr.intent")
    expect(row).to_have_count(1)
    expect(row).to_have_class(re.compile(r"\bdead\b"))
    expect(row).to_contain_text(intent["intent_id"])
    expect(row).to_contain_text("rt_mail")
    expect(row).to_contain_text("3 / 3")  # attempts of max_attempts
    expect(row).to_contain_text("ida@example.com")
    expect(row.locator("pre.error")).to_contain_text("gave up after 3 attempts")
    assert len(provider.deliveries) == 0  # shown, not sent


def test_a_failed_runs_error_and_an_approvals_deadline_read_as_plain_text(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    def needs_recipients(state: dict[str, Any]) -> dict[str, Any]:
        return {"out": state["recipients"]}  # KeyError: 'recipients'

    app = register(make_app())
    app.workflow("mailing")(lambda: echo_graph(needs_recipients))  # type: ignore[arg-type]
    failed = app.submit("mailing", job_id="mailing-1", input={"text": "x"}).run_id
    waiting_runs(app, "ticket-2")  # its worker fails the mailing too
    assert app.get_run(failed).status == "failed"
    page = console(app).login(next=f"/ui/runs/{failed}")
    timeline = page.locator("#timeline").inner_text()
    # Text for a person, not JSON's escapes for a script.
    assert "KeyError: 'recipients'" in timeline and "\\u0027" not in timeline, timeline

    page.goto("/ui/approvals")
    meta = page.locator("article.approval p.meta").inner_text()
    assert re.search(r"\(in [^)]+\), then reject", meta), meta


def test_bad_input_is_explained_on_a_page_and_changes_nothing(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = register(make_app())
    (run,) = waiting_runs(app, "ticket-1")
    page = console(app).login()
    response = page.goto("/ui/runs?since=yesterday&status=lost")
    assert response.status == 400
    expect(page.get_by_role("alert").first).to_contain_text("not one of")
    expect(page.locator("body")).to_contain_text("'yesterday' is not a date")
    response = page.goto("/ui/runs/no-such-run")
    assert response.status == 404
    expect(page.locator(".error .message")).to_contain_text("no run 'no-such-run'")

    page.goto("/ui/approvals")
    csrf = page.locator("form.decide input[name=csrf]").get_attribute("value")
    wait_id = app.get_run(run).waits[0]["wait_id"]
    form = {"decision": "approve", "by": "alice", "csrf": csrf, "comment": "x" * 10_001}
    answer = page.request.post(f"/ui/approvals/{wait_id}/decision", form=form)
    assert answer.status == 422 and "comment" in answer.text()
    assert "<html" in answer.text()  # a page for a person, not the API's JSON
    form.update(comment="fine", decision="maybe")
    answer = page.request.post(f"/ui/approvals/{wait_id}/decision", form=form)
    assert answer.status == 400 and "choose approve or reject" in answer.text()
    (wait,) = app.get_run(run).waits
    assert wait["status"] == "pending"


# -- deciding --------------------------------------------------------------------------------


def test_approve_in_the_inbox_and_watch_the_run_complete_on_its_page(
    console: Callable[[keel.App], Console],
    make_app: Callable[..., keel.App],
    db_url: str,
    tmp_path: Path,
) -> None:
    app = register(make_app())
    (run,) = waiting_runs(app, "ticket-77")
    worker = spawn_worker(
        "tests.support.apps.service:app",
        database_url=db_url,
        artifacts_dir=app.aio.runtime.artifacts_root,
        cwd=REPO,
        log=tmp_path / "worker.log",
    )
    try:
        c = console(app)
        watcher = c.login(next=f"/ui/runs/{run}")
        expect(watcher.locator("#summary [data-field=status]")).to_have_text("waiting")
        watcher.evaluate("window.keptAcrossUpdates = true")
        wait_until(lambda: app.workers(), 30, "the worker to announce itself")
        workers_page = c.login(next="/ui/workers")
        expect(workers_page.locator("tr.worker")).to_have_count(1)
        shot(workers_page, "workers")

        inbox = c.login(next="/ui/approvals")
        card = inbox.locator(f"article#{app.get_run(run).waits[0]['wait_id']}")
        expect(card.locator(".payload")).to_contain_text("ticket-77")
        shot(inbox, "approvals")
        card.get_by_label("Your name").fill("alice")
        card.get_by_label("Comment").fill("Looks right.")
        card.get_by_role("button", name="Approve").click()
        expect(inbox.locator("#outcome")).to_contain_text("Recorded: approved by alice")

        # The page the watcher opened before the decision follows the run without a reload.
        expect(watcher.locator("#summary [data-field=status]")).to_have_text("completed")
        expect(watcher.locator("#summary .outcome")).to_contain_text("completed (approved)")
        assert watcher.evaluate("window.keptAcrossUpdates") is True
        shot(watcher, "run-completed")
    finally:
        worker.terminate()
        worker.wait(30)
    details = app.get_run(run)
    assert details.status == "completed"
    (wait,) = details.waits
    assert (wait["decision"], wait["decided_by"], wait["channel"]) == (
        "approved",
        "alice",
        "console",
    )
    assert wait["comment"] == "Looks right."
    assert keel.core.codec.loads(wait["value"])["principal"] == f"token:{fingerprint(ADMIN)}"
    [effect] = details.effects
    assert (effect["status"], effect["attempts"]) == ("sent", 1)


def test_the_workers_and_schedules_pages_follow_the_database_without_a_reload(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    # A long lease: the workers announced by hand below stay live for the whole test.
    app = register(make_app(lease_ttl=600))
    store = app.aio.runtime.store

    def announce(worker_id: str) -> None:
        app.aio.runtime.portal.call(
            store.upsert_worker(worker_id, host="host-a", pid=4242, concurrency=8, workflows=[])
        )

    c = console(app)
    workers = c.login(next="/ui/workers")
    workers.evaluate("window.keptAcrossUpdates = true")
    expect(workers.locator("table.workers")).to_contain_text("No live workers")
    # Twice: a part swapped in once must go on refreshing.
    announce("w-first")
    expect(workers.locator("tr.worker")).to_have_count(1)
    announce("w-second")
    expect(workers.locator("tr.worker")).to_have_count(2)
    expect(workers.locator("table.workers")).to_contain_text("w-second")

    schedules = c.login(next="/ui/schedules")
    schedules.evaluate("window.keptAcrossUpdates = true")
    expect(schedules.locator("table.schedules")).to_contain_text("No schedules")
    app.schedules.create("nightly", "review", every=3600, input={"topic": "x"})
    expect(schedules.locator("tr.schedule")).to_have_count(1)
    app.schedules.create("hourly", "review", every=60, input={"topic": "y"})
    expect(schedules.locator("tr.schedule")).to_have_count(2)
    assert workers.evaluate("window.keptAcrossUpdates") is True
    assert schedules.evaluate("window.keptAcrossUpdates") is True


@pytest.mark.parametrize("finished", [False, True], ids=["run-queued", "run-finished"])
def test_a_decision_made_elsewhere_meanwhile_is_shown_not_overwritten(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App], finished: bool
) -> None:
    app = register(make_app())
    (run,) = waiting_runs(app, "ticket-9")
    page = console(app).login(next="/ui/approvals")
    card = page.locator("article.approval")
    expect(card).to_have_count(1)
    app.reject(run, by="bob", channel="slack", comment="Wrong customer")  # while the page is open
    if finished:  # and a worker finished the run before the click: told the same
        drain(app)
        assert app.get_run(run).status == "completed"
    card.get_by_label("Your name").fill("alice")
    card.get_by_role("button", name="Approve").click()
    outcome = page.locator("#outcome")
    expect(outcome).to_contain_text("Someone decided first")
    expect(outcome).to_contain_text("rejected by bob via slack")
    (wait,) = app.get_run(run).waits
    assert (wait["decision"], wait["decided_by"]) == ("rejected", "bob")


def test_resolve_an_in_doubt_effect_as_not_performed_sends_it_once(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    provider = Provider()
    app, run = in_doubt(make_app, provider, delivered=False)
    page = console(app).login(next=f"/ui/runs/{run}")
    expect(page.locator("tr.effect.in_doubt")).to_have_count(1)
    expect(page.locator("#summary .outcome")).to_contain_text("an effect is in doubt")
    shot(page, "in-doubt")
    inbox = page.context.new_page()
    inbox.goto("/ui/approvals")
    expect(inbox.locator("ul.in-doubt-list li")).to_contain_text("charge")
    inbox.close()
    form = page.locator("form.in-doubt")
    form.get_by_label("Your name").fill("carol")
    form.get_by_role("button", name="It was not performed").click()
    expect(page.locator("#outcome")).to_contain_text("Recorded")
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed"
    assert len(provider.deliveries) == 1, "the provider saw the charge exactly once"
    (wait,) = details.waits
    assert (wait["decision"], wait["decided_by"]) == ("not_performed", "carol")


# -- access ----------------------------------------------------------------------------------


def _decision_form(app: keel.App, wait_id: str, csrf: str) -> dict[str, str]:
    return {"decision": "approve", "by": "mallory", "csrf": csrf, "action_id": "forged-1"}


def test_refused_without_a_token_and_with_a_read_only_token(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = register(make_app())
    (run,) = waiting_runs(app, "ticket-5")
    wait_id = app.get_run(run).waits[0]["wait_id"]
    c = console(app)

    anonymous = c.page()
    anonymous.goto("/ui/approvals")
    assert urlsplit(anonymous.url).path == "/ui/login"  # sent to log in, shown nothing
    expect(anonymous.locator("article.approval")).to_have_count(0)
    shot(anonymous, "login")
    answer = anonymous.request.post(
        f"/ui/approvals/{wait_id}/decision", form=_decision_form(app, wait_id, "x")
    )
    assert answer.status == 401
    anonymous.get_by_label("Token").fill("not-a-token")
    anonymous.get_by_role("button", name="Log in").click()
    expect(anonymous.get_by_role("alert")).to_contain_text("not one this service knows")

    reader = c.login(READER, next="/ui/approvals")
    expect(reader.locator("article.approval")).to_have_count(1)
    expect(reader.locator("form.decide")).to_have_count(0)
    expect(reader.locator("article.approval")).to_contain_text("lacks approvals:write")
    # Even with its own session's valid CSRF token, a read-only session cannot decide.
    csrf = reader.locator("header form.who input[name=csrf]").get_attribute("value")
    answer = reader.request.post(
        f"/ui/approvals/{wait_id}/decision", form=_decision_form(app, wait_id, csrf)
    )
    assert answer.status == 403
    assert "lacks the scope approvals:write" in answer.text()

    runner = c.login(RUNNER, next="/ui/workers")
    assert runner.goto("/ui/runs").status == 403  # runs:write alone reads nothing

    (wait,) = app.get_run(run).waits
    assert wait["status"] == "pending" and wait["decided_by"] is None


def test_an_approver_logs_in_to_the_inbox_and_is_offered_only_pages_it_can_read(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = register(make_app())
    (run,) = waiting_runs(app, "ticket-8")
    c = console(app)

    def log_in(token: str) -> Any:
        page = c.page()
        page.goto("/ui/login")  # as opened from a bookmark: no page asked for
        page.get_by_label("Token").fill(token)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_load_state()
        return page

    def links(page: Any) -> set[str]:
        found = page.locator("a[href^='/ui']").evaluate_all("all => all.map(a => a.pathname)")
        return set(found)

    approver = log_in(APPROVER)
    assert urlsplit(approver.url).path == "/ui/approvals"
    card = approver.locator("article.approval")
    expect(card).to_contain_text(run)
    assert links(approver) == {"/ui/approvals"}  # the brand and the nav; no run page
    # A page it cannot read says so, and leads back to one it can.
    assert approver.goto(f"/ui/runs/{run}").status == 403
    assert links(approver) == {"/ui/approvals"}
    approver.get_by_role("link", name="Back to the approvals").click()
    approver.wait_for_url("**/ui/approvals")
    approver.locator("article.approval").get_by_role("button", name="Approve").click()
    expect(approver.locator("#outcome")).to_contain_text("Recorded: approved")
    assert links(approver) == {"/ui/approvals"}
    assert app.get_run(run).waits[0]["decision"] == "approved"

    reader = log_in(READER)
    assert urlsplit(reader.url).path == "/ui/runs"  # runs:read comes first
    runner = log_in(RUNNER)  # runs:write alone reads no page: the runs say which scope it lacks
    assert urlsplit(runner.url).path == "/ui/runs"
    expect(runner.get_by_role("alert")).to_contain_text("lacks the scope runs:read")
    expect(runner.get_by_role("alert")).to_contain_text("can read no page of the console")
    assert links(runner) == set()


def test_a_forged_csrf_token_changes_nothing(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = register(make_app())
    (run,) = waiting_runs(app, "ticket-6")
    wait_id = app.get_run(run).waits[0]["wait_id"]
    page = console(app).login(next="/ui/approvals")
    real = page.locator("form.decide input[name=csrf]").get_attribute("value")
    for forged in ("", "0" * 64, real[:-1] + ("0" if real[-1] != "0" else "1")):
        answer = page.request.post(
            f"/ui/approvals/{wait_id}/decision", form=_decision_form(app, wait_id, forged)
        )
        assert answer.status == 403, forged
        assert "security token" in answer.text()
    # A script on the page cannot read the session cookie either.
    assert "keel_session" not in page.evaluate("document.cookie")
    (wait,) = app.get_run(run).waits
    assert wait["status"] == "pending"
    assert [e["kind"] for e in app.get_run(run).timeline].count("decision.recorded") == 0


# -- offline ---------------------------------------------------------------------------------


def test_docs_and_console_work_with_the_network_unplugged(
    console: Callable[[keel.App], Console], make_app: Callable[..., keel.App]
) -> None:
    app = register(make_app())
    (run,) = waiting_runs(app, "ticket-3")
    c = console(app)
    page = c.login()
    failed: list[tuple[str, str]] = []
    page.on("requestfailed", lambda request: failed.append((request.url, request.failure or "")))
    page.goto("/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Keel")
    expect(page.locator(".opblock-summary-path").first).to_be_visible()
    shot(page, "docs")
    page.goto("/redoc")
    expect(page.locator(".api-info h1").first).to_contain_text("Keel")
    for path in ("/ui/runs", f"/ui/runs/{run}", "/ui/approvals", "/ui/workers"):
        page.goto(path)
        page.wait_for_load_state("networkidle")
        color = page.evaluate("getComputedStyle(document.querySelector('.top')).backgroundColor")
        assert color == "rgb(31, 78, 121)", f"{path}: the console's stylesheet did not load"
    # ReDoc's attribution logo (its vendor's CDN) is stopped by the page's policy before it is
    # sent; a favicon may be cut short by the next navigation. Nothing else may fail.
    unexpected = [
        (url, why)
        for url, why in failed
        if not (why == "csp" and url.endswith("logo-mini.svg"))
        and not (why == "net::ERR_ABORTED" and url.endswith("favicon.svg"))
    ]
    assert unexpected == [] and c.offsite == []
