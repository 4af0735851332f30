"""A job's admission lock (PostgreSQL) under submitter processes killed or frozen mid-admission.

Admission takes a transaction-scoped advisory lock on (workflow, job) in the same one message as
the admission itself (`lock_job`, then `admit_run`, then COMMIT: keel/core/store/run_queries.py),
so that submissions of one job with different input are judged one after the other. The bound a
frozen submitter may block the others for: none at all, since the server runs a whole message to
its COMMIT without the client (docs/savers.md, keel/backends/pg_batch.py); the backstop for any
Keel transaction left open by a frozen client is `idle_in_transaction_session_timeout`, 10 s
(keel/backends/postgres.py). The tests allow the others less than that backstop, and count the
job's runs with psycopg, not through Keel: one run per job id with the default
`if_exists="reuse"`, whoever dies or freezes when.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from keel.testing.netproxy import NetProxy
from tests.support.line_process import LineProcess

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

RACERS = 3
TRIALS = 12
WITHIN = 8.0
"""Seconds the surviving submitters get: under the 10 s idle-in-transaction backstop, so an
answer that only came once the server ended the frozen one's transaction fails the test."""


@pytest.fixture
def backend() -> str:
    return "postgres"


class Submitter(LineProcess):
    """A `tests.support.submitter` process: one submit per command."""

    def __init__(self, url: str, log: Path) -> None:
        super().__init__("tests.support.submitter", url, log)

    def submit(self, job: str, given: dict[str, Any], at: float) -> None:
        self.send({"job": job, "input": given, "at": at})


@pytest.fixture
def submitters(db_url: str, tmp_path: Path) -> Iterator[Any]:
    started: list[Submitter] = []

    def start(url: str = db_url) -> Submitter:
        one = Submitter(url, tmp_path / f"submitter-{len(started)}.log")
        started.append(one)
        return one

    yield start
    for one in started:
        one.kill()


def job_runs(db_url: str, job: str) -> list[dict[str, Any]]:
    """The job's runs, read straight from the table (not through Keel)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT run_id, input FROM keel_runs WHERE job_id = %s ORDER BY run_id", (job,)
        ).fetchall()
    return [{"run_id": r[0], "input": r[1]} for r in rows]


def ticket(n: str) -> dict[str, Any]:
    return {"ticket": n, "work": 0.0}


def test_submitters_killed_or_frozen_mid_admission_leave_one_run_per_job(
    db_url: str, submitters: Any
) -> None:
    """Each trial releases RACERS processes at one instant on one job id, each with its own
    input, and SIGKILLs or SIGSTOPs one of them 0-30 ms later (before, during or after its
    admission): the others answer while it is still frozen, all with the same run, and the
    table holds exactly one run for the job."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    crew = [submitters() for _ in range(RACERS)]
    spare = submitters()
    for one in crew:
        one.ready()
    reused = 0
    for trial in range(TRIALS):
        job = f"race-{trial}"
        at = time.time() + 0.2
        for i, one in enumerate(crew):
            one.submit(job, ticket(f"T{trial}-{i}"), at)
        victim = rng.randrange(RACERS)
        how = rng.choice([signal.SIGKILL, signal.SIGSTOP])
        time.sleep(max(0.0, at - time.time()) + rng.uniform(0.0, 0.03))
        crew[victim].signal(how)
        answers = [one.answer(WITHIN) for i, one in enumerate(crew) if i != victim]
        where = f"trial {trial} (seed {seed}, victim {victim} {how.name})"
        assert None not in answers, f"{where}: a submitter was blocked: {answers}"
        if how == signal.SIGSTOP:
            assert crew[victim].proc.poll() is None  # still frozen while the others answered
        crew[victim].kill()
        runs = job_runs(db_url, job)
        assert len(runs) == 1, f"{where}: {runs}"
        assert {a["run_id"] for a in answers if a} == {runs[0]["run_id"]}, (where, answers)
        assert sum(bool(a and a["created"]) for a in answers) <= 1, (where, answers)
        reused += sum(bool(a and not a["created"]) for a in answers)
        crew[victim] = spare.ready()
        spare = submitters()
    # The race was real: submitters with other input were handed the job's one run.
    assert reused >= TRIALS


def test_a_submitter_frozen_awaiting_its_admission_blocks_no_one(
    db_url: str, submitters: Any
) -> None:
    """The strongest form: a submitter sends its admission through a proxy that holds the
    server's replies, so it is stuck inside `submit` (inside its transaction, as far as it can
    tell), and is then frozen with SIGSTOP as well. The admission ran on the server all the
    same, lock and COMMIT included: other submitters of the job, with other input, are answered
    at once with its run while it stays frozen, and once it is SIGKILLed the job still has one
    run. (Were the lock taken in a message of its own, answered before the admission is sent,
    the frozen submitter would hold it until the server's 10 s idle-in-transaction timeout.)"""
    parts = urlsplit(db_url)
    with NetProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        held = submitters(proxy.url_for(db_url)).ready()
        others = [submitters().ready() for _ in range(2)]
        for trial in range(3):
            job = f"held-{trial}"
            proxy.hold_replies(120.0)
            held.submit(job, ticket(f"H{trial}"), time.time())
            # The server answered its admission; the answer waits in the proxy.
            deadline = time.monotonic() + 20
            while not proxy.counters().held:
                assert time.monotonic() < deadline, "the held admission was never answered"
                time.sleep(0.02)
            held.signal(signal.SIGSTOP)
            at = time.time()
            for i, one in enumerate(others):
                one.submit(job, ticket(f"O{trial}-{i}"), at)
            answers = [one.answer(WITHIN) for one in others]
            assert None not in answers, f"trial {trial}: blocked by the frozen submitter"
            assert held.proc.poll() is None and held.answer(0) is None  # still stuck and frozen
            # Its admission came first and committed: the others were handed its run.
            (first,) = job_runs(db_url, job)
            assert json.loads(first["input"]) == ticket(f"H{trial}")
            assert [a["run_id"] for a in answers if a] == [first["run_id"]] * len(others)
            assert not any(a and a["created"] for a in answers)
            held.kill()
            assert job_runs(db_url, job) == [first]
            proxy.heal()
            if trial < 2:
                held = submitters(proxy.url_for(db_url)).ready()
