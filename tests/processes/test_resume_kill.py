"""A resume that is a new run, its worker SIGKILLed before and after its first checkpoint.

A run paused on a plain `interrupt()` is ended by a state update (the thread is edited); the
`Command(resume=...)` that follows has no run waiting for it, so Keel admits a new run carrying
the command (`paused_without_run`), and a worker starts it on the update's checkpoint. That run
is the one killed here, by real `keel worker` processes of tests/support/apps/threads.py
(`answered`: `ask` takes the answer and posts it, `close` marks the end), at a fault point:

- before anything of it is durable (`run.before_first_checkpoint`), once `ask` has posted the
  answer but before the ledger recorded it (`effect.after_perform`), or once recorded
  (`effect.after_record`): `ask`'s checkpoint never committed, so the next owner starts the run
  again from its admitted command, and `ask` runs again with the same answer;
- in `close`, after `ask`'s checkpoint committed: `ask` is not run again.

A clean worker takes the run over once the dead one's lease expired. What the outside world saw
is counted outside Keel: the HTTP provider's deliveries (one POST each, no deduplication by
header), and the nodes' own executions, a line each appended to a file.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import keel
from keel.testing.http import HttpSink
from tests.support.checks import wait_until
from tests.support.crash import assert_fenced
from tests.support.thread_fleet import Fleet, app_for, fleet_on, received, report
from tests.support.workers import drain

pytestmark = pytest.mark.slow

THREAD = "asked-1"
QUESTION = "which color?"
ANSWER = {"color": "teal", "by": "ana"}


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as provider:
        yield provider


@pytest.fixture
def fleet(db_url: str, sink: HttpSink, tmp_path: Path) -> Iterator[Fleet]:
    with fleet_on(db_url, sink, tmp_path) as harness:
        yield harness


@pytest.fixture
def app(db_url: str, fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> Iterator[keel.App]:
    with app_for(db_url, fleet, monkeypatch) as the_app:
        yield the_app


def paused_then_edited(app: keel.App) -> str:
    """The thread's first run paused on its interrupt, then ended by a state update (worked
    in this process: nothing is killed yet); the paused run's id."""
    paused = app.submit("answered", {"question": QUESTION}, thread_id=THREAD).run_id
    drain(app)
    assert app.get_run(paused).status == "waiting"
    # `update_state` returns once a worker executed the update's run: this process's, below.
    updating = threading.Thread(target=app.update_state, args=(THREAD, {"note": "edited"}))
    updating.start()
    wait_until(lambda: len(app.thread_runs(THREAD)) == 2, 10, "the update's run")
    drain(app)
    updating.join(30)
    assert not updating.is_alive()
    assert app.get_run(paused).status == "cancelled"
    return paused


def executions(fleet: Fleet) -> list[tuple[str, str, Any]]:
    """(node, run id, answer) of each execution of a node past its interrupt, in order."""
    log = fleet.markers / "ran.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [(d["node"], d["run_id"], d["answer"]) for d in map(json.loads, lines)]


def own_checkpoint(app: keel.App, run_id: str) -> bool:
    """Whether the thread's latest checkpoint is one the run wrote (committed)."""
    return bool(app.get_state(THREAD).metadata.get("keel_run_id") == run_id)


@pytest.mark.parametrize(
    ("fault", "committed", "ask_runs"),
    [
        ("run.before_first_checkpoint:answered", False, 1),
        ("effect.after_perform:post_answer", False, 2),
        ("effect.after_record:post_answer", False, 2),
        ("effect.after_record:mark", True, 1),
    ],
)
def test_a_resume_run_killed_before_or_after_its_first_checkpoint_answers_once(
    app: keel.App, fleet: Fleet, sink: HttpSink, fault: str, committed: bool, ask_runs: int
) -> None:
    paused = paused_then_edited(app)
    resumed = app.submit("answered", None, thread_id=THREAD, command={"resume": ANSWER})
    assert resumed.created and resumed.run_id != paused
    run_id = resumed.run_id

    doomed = fleet.crash(fault)
    why = report(app, [paused, run_id], fleet, f"killed at {fault}")
    assert app.get_run(run_id).status == "running", why
    # The kill came where the case says: before the run's first checkpoint, or after it.
    assert own_checkpoint(app, run_id) is committed, why

    fleet.drain()
    details = app.get_run(run_id)
    why = report(app, [paused, run_id], fleet, f"killed at {fault}")
    assert details.status == "completed", why
    assert_fenced(details, [doomed], takeover=True)
    # The provider got the answer once and the end once, whoever performed them.
    answers = received(sink, "/answers")
    assert [(a["thread"], a["answer"]) for a in answers] == [(THREAD, ANSWER)], why
    assert [(m["phase"], m["i"]) for m in received(sink, "/marks")] == [("closed", 0)], why
    keys = {e["name"]: e["idempotency_key"] for e in details.effects}
    assert [a["reference"] for a in answers] == [keys["post_answer"]], why
    # `ask` ran again only where its step was lost, each time with the resume's answer, and
    # only in the new run (the paused one is over).
    ran = executions(fleet)
    assert [r for r in ran if r[0] == "ask"] == [("ask", run_id, ANSWER)] * ask_runs, why
    assert [r[0] for r in ran].count("close") == (2 if committed else 1), why
    state = app.get_state(THREAD)
    assert state.values == {
        "question": QUESTION,
        "note": "edited",
        "answer": ANSWER,
        "marks": ["asked", "closed"],
    }, why
    assert state.next == (), why
    assert app.get_thread(THREAD)["status"] == "idle"
