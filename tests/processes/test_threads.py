"""Threads under real `keel worker` processes SIGKILLed at fault points, on both backends
(issue 31).

The workflows are tests/support/apps/threads.py; every effect POSTs to a real HTTP provider on
127.0.0.1 that counts every POST (no deduplication by header), so a second send would be a
second delivery. Each test counts what the provider received, not what Keel believes:

- a six-turn conversation, its worker killed at a seeded random fault point in every turn and
  restarted: each turn's effect delivered once, the turns in submission order, and the final
  state LangGraph's own (`InMemorySaver`, the effect stubbed);
- twenty clients submitting at once on one thread, each from an App (connections) of its own:
  `reject` admits exactly one; `enqueue` admits all twenty, which run one at a time in their
  thread order across a kill, each run's start after the previous run's end at the provider;
- `interrupt` and `rollback` while the first run is in the middle, the worker killed as the
  first stops and again as the second starts: both runs end, nothing is sent twice, the first
  run's effects stay in its ledger and, rolled back, its checkpoints leave the history.

The fault points are drawn from `random.Random` seeded with $KEEL_TEST_SEED (31 by default) and
the backend; each assertion message names the points drawn.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

import keel
from keel.core.codec import loads
from keel.core.errors import ThreadBusy
from keel.runtime.records import RunDetails
from keel.testing.http import HttpSink
from tests.support.apps import threads
from tests.support.checks import wait_until
from tests.support.crash import KILLED, WORKER_TIMEOUT, assert_fenced
from tests.support.thread_fleet import Fleet, app_for, fleet_on, received, report

pytestmark = pytest.mark.slow

APP = "tests.support.apps.threads:app"
SEED = int(os.environ.get("KEEL_TEST_SEED", "31"))
CLIENTS = 20


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


def rng_for(test: str, backend: str) -> random.Random:
    return random.Random(f"{SEED}:{test}:{backend}")


def seeded(app: keel.App, run_ids: list[str], fleet: Fleet, drawn: object) -> str:
    return report(app, run_ids, fleet, f"seed {SEED}, drawn {drawn}")


def assert_one_at_a_time(details: list[RunDetails]) -> None:
    """Each run (in thread order) was first claimed after the one before it had completed."""
    for before, after in itertools.pairwise(details):
        ended = [e["event_id"] for e in before.timeline if e["kind"] == "status.completed"]
        claimed = [e["event_id"] for e in after.timeline if e["kind"] == "lease.claimed"]
        assert len(ended) == 1 and claimed, (before.run_id, after.run_id)
        assert claimed[0] > ended[0], f"run {after.run_id} started before {before.run_id} ended"


# -- a conversation killed in every turn ---------------------------------------------------------

TURNS = ("hi", "what is a thread?", "and a run?", "why checkpoints?", "ok, thanks", "bye")
SHARP = ("effect.after_perform:post_turn", "effect.after_record:post_turn")
"""Where the provider and the ledger disagree: drawn into every conversation."""
OTHERS = (
    "run.before_first_checkpoint:chat",
    "effect.before_reserve:post_turn",
    "effect.before_call:post_turn",
    # A turn reaches this point seven times: each task's writes (START's, think's, post's,
    # reply's), and each fenced step commit: think's (with the turn's input and START
    # checkpoints), post's, reply's (with the run's end).
    *(f"checkpoint.before_write@{n}" for n in range(1, 8)),
)
FIRST_COMMIT = "checkpoint.before_write@3"
"""Just before a turn's first transaction: of the turn, only its admission is durable."""


def test_a_conversation_killed_in_every_turn_sends_each_turn_once_in_order(
    app: keel.App, fleet: Fleet, sink: HttpSink, backend: str
) -> None:
    rng = rng_for("conversation", backend)
    drawn = [*SHARP, *rng.sample(OTHERS, len(TURNS) - len(SHARP))]
    rng.shuffle(drawn)
    thread = "conversation-1"
    run_ids: list[str] = []
    for turn, (text, fault) in enumerate(zip(TURNS, drawn, strict=True), 1):
        # A job id per turn: a client that retries a submit it never heard back from gets the
        # same run, not a second turn with the user's message twice.
        given = {"messages": [threads.user_message(turn, text)]}
        job = f"{thread}-turn-{turn}"
        run_id = app.submit("chat", given, thread_id=thread, job_id=job).run_id
        run_ids.append(run_id)
        doomed = fleet.crash(fault)
        why = seeded(app, run_ids, fleet, drawn)
        assert app.get_run(run_id).status == "running", why
        retried = app.submit("chat", given, thread_id=thread, job_id=job)
        assert (retried.run_id, retried.created) == (run_id, False), why
        fleet.drain()
        details = app.get_run(run_id)
        why = seeded(app, run_ids, fleet, drawn)
        assert details.status == "completed", why
        assert [e["status"] in ("sent", "confirmed") for e in details.effects] == [True], why
        assert_fenced(details, [doomed], takeover=True)
    why = seeded(app, run_ids, fleet, drawn)

    # The provider got each turn once, in the order the turns were submitted ...
    posts = received(sink, "/turns")
    assert [(p["turn"], p["text"]) for p in posts] == list(enumerate(TURNS, 1)), why
    assert {p["thread"] for p in posts} == {thread}, why
    # ... each under the key its run's ledger holds, and no key twice.
    keys = [app.get_run(r).effects[0]["idempotency_key"] for r in run_ids]
    assert [p["reference"] for p in posts] == keys, why
    assert Counter(keys).most_common(1)[0][1] == 1, why

    # The thread holds the turns in submission order; each ran after the one before ended.
    runs = app.thread_runs(thread)
    assert [(r["run_id"], r["thread_seq"]) for r in runs] == list(
        zip(run_ids, range(1, len(TURNS) + 1), strict=True)
    ), why
    assert_one_at_a_time([app.get_run(r) for r in run_ids])

    # The state is what LangGraph alone makes of the same turns, crash-free.
    def stub(thread: str, turn: int, text: str) -> dict[str, Any]:
        return {"delivery": turn}  # the provider numbers deliveries; each turn made one

    oracle = threads.chat_graph(stub).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": thread}}
    for turn, text in enumerate(TURNS, 1):
        oracle.invoke({"messages": [threads.user_message(turn, text)]}, config)
    expected = oracle.get_state(config)
    state = app.get_state(thread)
    assert state.values == expected.values, why
    assert state.next == expected.next == (), why
    assert app.get_thread(thread)["status"] == "idle", why


def test_a_turn_killed_before_its_first_commit_starts_again_from_its_admitted_input(
    app: keel.App, fleet: Fleet, sink: HttpSink
) -> None:
    """A later turn's input and START checkpoints wait for its first step's transaction: killed
    just before it, the thread shows nothing of the turn, and the next worker starts the turn
    again on the thread's state, from its admission. The turn is posted once, and the thread
    holds each turn once, as LangGraph alone makes it."""
    thread = "conversation-first-commit"
    turns = ("hi", "what is a thread?")
    first = {"messages": [threads.user_message(1, turns[0])]}
    app.submit("chat", first, thread_id=thread, job_id=f"{thread}-1")
    fleet.drain()
    before = app.get_state(thread)
    second = {"messages": [threads.user_message(2, turns[1])]}
    run_id = app.submit("chat", second, thread_id=thread, job_id=f"{thread}-2").run_id
    doomed = fleet.crash(FIRST_COMMIT)
    assert app.get_run(run_id).status == "running"
    during = app.get_state(thread)
    assert (during.values, during.config) == (before.values, before.config)
    fleet.drain()
    details = app.get_run(run_id)
    assert details.status == "completed", details.timeline
    assert_fenced(details, [doomed], takeover=True)
    posts = received(sink, "/turns")
    assert [(p["turn"], p["text"]) for p in posts] == list(enumerate(turns, 1))

    def stub(thread: str, turn: int, text: str) -> dict[str, Any]:
        return {"delivery": turn}

    oracle = threads.chat_graph(stub).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": thread}}
    for turn, text in enumerate(turns, 1):
        oracle.invoke({"messages": [threads.user_message(turn, text)]}, config)
    assert app.get_state(thread).values == oracle.get_state(config).values
    sources = [h.metadata.get("source") for h in app.get_history(thread, limit=50)]
    assert sources.count("input") == 2, sources


# -- twenty clients at once ----------------------------------------------------------------------


def at_once(db_url: str, submit: Callable[[keel.App, int], Any]) -> list[Any]:
    """`submit(app, i)` from CLIENTS OS threads released together, each with an App (and its
    database connections) of its own: its result, or the exception it raised."""
    start = threading.Barrier(CLIENTS)
    results: list[Any] = [None] * CLIENTS

    def client(i: int) -> None:
        try:
            with threads.register(keel.App(db_url)) as app:
                app.database_now()  # connected before the start line
                start.wait(timeout=60)
                results[i] = submit(app, i)
        except Exception as exc:
            results[i] = exc

    clients = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for c in clients:
        c.start()
    for c in clients:
        c.join(120)
    assert not any(c.is_alive() for c in clients)
    return results


def test_twenty_clients_rejecting_on_one_thread_admit_exactly_one(
    app: keel.App, db_url: str, sink: HttpSink
) -> None:
    thread = "reject-1"

    def submit(client: keel.App, i: int) -> Any:
        given = {"i": i, "hold": True}
        return client.submit("ordered", given, thread_id=thread, multitask_strategy="reject")

    results = at_once(db_url, submit)
    refused = [r for r in results if isinstance(r, ThreadBusy)]
    admitted = [r for r in results if not isinstance(r, Exception)]
    assert (len(admitted), len(refused)) == (1, CLIENTS - 1), results
    winner = admitted[0].run_id
    assert {e.active_run for e in refused} == {winner}, results
    assert [r["run_id"] for r in app.thread_runs(thread)] == [winner]

    # The winner runs to its interrupt: the thread waits on it, and twenty more are refused.
    app.run_worker(stop_when_idle=True, handle_signals=False)
    assert app.get_run(winner).status == "waiting"
    assert app.get_thread(thread)["status"] == "interrupted"
    again = at_once(db_url, submit)
    assert all(isinstance(r, ThreadBusy) and r.active_run == winner for r in again), again
    assert [r["run_id"] for r in app.thread_runs(thread)] == [winner]
    # Only the winner ran: it marked its start once.
    assert [(m["phase"], m["i"]) for m in received(sink, "/marks")] == [
        ("start", loads(admitted[0]["input"])["i"])
    ]


ENQUEUED_POINTS = (
    # A resumed first run, then twenty runs of two marks each: mark 1 ends the resumed run,
    # marks 2s and 2s+1 are run s's; run s is the s-th to reach its first checkpoint, and
    # passes nine checkpoint points (a few more before it, the resumed run's).
    ("effect.before_reserve:mark", 4, 37),
    ("effect.after_perform:mark", 4, 37),
    ("effect.after_record:mark", 4, 37),
    ("run.before_first_checkpoint:ordered", 2, 19),
    ("checkpoint.before_write", 20, 160),
)


def test_twenty_enqueued_runs_run_one_at_a_time_in_order_across_a_kill(
    app: keel.App, db_url: str, fleet: Fleet, sink: HttpSink, backend: str
) -> None:
    rng = rng_for("enqueue", backend)
    point, low, high = rng.choice(ENQUEUED_POINTS)
    fault = f"{point}@{rng.randint(low, high)}"
    thread = "queue-1"
    first = app.submit("ordered", {"i": 0, "hold": True}, thread_id=thread).run_id
    app.run_worker(stop_when_idle=True, handle_signals=False)
    assert app.get_run(first).status == "waiting"

    def submit(client: keel.App, i: int) -> Any:
        given = {"i": i + 1, "hold": False}
        return client.submit("ordered", given, thread_id=thread, multitask_strategy="enqueue")

    results = at_once(db_url, submit)
    assert not [r for r in results if isinstance(r, Exception)], results
    runs = app.thread_runs(thread)
    run_ids = [str(r["run_id"]) for r in runs]
    assert [r["thread_seq"] for r in runs] == list(range(1, CLIENTS + 2))
    assert sorted(run_ids[1:]) == sorted(r.run_id for r in results)
    assert {r["status"] for r in runs[1:]} == {"queued"}  # behind the waiting one
    order = [loads(r["input"])["i"] for r in runs]
    # Their places follow the order the database admitted them in, one at a time.
    admitted = [app.get_run(r).timeline[0] for r in run_ids]
    assert [e["kind"] for e in admitted] == ["admitted"] * len(runs)
    assert [e["event_id"] for e in admitted] == sorted(e["event_id"] for e in admitted)

    app.resume(thread, "go on")
    doomed = fleet.crash(fault)
    why = seeded(app, run_ids, fleet, fault)
    # Killed in the middle of the queue: the runs before the one it ran are done, none after
    # it has started.
    statuses = [r["status"] for r in app.thread_runs(thread)]
    killed_at = statuses.index("running")
    assert 0 < killed_at < CLIENTS, why
    assert statuses == (
        ["completed"] * killed_at + ["running"] + ["queued"] * (CLIENTS - killed_at)
    ), why
    fleet.drain()
    why = seeded(app, run_ids, fleet, fault)
    details = [app.get_run(r) for r in run_ids]
    assert {d.status for d in details} == {"completed"}, why

    # At the provider: run after run in thread order, each start after the previous end, and
    # every mark once.
    marks = [(m["phase"], m["i"]) for m in received(sink, "/marks")]
    assert marks == [(phase, i) for i in order for phase in ("start", "end")], why
    keys = [e["idempotency_key"] for d in details for e in d.effects]
    assert sorted(m["reference"] for m in received(sink, "/marks")) == sorted(keys), why
    assert_one_at_a_time(details)
    taken_over = [d for d in details if any(e["kind"] == "lease.takeover" for e in d.timeline)]
    assert len(taken_over) == 1, why
    assert_fenced(taken_over[0], [doomed], takeover=True)
    state = app.get_state(thread).values
    assert state["marks"] == [f"{phase} {i}" for i in order for phase in ("start", "end")], why


# -- interrupt and rollback, killed in the middle ----------------------------------------------

FIRST_STOPPING = "checkpoint.before_write@5"
"""The commit of the first run's step 2, where it learns it must stop: the fifth time, after
START's writes, two for step 1 (its writes, its commit, which takes the input's and START's
checkpoints with it) and step 2's writes."""
SECOND_STARTING = "effect.after_perform:post_step@1"
"""The second run's first effect, performed and not yet recorded. (The first run, taken over
by the same worker, performs nothing: a cancelled run's effects are refused at reservation.)"""


@pytest.mark.parametrize(
    ("strategy", "reason"), [("interrupt", "interrupted"), ("rollback", "rolled_back")]
)
def test_a_run_superseded_in_the_middle_and_killed_twice_loses_and_doubles_nothing(
    app: keel.App, fleet: Fleet, sink: HttpSink, strategy: str, reason: str
) -> None:
    thread = f"{strategy}-1"
    first = app.submit("steps", {"name": "first", "hold": True}, thread_id=thread).run_id
    doomed = fleet.spawn(FIRST_STOPPING)
    wait_until(
        lambda: (fleet.markers / f"{first}.held").exists() or doomed.proc.poll() is not None,
        WORKER_TIMEOUT,
        "the first run to reach its held step",
    )
    assert doomed.proc.poll() is None, doomed.output()
    second = app.submit(
        "steps", {"name": "second", "hold": False}, thread_id=thread, multitask_strategy=strategy
    ).run_id
    why = seeded(app, [first, second], fleet, strategy)
    # Running: it stops at its next step boundary, which is where its worker dies.
    assert app.get_run(first).status == "running", why
    assert "cancel.requested" in [e["kind"] for e in app.get_run(first).timeline], why
    (fleet.markers / f"{first}.go").touch()
    assert doomed.wait() == KILLED, doomed.output()

    # The next worker takes the first over, which stops, and dies as the second starts.
    starting = fleet.crash(SECOND_STARTING)
    why = seeded(app, [first, second], fleet, strategy)
    one = app.get_run(first)
    assert (one.status, one.termination_reason) == ("cancelled", reason), why
    assert app.get_run(second).status == "running", why
    history = {(h.metadata or {}).get("keel_run_id") for h in app.get_history(thread)}
    assert (first in history) == (strategy == "interrupt"), why
    fleet.drain()
    why = seeded(app, [first, second], fleet, strategy)
    one, two = app.get_run(first), app.get_run(second)
    assert (one.status, one.termination_reason) == ("cancelled", reason), why
    assert (two.status, two.termination_reason) == ("completed", "completed"), why
    assert_fenced(one, [doomed], takeover=True)
    assert_fenced(two, [starting], takeover=True)

    # The provider got the first run's two steps and the second's four, each once: neither
    # the first run's step 2 (performed before it stopped) nor the second's step 1 (performed
    # as its worker died) was performed again.
    posts = received(sink, "/steps")
    assert [(p["name"], p["step"]) for p in posts] == [
        ("first", 1),
        ("first", 2),
        *(("second", k) for k in range(1, threads.STEPS + 1)),
    ], why
    # What the first run performed stays in its ledger, whatever became of its checkpoints;
    # the second's first effect was found at the provider by the reconciler, not sent again.
    ledger = {
        e["idempotency_key"]: (e["run_id"], e["status"]) for e in [*one.effects, *two.effects]
    }
    assert len(ledger) == len(posts) == len({p["reference"] for p in posts}), why
    assert [ledger.get(p["reference"]) for p in posts] == [
        (first, "sent"),
        (first, "sent"),
        (second, "confirmed"),
        *((second, "sent") for _ in range(2, threads.STEPS + 1)),
    ], why

    by_run = Counter((h.metadata or {}).get("keel_run_id") for h in app.get_history(thread))
    state = app.get_state(thread).values
    second_done = [f"second {k}" for k in range(1, threads.STEPS + 1)]
    if strategy == "rollback":
        assert first not in by_run, why
        assert state["done"] == second_done, why
    else:
        # Its step 1 committed; its step 2 was stopped by the cancel before it committed.
        assert by_run[first] > 0, why
        assert state["done"] == ["first 1", *second_done], why
    assert by_run[second] > 0, why
    assert app.get_thread(thread)["status"] == "idle", why
