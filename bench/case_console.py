"""Case 9, the console: how long its pages take with 10,000 runs in the database.

The runs are written straight into Keel's tables (a bulk insert, not 10,000 submits: what is
measured is reading them), shaped like real ones: mixed statuses and workflows, a timeline of
a dozen events each, one run in ten waiting on an approval. Each page is then asked for through
a real uvicorn server on 127.0.0.1, logged in with a session cookie, as a browser would.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from typing import Any

import httpx
import psycopg
import uvicorn

from bench.common import CaseResult, Databases, Settings, Summary, Table
from keel.service import create_app

RUNS = 10_000
EVENTS_PER_RUN = 12
TOKEN = "bench-tFAmGPyagx8zZI9oyaGtB2kMEP7rPL-2-52Plzggjk0"  # secrets.token_urlsafe(32)
STATUSES = ("completed", "completed", "completed", "failed", "waiting", "queued", "running")
WORKFLOWS = ("support-ticket", "newsletter", "refund", "triage")
TARGET_MS = 200.0


def _rows(now: float) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    runs, events, waits = [], [], []
    for n in range(RUNS):
        run_id = f"ticket-{n:05d}-{n * 7919 % 10**16:016x}"
        status = "waiting" if n % 10 == 0 else STATUSES[n % len(STATUSES)]
        created = now - (RUNS - n) * 30.0
        finished = created + 12.0 if status in ("completed", "failed") else None
        runs.append(
            (
                run_id, f"ticket-{n:05d}", WORKFLOWS[n % len(WORKFLOWS)], "1", 1, f"h{n}",
                json.dumps({"ticket": n, "text": "x" * 200}), status,
                "approved" if status == "completed" else "not_decided",
                "approved" if status == "completed" else None,
                "boom" if status == "failed" else None,
                json.dumps({"reply": "y" * 200}) if status == "completed" else None,
                "worker-1" if status == "running" else None, 1 + n % 3,
                now + 30 if status == "running" else None, 0,
                created, finished or created + 1, created + 0.5, finished,
            )
        )  # fmt: skip
        for e in range(EVENTS_PER_RUN):
            kind = "admitted" if e == 0 else ("lease.claimed" if e == 1 else "step")
            data = {"node": f"node{e}", "writes": ["x"]} if kind == "step" else {}
            events.append((run_id, created + e, kind, "worker-1", 1, json.dumps(data)))
        if status == "waiting":
            waits.append(
                (
                    f"w-{n:024d}", run_id, f"i{n}", "approval", "manager",
                    json.dumps({"draft": "z" * 300, "customer": f"c{n}"}), "[]", "pending",
                    now + 86400 + n, "escalate", created + 5,
                )
            )  # fmt: skip
    return runs, events, waits


_RUN_COLS = (
    "run_id, job_id, workflow, workflow_version, attempt, input_hash, input, status, decision, "
    "termination_reason, error, output, lease_owner, lease_token, lease_expires_at, "
    "cancel_requested, created_at, updated_at, started_at, finished_at"
)
_EVENT_COLS = "run_id, at, kind, worker_id, lease_token, data"
_WAIT_COLS = (
    "wait_id, run_id, interrupt_id, kind, name, payload, approvers, status, deadline, "
    "on_timeout, created_at"
)


def _fill(url: str, now: float) -> None:
    runs, events, waits = _rows(now)
    tables = (("keel_runs", _RUN_COLS, runs), ("keel_events", _EVENT_COLS, events))
    tables += (("keel_waits", _WAIT_COLS, waits),)
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            for table, cols, rows in tables:
                marks = ", ".join("?" * len(rows[0]))
                db.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", rows)
            db.execute("ANALYZE")
        return
    with psycopg.connect(url) as db:
        for table, cols, rows in tables:
            with db.cursor().copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        db.execute("ANALYZE")


class _Server:
    def __init__(self, api: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(api, log_level="warning", ws="none", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> _Server:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def _pages() -> dict[str, str]:
    waiting_run = "ticket-05000-" + f"{5000 * 7919 % 10**16:016x}"
    return {
        "runs, first page": "/ui/runs",
        "runs, status=waiting": "/ui/runs?status=waiting",
        "runs, one workflow": "/ui/runs?workflow=refund",
        "runs, job id prefix": "/ui/runs?job=ticket-042",
        "runs, time window": "/ui/runs?since=2000-01-01T00:00&until=2100-01-01T00:00",
        "runs, page 100 (offset 4,950)": "/ui/runs?offset=4950",
        "a run (12 events, a wait)": f"/ui/runs/{waiting_run}",
        "approvals inbox (1,000 open)": "/ui/approvals",
        "workers": "/ui/workers",
    }


def run(settings: Settings, dbs: Databases) -> CaseResult:
    samples = 5 if settings.quick else 30
    result = CaseResult(
        "console",
        "Console: pages with 10,000 runs",
        f"{RUNS:,} runs ({EVENTS_PER_RUN} events each, one in ten waiting on an approval) "
        "bulk-inserted into a migrated database; each page fetched over HTTP from a uvicorn "
        f"server on 127.0.0.1 with a session cookie, {samples} times after 2 warm-ups; "
        "the figure is the whole response (query, template, transfer).",
    )
    rows: list[list[str]] = []
    slowest: dict[str, float] = {}
    for backend in settings.backends:
        url = dbs.keel(backend, "console")
        app = dbs.app(url)
        _fill(url, app.aio.runtime.clock.now())
        try:
            with (
                _Server(create_app(app, tokens={TOKEN: ["*"]})) as server,
                httpx.Client(
                    base_url=server.url, cookies={"keel_session": TOKEN}, timeout=30
                ) as client,
            ):
                for label, path in _pages().items():
                    times = []
                    for i in range(samples + 2):
                        start = time.perf_counter()
                        response = client.get(path)
                        elapsed = (time.perf_counter() - start) * 1e3
                        if response.status_code != 200:
                            raise RuntimeError(f"{path}: HTTP {response.status_code}")
                        if i >= 2:
                            times.append(elapsed)
                    s = Summary.of(times)
                    p95 = sorted(times)[int(0.95 * (len(times) - 1))]
                    slowest[backend] = max(slowest.get(backend, 0.0), s.median)
                    rows.append([backend, label, s.fmt(1, " ms"), f"{p95:.1f} ms"])
        finally:
            app.close()
        result.figures[f"{backend}.console_slowest_ms"] = slowest[backend]
    result.tables.append(
        Table("Console page times", ["backend", "page", "median (min-max)", "p95"], rows)
    )
    result.notes.append(
        f"Target: every page under {TARGET_MS:.0f} ms; slowest median "
        + ", ".join(f"{b} {v:.1f} ms" for b, v in slowest.items())
        + "."
    )
    return result
