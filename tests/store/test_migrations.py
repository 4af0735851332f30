"""Schema migrations: fresh, upgrade with data, idempotent, concurrent, and a clear refusal."""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import keel
from keel.core.codec import canonical_json
from keel.core.effects.keys import legacy_key
from keel.core.errors import SchemaMismatch
from keel.core.ids import StepRef, input_hash, run_id
from keel.core.store.base import load_migrations
from keel.testing.postgres import drop_database
from tests.support.graphs import echo_graph, notify_effect
from tests.support.providers import Provider
from tests.support.workers import drain

PG_URL = os.environ.get("KEEL_TEST_POSTGRES_URL", "postgresql://keel:keel@127.0.0.1:5432/keel")
MIGRATIONS = load_migrations("sqlite")
NAMES = [m.name for m in MIGRATIONS]
# Numbers are taken by branches in parallel, so the list may have gaps until they all land.
VERSIONS = [m.version for m in MIGRATIONS]
LATEST = VERSIONS[-1]


@pytest.fixture
def empty_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database with nothing in it: no Keel tables, no checkpoint tables."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path}/empty.db"
        return
    request.getfixturevalue("pg_template")  # the suite's skip / KEEL_REQUIRE_POSTGRES policy
    name = f"keel_e_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"{PG_URL.rpartition('/')[0]}/{name}"
    drop_database(PG_URL, name)


@pytest.fixture
def apps(empty_url: str, tmp_path: Path) -> Iterator[Any]:
    made: list[keel.App] = []

    def make() -> keel.App:
        app = keel.App(empty_url, artifacts_dir=tmp_path / "artifacts")
        app.workflow("echo")(echo_graph)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()


def version(app: keel.App) -> int:
    rt = app.aio.runtime
    rt.portal.call(rt.connector.open())  # without the schema check App.open() would do
    return rt.portal.call(rt.store.schema_version())


def execute(url: str, sql: str) -> list[Any]:
    """Raw SQL on the database, outside Keel (what the test checks is Keel's doing)."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as lite:
            return lite.execute(sql).fetchall()
    with psycopg.connect(url) as conn:
        cur = conn.execute(sql)
        return cur.fetchall() if cur.description else []


def admit_by_hand(app: keel.App, workflow: str, job_id: str, value: Any) -> dict[str, Any]:
    """A run as an old schema admitted it, written by hand in its columns of version 1 (today's
    admission writes columns that old schemas lack: not_before, migration 0026)."""
    text = canonical_json(value)
    rid = run_id(job_id, workflow, "1", text, 1)
    execute(
        app.url,
        "INSERT INTO keel_runs (run_id, job_id, workflow, workflow_version, attempt, input_hash, "
        f"input, status, created_at, updated_at) VALUES ('{rid}', '{job_id}', '{workflow}', '1', "
        f"1, '{input_hash(workflow, '1', text)}', '{text}', 'queued', 1.7e9, 1.7e9)",
    )
    execute(
        app.url,
        f"INSERT INTO keel_events (run_id, at, kind, data) VALUES ('{rid}', 1.7e9, 'admitted', "
        "'{}')",
    )
    rt = app.aio.runtime
    row = rt.portal.call(rt.store.get_run(rid))
    assert row is not None
    return dict(row)


def recorded_versions(app: keel.App) -> list[int]:
    return sorted(r[0] for r in execute(app.url, "SELECT version FROM keel_schema_migrations"))


def test_fresh_database_migrates_to_the_latest_version(apps: Any) -> None:
    app = apps()
    assert version(app) == 0
    assert app.migrate() == NAMES
    assert version(app) == LATEST == app.aio.runtime.store.latest_version
    assert recorded_versions(app) == VERSIONS
    # Everything a run needs exists, LangGraph's checkpoint tables included.
    run = app.submit("echo", job_id="j-1", input={"text": "ok"})["run_id"]
    drain(app)
    assert app.get_run(run).output == {"text": "ok", "out": "OK"}


def test_migrating_twice_is_a_no_op(apps: Any) -> None:
    app = apps()
    app.migrate()
    run = app.submit("echo", job_id="j-1", input={"text": "kept"})
    assert app.migrate() == []
    assert apps().migrate() == []  # and from another App
    assert recorded_versions(app) == VERSIONS
    assert app.get_run(run["run_id"]).run == run


def test_upgrade_from_version_1_keeps_existing_runs(apps: Any) -> None:
    old = apps()
    rt = old.aio.runtime
    rt.portal.call(rt.connector.open())
    assert rt.portal.call(rt.store.migrate(target=1)) == NAMES[:1]
    assert version(old) == 1
    row = admit_by_hand(old, "echo", "legacy-1", {"text": "from v1"})
    old.close()

    new = apps()
    assert new.migrate() == NAMES[1:]
    assert version(new) == LATEST
    upgraded = new.get_run(row["run_id"])
    assert {k: upgraded.run[k] for k in row} == row  # every v1 column kept its value
    assert "heartbeat_at" in upgraded.run  # a column added by a later migration
    # Admitted before 0032 and claimed after: only a first claim decides how a run's effects
    # are keyed (keel.core.effects.keys), so a run an older worker started keeps its keys.
    assert upgraded.run["effect_keys"] == 1
    started = new.submit("echo", job_id="j-started", input={"text": "started"})["run_id"]
    execute(new.url, f"UPDATE keel_runs SET started_at = 1 WHERE run_id = '{started}'")
    assert [e["kind"] for e in upgraded.timeline] == ["admitted"]
    assert (
        new.aio.runtime.portal.call(new.aio.runtime.store.workers(3600)) == []
    )  # a table added later
    drain(new)
    assert new.get_run(row["run_id"]).output == {"text": "from v1", "out": "FROM V1"}
    assert new.get_run(row["run_id"]).run["effect_keys"] == 2  # first claimed by this Keel
    assert new.get_run(started).run["effect_keys"] == 1


def test_app_on_unmigrated_database_raises_schema_mismatch(apps: Any) -> None:
    app = apps()
    with pytest.raises(SchemaMismatch, match="keel migrate") as info:
        app.submit("echo", job_id="j-1", input={})
    assert "version 0" in str(info.value)
    with pytest.raises(SchemaMismatch, match="keel migrate"):
        app.list_runs()


def test_app_on_partly_migrated_database_raises_schema_mismatch(apps: Any) -> None:
    old = apps()
    old.aio.runtime.portal.call(old.aio.runtime.connector.open())
    old.aio.runtime.portal.call(old.aio.runtime.store.migrate(target=1))
    with pytest.raises(SchemaMismatch, match=r"version 1, older .*keel migrate"):
        apps().submit("echo", job_id="j-1", input={})


def test_app_on_newer_database_says_to_upgrade_keel(apps: Any, empty_url: str) -> None:
    apps().migrate()
    execute(empty_url, "INSERT INTO keel_schema_migrations VALUES (999, 'from the future', 0)")
    with pytest.raises(SchemaMismatch, match=r"newer .*upgrade Keel"):
        apps().list_runs()


def test_concurrent_migrations_all_succeed_and_record_each_version_once(apps: Any) -> None:
    racers = [apps() for _ in range(4)]
    start = threading.Barrier(len(racers))
    applied: list[list[str]] = []
    errors: list[BaseException] = []

    def migrate(app: keel.App) -> None:
        try:
            start.wait(timeout=30)
            applied.append(app.migrate())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=migrate, args=(app,)) for app in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(applied) == len(racers)
    # Each migration was applied by exactly one of them.
    assert sorted(name for names in applied for name in names) == sorted(NAMES)
    assert recorded_versions(racers[0]) == VERSIONS
    run = racers[1].submit("echo", job_id="j-1", input={"text": "x"})["run_id"]
    drain(racers[2])
    assert racers[3].get_run(run).status == "completed"


def test_effects_recorded_before_0006_are_served_by_their_old_keys(apps: Any) -> None:
    """Before 0006 a key hashed the arguments in; a run in flight across the upgrade must find
    its recorded effects under those keys, not perform them again under new ones."""
    old = apps()
    rt = old.aio.runtime
    rt.portal.call(rt.connector.open())
    before = max(v for v in VERSIONS if v < 6)
    rt.portal.call(rt.store.migrate(target=before))
    row = admit_by_hand(old, "notify", "legacy-effect-1", {"text": "hi"})
    where = StepRef(row["run_id"], "echo", 1, "__pregel_pull/echo", namespace="echo")
    key = legacy_key(where, "notify", ("a@x",), {})
    execute(
        old.url,
        "INSERT INTO keel_effects (idempotency_key, run_id, name, node, step, task_path, "
        "args_hash, status, attempts, result, lease_token, created_at, updated_at) VALUES "
        f"('{key}', '{row['run_id']}', 'notify', 'echo', 1, '__pregel_pull/echo', 'h', 'sent', "
        """1, '{"id": "sent-before-the-upgrade"}', 1, 0, 0)""",
    )
    old.close()

    provider = Provider()
    notify = notify_effect(provider)
    new = apps()
    new.workflow("notify")(lambda: echo_graph(lambda state: {"out": notify("a@x")["id"]}))
    new.migrate()
    drain(new)
    done = new.get_run(row["run_id"])
    assert (done.status, done.output["out"]) == ("completed", "sent-before-the-upgrade")
    assert provider.calls == []
    assert [e["idempotency_key"] for e in done.effects] == [key]


def test_a_migration_that_landed_after_a_higher_numbered_one_is_still_applied(apps: Any) -> None:
    app = apps()
    rt = app.aio.runtime
    rt.portal.call(rt.connector.open())
    # The database has every migration but one in the middle (as if that branch landed later).
    skipped = MIGRATIONS[-2]
    rt.portal.call(rt.store.migrate(target=MIGRATIONS[-3].version))
    [higher] = [m for m in MIGRATIONS if m.version == LATEST]
    with_higher = [
        s for m in load_migrations(rt.dialect) if m.version == LATEST for s in m.statements
    ]
    for statement in with_higher:
        execute(app.url, statement)
    execute(
        app.url,
        "INSERT INTO keel_schema_migrations (version, name, applied_at) "
        f"VALUES ({higher.version}, '{higher.name}', 0)",
    )
    assert skipped.version < higher.version
    assert rt.portal.call(rt.store.migrate()) == [skipped.name]
    assert recorded_versions(app) == VERSIONS


def test_a_thread_made_again_before_0035_keeps_only_its_own_runs(apps: Any) -> None:
    """Before 0035 a thread made again under a deleted one's id took that one's runs: the
    upgrade gives each thread the place of its first run admitted since its row was made."""
    old = apps()
    rt = old.aio.runtime
    rt.portal.call(rt.connector.open())
    rt.portal.call(rt.store.migrate(target=max(v for v in VERSIONS if v < 35)))
    for thread in ("t-again", "t-plain", "t-empty"):
        execute(
            old.url,
            "INSERT INTO keel_threads (thread_id, workflow, workflow_version, metadata, "
            f"created_at, updated_at) VALUES ('{thread}', 'echo', '1', '{{}}', 100, 100)",
        )
    # (thread, place, admitted at): before 100, a deleted thread's of the same id.
    placed = [("t-again", 1, 50), ("t-again", 2, 60), ("t-again", 3, 150), ("t-plain", 1, 120)]
    for n, (thread, seq, at) in enumerate([*placed, ("t-empty", 1, 50)]):
        execute(
            old.url,
            "INSERT INTO keel_runs (run_id, job_id, workflow, workflow_version, attempt, "
            "input_hash, input, status, created_at, updated_at, thread_id, thread_seq) VALUES "
            f"('r{n}', 'j{n}', 'echo', '1', 1, 'h', '{{}}', 'failed', {at}, {at}, '{thread}', "
            f"{seq})",
        )
    old.close()
    new = apps()
    new.migrate()
    found = {t: new.get_thread(t) for t in ("t-again", "t-plain", "t-empty")}
    assert {t: (row["first_seq"], row["runs"]) for t, row in found.items()} == {
        "t-again": (3, 1),
        "t-plain": (1, 1),
        "t-empty": (2, 0),
    }
    assert found["t-empty"]["status"] == "idle"
    assert [r["run_id"] for r in new.thread_runs("t-again")] == ["r2"]
