"""The run summary where people read it: `GET /v1/runs/{id}/summary`, `keel runs show`, and the
duration, attempts and time-range filters of `keel runs list` and `GET /v1/runs`."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import httpx
from typer.testing import CliRunner, Result

import keel
from keel.cli import cli
from keel.service import create_app
from tests.support.apps.service import LiveServer
from tests.support.in_doubt import in_doubt
from tests.support.providers import Provider
from tests.support.service_client import ADMIN, TOKENS, Service, bearer
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


def invoke(*args: str) -> Result:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("KEEL_")}
    env["COLUMNS"] = "200"  # wide enough for every column, whatever terminal runs the tests
    result = CliRunner().invoke(cli, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def test_the_summary_of_a_run_taken_over_twice_and_resolved_by_a_person(
    make_app: AppFactory, db_url: str
) -> None:
    provider = Provider()
    clock = keel.ManualClock()
    app, run_id = in_doubt(make_app, provider, delivered=False, clock=clock)
    clock.advance(120)  # the person answers two minutes later
    app.resolve_effect(run_id, performed=False, by="ops-ann", comment="not in the provider's log")
    drain(app)
    assert app.get_run(run_id).status == "completed"
    assert len(provider.calls) == 2  # the lost first call, then the one the person allowed

    with LiveServer(create_app(app, tokens=TOKENS)) as server:
        got = httpx.get(f"{server.url}/v1/runs/{run_id}/summary", headers=bearer(ADMIN), timeout=10)
        missing = httpx.get(
            f"{server.url}/v1/runs/nope-0123456789abcdef/summary", headers=bearer(ADMIN), timeout=10
        )
    assert got.status_code == 200, got.text
    assert missing.status_code == 404 and missing.json()["error"] == "run_not_found"
    s = got.json()
    assert s["outcome"] == "completed (completed)" and s["status"] == "completed"
    # Worker A (token 1), the thief (2), the resuming worker (3), then after the answer (4).
    assert [a["lease_token"] for a in s["attempts"]] == [1, 2, 3, 4]
    assert [a["how"] for a in s["attempts"]] == ["claimed", "takeover", "takeover", "claimed"]
    assert s["takeovers"] == 2
    assert "took over from worker-a" in s["attempts"][1]["why"]
    assert s["attempts"][3]["why"] == "resumed after not_performed by ops-ann"
    assert [m["kind"] for m in s["marks"]].count("takeover") == 2
    (effect,) = s["effects"]
    (row,) = app.get_run(run_id).effects
    assert (effect["name"], effect["key"], effect["status"]) == (
        "charge",
        row["idempotency_key"],
        row["status"],
    )
    (wait,) = s["waits"]
    assert (wait["kind"], wait["decision"], wait["decided_by"]) == (
        "effect",
        "not_performed",
        "ops-ann",
    )
    assert wait["seconds"] >= 0 and wait["decided_at"] is not None
    totals = s["totals"]
    parts = totals["queued"] + totals["running"] + totals["waiting"] + totals["lost"]
    assert abs(totals["total"] - parts) < 1e-6
    assert totals["lost"] > 0  # the ManualClock jumped past two leases
    # The waits for a person: from the run's status.waiting to the answer that queued it.
    assert 120 <= totals["waiting"] <= wait["seconds"] + 1e-6
    charged = next(n for n in s["nodes"] if n["node"] == "pay")
    assert charged["executions"] == 2 and charged["waiting"] == totals["waiting"]

    shown = invoke("runs", "show", run_id, "--db", db_url)
    assert shown.exit_code == 0, shown.output
    first = shown.output.splitlines()[0]
    assert first.startswith("completed (completed)")
    for part in ("time per node", "attempts", "crashes, takeovers and resumes", "effects"):
        assert part in shown.output
    assert row["idempotency_key"] in shown.output and "ops-ann" in shown.output
    as_json = json.loads(invoke("runs", "show", run_id, "--db", db_url, "--json").output)
    assert as_json["summary"]["takeovers"] == 2 and as_json["run"]["run_id"] == run_id


def test_runs_list_shows_duration_and_attempts_and_filters_by_admission_time(
    svc: Service, db_url: str
) -> None:
    app = svc.app
    first = app.submit("review", job_id="l-1", input={"topic": "a"})["run_id"]
    drain(app)
    app.approve(first, by="editor")
    drain(app)
    between = app.database_now()
    second = app.submit("review", job_id="l-2", input={"topic": "b"})["run_id"]

    listed = json.loads(invoke("runs", "list", "--db", db_url, "--json").output)
    by_id = {r["run_id"]: r for r in listed}
    assert by_id[first]["attempts"] == 2 and by_id[first]["duration"] > 0
    assert by_id[second]["attempts"] == 0 and by_id[second]["duration"] is None
    table = invoke("runs", "list", "--db", db_url)
    assert "duration" in table.output and "executions" in table.output
    iso = f"@{between}"  # epoch seconds are taken as they are
    since = invoke("runs", "list", "--db", db_url, "--json", "--since", iso[1:])
    assert [r["run_id"] for r in json.loads(since.output)] == [second]
    until = invoke("runs", "list", "--db", db_url, "--json", "--until", str(between))
    assert [r["run_id"] for r in json.loads(until.output)] == [first]
    recent = invoke("runs", "list", "--db", db_url, "--json", "--since", "1h")
    assert {r["run_id"] for r in json.loads(recent.output)} == {first, second}
    old = invoke("runs", "list", "--db", db_url, "--json", "--until", "2000-01-01")
    assert json.loads(old.output) == []
    bad = invoke("runs", "list", "--db", db_url, "--since", "yesterday-ish")
    assert bad.exit_code == 2 and "neither an age" in bad.output

    page = svc.http.get("/v1/runs", params={"since": str(between)}).json()
    assert [r["run_id"] for r in page["runs"]] == [second]
    page = svc.http.get("/v1/runs", params={"until": "2000-01-01T00:00"}).json()
    assert page["runs"] == []
    everything = {
        r["run_id"]: r for r in svc.http.get("/v1/runs", params={"since": "7d"}).json()["runs"]
    }
    assert everything[first]["attempts"] == 2 and everything[first]["duration"] > 0
    refused = svc.http.get("/v1/runs", params={"since": "soonish"})
    assert refused.status_code == 400 and refused.json()["error"] == "bad_request"
    assert "neither an age" in refused.json()["message"]
