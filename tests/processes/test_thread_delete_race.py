"""Deleting a thread while other processes admit runs on it, on both backends.

`delete_thread` takes the thread's row and checks for unfinished runs in the transaction that
deletes it; an admission on the thread takes the same row (`take_thread`) before it places its
run. So of a deletion and an admission racing, one goes first on the database, whole: either
the deletion finds the admitted run and is refused (ThreadBusy), or it deletes the thread and
the admission makes the thread again, a new one of the same id (its `first_seq` past the old
thread's runs), with the run on it. Never a run queued on a thread gone, or on the deleted
thread's place in the order (where no thread would ever run it), and never a thread half
deleted (its row kept and its checkpoints gone, or the other way round).

Each round releases SUBMITTERS `tests.support.thread_racer` processes, each admitting RUNS
turns one after the other, and a deleter process at one instant, on a thread with a finished
turn and its checkpoints; the deleter goes a few milliseconds before or after the others,
drawn from a seeded `random.Random` (in the first two rounds: before any is sent, or once
they all answered, so that both outcomes are judged whatever the machine's speed). Then the
thread, its runs and its checkpoints are read straight from the tables (sqlite3 or psycopg,
not through Keel) and judged by what the deleter was answered. Nothing executes the admitted
runs: they stay queued, so what each round left is what the race made of it.
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx
import psycopg
import pytest

import keel
from tests.support.apps import service
from tests.support.line_process import LineProcess
from tests.support.service_client import ADMIN, bearer, start_serve
from tests.support.thread_graphs import register
from tests.support.workers import drain

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("KEEL_TEST_SEED", "31"))
ROUNDS = 30
SUBMITTERS = 3
RUNS = 2
LEAD = 0.15
"""Seconds between sending a round's commands and its start instant."""
WITHIN = 20.0
When = float | Literal["before", "after"]
"""When the deleter goes in a round: seconds after the submitters' start, or once they (or it)
have all been answered (the first two rounds, one of each, so both judgements are exercised)."""


@dataclass
class Left:
    """What a round left of its thread, read from the tables."""

    first_seq: int | None  # None: no thread row
    runs: list[tuple[str, str, int]]  # (run_id, status, thread_seq) in thread order
    checkpoints: int


def left(db_url: str, thread: str) -> Left:
    queries = (
        "SELECT first_seq FROM keel_threads WHERE thread_id = {p}",
        "SELECT run_id, status, thread_seq FROM keel_runs WHERE thread_id = {p} "
        "ORDER BY thread_seq",
        "SELECT COUNT(*) FROM checkpoints WHERE thread_id = {p}",
    )
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        try:
            rows = [conn.execute(q.format(p="?"), (thread,)).fetchall() for q in queries]
        finally:
            conn.close()
    else:
        with psycopg.connect(db_url, autocommit=True) as pg:
            rows = [pg.execute(q.format(p="%s"), (thread,)).fetchall() for q in queries]
    found, runs, (checkpoints,) = rows
    return Left(
        first_seq=int(found[0][0]) if found else None,
        runs=[(str(r), str(s), int(q)) for r, s, q in runs],
        checkpoints=int(checkpoints[0]),
    )


@pytest.fixture
def racers(db_url: str, tmp_path: Path) -> Iterator[tuple[list[LineProcess], LineProcess]]:
    """The submitters and the deleter, started together and connected."""
    submitters = [
        LineProcess("tests.support.thread_racer", db_url, tmp_path / f"submit-{i}.log", "submit")
        for i in range(SUBMITTERS)
    ]
    deleter = LineProcess("tests.support.thread_racer", db_url, tmp_path / "delete.log", "delete")
    try:
        yield [one.ready() for one in submitters], deleter.ready()
    finally:
        for one in [*submitters, deleter]:
            one.kill()


def timings(backend: str) -> list[When]:
    """When the deleter goes in each round: first, last, then within the few milliseconds the
    submitters' admissions take."""
    rng = random.Random(f"{SEED}:delete-race:{backend}")
    return ["before", "after", *(rng.uniform(-0.006, 0.006) for _ in range(ROUNDS - 2))]


class Submissions(Protocol):
    def start(self, at: float) -> None:
        """Send the round's submissions, released at `at` (epoch seconds)."""

    def wait(self) -> None:
        """Until every submission of the round is answered."""


@dataclass
class ByProcesses:
    """RUNS turns from each submitter process, through the Python API."""

    submitters: list[LineProcess]
    thread: str
    answers: list[dict[str, Any] | None] = field(default_factory=list)

    def start(self, at: float) -> None:
        for one in self.submitters:
            one.send({"thread": self.thread, "at": at, "runs": RUNS})

    def wait(self) -> None:
        self.answers = [one.answer(WITHIN) for one in self.submitters]


def race(when: When, deleter: LineProcess, thread: str, submissions: Submissions) -> Any:
    """Release the submissions and the deleter in the order `when` says; the deleter's
    answer (None if it gave none)."""
    if when == "before":
        deleter.send({"thread": thread, "at": 0.0})
        verdict = deleter.answer(WITHIN)
        submissions.start(0.0)
        submissions.wait()
        return verdict
    if when == "after":
        submissions.start(0.0)
        submissions.wait()
        deleter.send({"thread": thread, "at": 0.0})
        return deleter.answer(WITHIN)
    at = time.time() + LEAD
    submissions.start(at)
    deleter.send({"thread": thread, "at": at + when})
    verdict = deleter.answer(WITHIN)
    submissions.wait()
    return verdict


def said_when(when: When) -> str:
    return f"deleter {when}" if isinstance(when, str) else f"deleter at {when * 1000:+.1f} ms"


def test_a_thread_deleted_while_runs_are_admitted_on_it_is_gone_whole_or_kept_whole(
    db_url: str, backend: str, racers: tuple[list[LineProcess], LineProcess]
) -> None:
    submitters, deleter = racers
    threads = [f"doomed-{i}" for i in range(ROUNDS)]
    with register(keel.App(db_url)) as app:
        # Each thread with a finished turn: runs of it stay, checkpoints a deletion takes.
        for thread in threads:
            app.submit("chat", {"messages": [("human", "before")]}, thread_id=thread)
        drain(app)
    before = {t: left(db_url, t) for t in threads}
    outcomes: list[str] = []
    for round_, (thread, when) in enumerate(zip(threads, timings(backend), strict=True)):
        (old,) = before[thread].runs
        assert old[1] == "completed" and before[thread].checkpoints > 0, before[thread]
        submissions = ByProcesses(submitters, thread)
        verdict = race(when, deleter, thread, submissions)
        answers = submissions.answers
        where = f"round {round_} (seed {SEED}, {said_when(when)})"
        assert None not in answers and verdict is not None, f"{where}: {answers} {verdict}"
        said = [a for a in [*answers, verdict] if a is not None]
        assert not [a for a in said if "error" in a], f"{where}: {said}"
        admitted = {r for a in said[:-1] for r in a["runs"]}
        now = left(db_url, thread)
        where += f": deleter said {verdict['deleted']}, left {now}"
        assert len(admitted) == SUBMITTERS * RUNS, where

        # Every admitted run is on the table, queued, on the thread as it stands: none on a
        # thread gone, nor before its first place (the deleted thread's order).
        assert now.first_seq is not None, where
        queued = {r: seq for r, status, seq in now.runs if status == "queued"}
        assert set(queued) == admitted, where
        assert all(seq >= now.first_seq for seq in queued.values()), where
        places = list(range(old[2] + 1, old[2] + 1 + len(queued)))
        assert sorted(queued.values()) == places, where  # one after the other, after the old
        assert old in now.runs, where  # what the old turn did stays on record
        if verdict["deleted"] == "deleted":
            # Deleted before any admission: the thread the submitters made again is new, with
            # none of the old one's checkpoints.
            assert now.first_seq == old[2] + 1 and now.checkpoints == 0, where
        else:
            # Refused: an admission went first, and the thread is the old one, whole.
            assert verdict["deleted"] == "busy", where
            assert now.first_seq == 1 and now.checkpoints == before[thread].checkpoints, where
        outcomes.append(verdict["deleted"])
    # The ordered rounds went as they must; the others fell either way.
    assert outcomes[:2] == ["deleted", "busy"], outcomes


@dataclass
class ByHttp:
    """RUNS runs created from each client through the Agent Server, one after the other."""

    clients: list[httpx.Client]
    thread: str
    answers: list[list[httpx.Response]] = field(default_factory=list)
    posting: list[threading.Thread] = field(default_factory=list)

    def start(self, at: float) -> None:
        self.answers = [[] for _ in self.clients]
        for client, got in zip(self.clients, self.answers, strict=True):
            self.posting.append(threading.Thread(target=self._post, args=(client, got, at)))
            self.posting[-1].start()

    def _post(self, client: httpx.Client, got: list[httpx.Response], at: float) -> None:
        time.sleep(max(0.0, at - time.time()))
        body = {"assistant_id": service.WORKFLOW, "input": {"topic": "deleted?"}}
        for _ in range(RUNS):
            got.append(client.post(f"/threads/{self.thread}/runs", json=body))

    def wait(self) -> None:
        for one in self.posting:
            one.join(WITHIN)
        assert not any(one.is_alive() for one in self.posting), "a client got no answer"


def test_a_thread_deleted_while_the_agent_server_admits_runs_on_it_is_not_made_again(
    db_url: str,
    backend: str,
    tmp_path: Path,
    racers: tuple[list[LineProcess], LineProcess],
) -> None:
    """The same race through the Agent Server protocol, whose `POST /threads/{id}/runs`
    rejects a thread that does not exist (`if_not_exists` "reject", its default): a run is
    admitted only on the thread that was there, so a deletion that wins leaves no thread and
    every later submission is answered 404, where the Python API's submit makes it again."""
    _, deleter = racers
    proc, url = start_serve(db_url, tmp_path / "artifacts")
    threads = [f"served-{i}" for i in range(ROUNDS)]
    clients = [httpx.Client(base_url=url, headers=bearer(ADMIN), timeout=30) for _ in range(3)]
    try:
        with service.register(keel.App(db_url)) as app:
            for thread in threads:
                app.create_thread(service.WORKFLOW, thread_id=thread)
        outcomes: list[str] = []
        for round_, (thread, when) in enumerate(zip(threads, timings(backend), strict=True)):
            submissions = ByHttp(clients, thread)
            verdict = race(when, deleter, thread, submissions)
            answers = submissions.answers
            said = [(a.status_code, a.text[:200]) for got in answers for a in got]
            now = left(db_url, thread)
            where = (
                f"round {round_} (seed {SEED}, {said_when(when)}): deleter said {verdict}, "
                f"left {now}, answers {said}"
            )
            assert verdict is not None and "error" not in verdict, where
            assert {code for code, _ in said} <= {200, 404}, where
            admitted = {a.json()["run_id"] for got in answers for a in got if a.status_code == 200}
            queued = {r for r, status, _ in now.runs if status == "queued"}
            assert queued == admitted, where
            if verdict["deleted"] == "deleted":
                # Gone, and not made again: every submission after the deletion was refused.
                assert now.first_seq is None and not admitted, where
            else:
                assert verdict["deleted"] == "busy" and now.first_seq == 1, where
                assert len(admitted) == len(clients) * RUNS, where
            outcomes.append(verdict["deleted"])
        assert outcomes[:2] == ["deleted", "busy"], outcomes
    finally:
        for client in clients:
            client.close()
        proc.kill()
        proc.communicate(timeout=10)
