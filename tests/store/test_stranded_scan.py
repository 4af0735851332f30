"""The stranded-run check (`other_versions`) on both backends: what it finds, and that it never
reads the runs waiting on a served version, however many wait (issue 34).

It runs when a worker starts and every 10 s or 60 s after, on every worker: as a filter over
every unfinished run, it read each waiting run that often."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import keel
from keel.backends.pg_batch import _numbered
from keel.core.store.base import Row, load_queries
from tests.support.sqlite_steps import vm_steps

UNFINISHED = ("queued", "running", "waiting")
COLUMNS = (
    "run_id, job_id, workflow, workflow_version, status, created_at, updated_at, finished_at,"
    " attempt, input_hash, input"
)


def _insert(db_url: str, rows: list[tuple[Any, ...]]) -> None:
    """Runs as (run_id, workflow, version, status, created_at), written straight to keel_runs,
    then fresh planner statistics."""
    values = [
        (run_id, f"job-{run_id}", wf, v, status, at, at, None if status in UNFINISHED else at)
        for run_id, wf, v, status, at in rows
    ]
    if db_url.startswith("sqlite"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as db:
            db.executemany(
                f"INSERT INTO keel_runs ({COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, 'h', '{}')",
                values,
            )
            db.execute("ANALYZE")
        return
    with psycopg.connect(db_url, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO keel_runs ({COLUMNS})"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 1, 'h', '{}')",
                values,
            )
        conn.execute("VACUUM ANALYZE keel_runs")


def _other_versions(app: keel.App, names: list[str], keys: list[str], limit: int) -> list[Row]:
    async def go() -> list[Row]:
        await app.aio.open()
        return await app.aio.runtime.store.other_versions(names, keys, limit)

    rows: list[Row] = app.aio.runtime.portal.call(go())
    return rows


def test_it_finds_the_unfinished_runs_of_every_version_not_served_oldest_first(
    db_url: str, make_app: Callable[..., keel.App]
) -> None:
    """Versions before, between and after the served ones (as text: "10" sorts before "2"),
    every unfinished status, finished runs left out, other workflows left out."""
    rows: list[tuple[Any, ...]] = []
    statuses = [*UNFINISHED, "completed", "failed", "cancelled"]
    for n in range(60):
        wf = "other" if n % 5 == 4 else "w"
        rows.append((f"r{n:03d}", wf, ["1", "10", "2", "3", "0"][n % 5], statuses[n % 6], 100 - n))
    _insert(db_url, rows)
    app = make_app()

    def expected(names: list[str], keys: list[str], limit: int) -> list[str]:
        found = [
            r for r in rows if r[3] in UNFINISHED and r[1] in names and f"{r[1]}@{r[2]}" not in keys
        ]
        return [r[0] for r in sorted(found, key=lambda r: (r[4], r[0]))][:limit]

    cases = [
        (["w"], ["w@2"], 100),
        (["w"], ["w@1", "w@3"], 100),
        (["w", "w", "other"], ["w@10", "other@1"], 100),  # a name twice: each run once
        (["w", "other"], [], 7),
        (["w"], ["w@1", "w@10", "w@2", "w@3"], 100),
        (["nobody"], [], 100),
        ([], ["w@1"], 100),
    ]
    for names, keys, limit in cases:
        got = [r["run_id"] for r in _other_versions(app, names, keys, limit)]
        want = expected(names, keys, limit)
        assert got == want, (names, keys, limit)
        assert want or names in (["nobody"], [], ["w"]), "every case but the empty ones finds runs"
    full = _other_versions(app, ["w"], ["w@2"], 1)[0]
    assert full["status"] in UNFINISHED and full["input"] == "{}"  # whole rows, as before


WAITING = 3000
"""Runs waiting on the served version: what the check must not read."""


def _many_waiting(db_url: str) -> None:
    """WAITING runs waiting on w@1 (served), as many finished, and two stranded on w@0 and
    w@2 (no worker serves them), among them in creation order."""
    rows: list[tuple[Any, ...]] = [
        (f"wait-{i:05d}", "w", "1", "waiting", float(i)) for i in range(WAITING)
    ]
    rows += [(f"done-{i:05d}", "w", "1", "completed", float(i)) for i in range(WAITING)]
    rows += [("old-0", "w", "0", "waiting", 10.5), ("new-2", "w", "2", "queued", 20.5)]
    _insert(db_url, rows)


def _rows_read_on_postgres(db_url: str, name: str, params: dict[str, Any], mode: str) -> int:
    """Rows of keel_runs the query's plan produced or filtered out, as a prepared statement
    under `mode` (Keel's statements get generic plans after the first few executions)."""
    sql, keys = _numbered(load_queries("postgres")[name])
    with psycopg.connect(db_url) as conn:
        literal = psycopg.ClientCursor(conn)
        args = ", ".join(literal.mogrify("%s", (params[str(k)],)) for k in keys)
        conn.execute(f"SET plan_cache_mode = {mode}".encode(), prepare=False)
        conn.execute(f"PREPARE q AS {sql}".encode(), prepare=False)
        row = conn.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE q({args})".encode(), prepare=False
        ).fetchone()
        conn.rollback()
    assert row is not None
    plan = row[0][0]["Plan"]
    assert "Seq Scan" not in json.dumps(plan), f"{name} ({mode}) scans a table: {plan}"
    return _read_from_runs(plan)


def _read_from_runs(node: dict[str, Any]) -> int:
    own = 0
    if node.get("Relation Name") == "keel_runs":
        # A scan run once per loop reports its rows per loop.
        per_loop = sum(
            int(node.get(k, 0))
            for k in ("Actual Rows", "Rows Removed by Filter", "Rows Removed by Index Recheck")
        )
        own = per_loop * int(node.get("Actual Loops", 1))
    return own + sum(_read_from_runs(child) for child in node.get("Plans", []))


def _steps_on_sqlite(db_url: str, name: str, params: dict[str, Any]) -> tuple[int, list[Any]]:
    """SQLite virtual-machine steps (in hundreds) of the query, and what it found."""
    return vm_steps(db_url, load_queries("sqlite")[name], params)


PARAMS: dict[str, dict[str, Any]] = {
    "unfinished_versions": {"names": json.dumps(["w"])},
    "unfinished_runs_of": {"pairs": json.dumps([["w", "0"], ["w", "2"]]), "limit": 100},
}


def test_the_check_reads_a_few_rows_however_many_runs_wait(
    db_url: str, make_app: Callable[..., keel.App]
) -> None:
    """Thousands of runs waiting on the served version (and as many finished): the check
    probes the index once per version and reads the two stranded runs, none of the others.
    The filter it replaced read every waiting run (on PostgreSQL under a generic plan, a
    sequential scan of every run)."""
    _many_waiting(db_url)
    found = _other_versions(make_app(), ["w"], ["w@1"], 100)
    assert [r["run_id"] for r in found] == ["old-0", "new-2"]
    if db_url.startswith("sqlite"):
        for name, params in PARAMS.items():
            steps, rows = _steps_on_sqlite(db_url, name, params)
            assert rows, name
            # The filter it replaced took ~1,100 hundred steps here (every run, in order).
            assert steps < 20, f"{name} took {steps} hundred steps"
        return
    for name, params in PARAMS.items():
        for mode in ("force_custom_plan", "force_generic_plan"):
            read = _rows_read_on_postgres(db_url, name, params, mode)
            assert read < 20, f"{name} ({mode}) read {read} rows of keel_runs"


@pytest.mark.parametrize("name", list(PARAMS))
def test_sqlite_answers_the_check_from_the_unfinished_runs_index(name: str, tmp_path: Path) -> None:
    """SQLite uses a partial index only for a query that repeats its WHERE term: a status list
    written differently would silently scan every run."""
    url = tmp_path / "plan.db"
    with keel.App(f"sqlite:///{url}") as app:
        app.migrate()
    with sqlite3.connect(url) as db:
        plan = [
            row[-1]
            for row in db.execute(
                f"EXPLAIN QUERY PLAN {load_queries('sqlite')[name]}", PARAMS[name]
            )
        ]
    assert any("USING INDEX keel_runs_unfinished" in step for step in plan), plan
    assert not any(step.startswith("SCAN r") for step in plan), plan
