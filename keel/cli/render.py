"""The `keel` command's output: rich tables for people, plain JSON for scripts.

Rows come from the store with times as floats (epoch seconds) and JSON columns as text; this
module turns them into readable cells or into JSON objects, and never touches the database.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Iterable
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from keel.core.store.base import Row

# Re-exported: output that shows a database URL hides its password the preflight's way.
from keel.runtime.preflight import redact as redact
from keel.runtime.runtime import RunDetails, Submission
from keel.runtime.summary import seconds_text

# Columns that hold JSON text in Keel's tables; scripts get them decoded.
JSON_COLUMNS = (
    "input",
    "output",
    "data",
    "payload",
    "approvers",
    "workflows",
    "value",
    "result",
    "heartbeat_details",
)

STATUS_STYLE = {
    "queued": "blue",
    "running": "cyan",
    "waiting": "yellow",
    "completed": "green",
    "failed": "red",
    "cancelled": "dim",
    # ledger and wait states
    "pending": "yellow",
    "sent": "green",
    "confirmed": "green",
    "in_doubt": "bold red",
    "decided": "green",
    "timed_out": "red",
}


def ago(seconds: float) -> str:
    """'12s ago' / 'in 3h' for a signed distance from now (positive: in the past)."""
    span = abs(seconds)
    # Whole units, rounded down: 59.9 minutes is "59m", not "60m".
    if span < 60:
        text = f"{int(span)}s"
    elif span < 3600:
        text = f"{int(span // 60)}m"
    elif span < 86400 * 2:
        text = f"{int(span // 3600)}h"
    else:
        text = f"{int(span // 86400)}d"
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def when(ts: float | None, now: float | None = None) -> str:
    """An epoch time as local 'YYYY-MM-DD HH:MM:SS (3m ago)'; '-' for none."""
    if ts is None:
        return "-"
    now = time.time() if now is None else now
    stamp = dt.datetime.fromtimestamp(float(ts)).strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp} ({ago(now - float(ts))})"


def short_when(ts: float | None, now: float | None = None) -> str:
    """'23:58:41 (4s ago)' today, '2026-11-27 09:12 (2d ago)' before: for narrow columns."""
    if ts is None:
        return "-"
    now = time.time() if now is None else now
    moment = dt.datetime.fromtimestamp(float(ts))
    same_day = moment.date() == dt.datetime.fromtimestamp(now).date()
    stamp = moment.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M")
    return f"{stamp} ({ago(now - float(ts))})"


def clock_time(ts: float | None) -> str:
    """An epoch time as local 'MM-DD HH:MM:SS.mmm', for timelines where order matters."""
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(float(ts)).strftime("%m-%d %H:%M:%S.%f")[:-3]


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def compact(value: Any, limit: int = 120) -> str:
    """One line of JSON, cut to `limit` characters."""
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def status_text(value: str | None, *, stranded: bool = False) -> Text:
    if value is None:
        return Text("-", style="dim")
    text = Text(value, style=STATUS_STYLE.get(value, ""))
    if stranded:  # no worker serves its version: it would look queued forever
        text.append(" (stranded)", style="bold red")
    return text


def decoded(row: Row) -> dict[str, Any]:
    """A row with its JSON columns decoded (a column that is not valid JSON is kept as text)."""
    out = dict(row)
    for column in JSON_COLUMNS:
        value = out.get(column)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                out[column] = json.loads(value)
    return out


def details_json(details: RunDetails) -> dict[str, Any]:
    return {
        "run": decoded(details.annotated_run),
        "failure": details.failure,
        "timeline": [decoded(e) for e in details.timeline],
        "effects": [decoded(e) for e in details.effects],
        "waits": [decoded(w) for w in details.waits],
        "intents": [decoded(i) for i in details.intents],
        "artifacts": [
            {"name": a.name, "size": a.size, "path": str(a.path)} for a in details.artifacts
        ],
    }


def to_json(value: Any) -> str:
    # Plain text, not rich's JSON highlighter: scripts read this and must get it unwrapped.
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


# -- tables ----------------------------------------------------------------------------------


def runs_table(rows: Iterable[Row], now: float | None = None) -> Table:
    table = Table(title="runs", title_justify="left", expand=False)
    table.add_column("run_id", no_wrap=True, overflow="fold")
    table.add_column("workflow@version")
    table.add_column("status", no_wrap=True)
    table.add_column("decision", no_wrap=True)
    table.add_column("termination reason")
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("executions", justify="right", no_wrap=True)
    table.add_column("admitted", no_wrap=True)
    table.add_column("updated", no_wrap=True)
    for row in rows:
        took = row.get("duration")
        table.add_row(
            row["run_id"],
            f"{row['workflow']}@{row['workflow_version']}",
            status_text(row["status"], stranded=bool(row.get("stranded"))),
            row["decision"] or "-",
            row["termination_reason"] or "-",
            "-" if took is None else seconds_text(took),
            str(row.get("attempts", row.get("lease_token") or 0)),
            short_when(row["created_at"], now),
            short_when(row["updated_at"], now),
        )
    return table


def run_summary(run: Row, now: float | None = None) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    lease = "-"
    if run.get("lease_owner"):
        lease = f"{run['lease_owner']} (token {run['lease_token']}"
        lease += f", expires {when(run.get('lease_expires_at'), now)})"
    elif run.get("lease_token"):
        lease = f"none (last token {run['lease_token']})"
    fields: list[tuple[str, Any]] = [
        ("run", run["run_id"]),
        ("job", run["job_id"]),
        ("workflow", f"{run['workflow']}@{run['workflow_version']} (attempt {run['attempt']})"),
        ("status", status_text(run["status"], stranded=bool(run.get("stranded")))),
        *(
            [("stranded", Text(run["stranded_reason"], style="red"))]
            if run.get("stranded_reason")
            else []
        ),
        ("decision", run["decision"] or "-"),
        ("termination reason", run["termination_reason"] or "-"),
        ("lease", lease),
        ("created", when(run["created_at"], now)),
        ("started", when(run.get("started_at"), now)),
        ("updated", when(run["updated_at"], now)),
        ("finished", when(run.get("finished_at"), now)),
    ]
    if run.get("stranded_reason"):
        fields.insert(4, ("stranded", Text(run["stranded_reason"], style="red")))
    if run.get("error"):
        fields.append(("error", Text(run["error"], style="red")))
    if run.get("output") is not None:
        fields.append(("output", compact(run["output"], 300)))
    for label, value in fields:
        grid.add_row(label, value)
    return grid


def timeline_table(events: Iterable[Row]) -> Table:
    table = Table(title="timeline", title_justify="left")
    table.add_column("time", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("worker", overflow="fold")
    table.add_column("token", justify="right")
    table.add_column("data", overflow="fold")
    for e in events:
        token = e.get("lease_token")
        table.add_row(
            clock_time(e["at"]),
            e["kind"],
            e.get("worker_id") or "-",
            "-" if token is None else str(token),
            compact(e.get("data") or None),
        )
    return table


def effects_table(effects: Iterable[Row]) -> Table:
    columns = ("key", "name", "node", "step", "status", "attempts", "result/error")
    rows = [
        (
            e["idempotency_key"],
            e["name"],
            e["node"],
            str(e["step"]),
            status_text(e["status"]),
            str(e["attempts"]),
            _outcome(e),
        )
        for e in effects
    ]
    return _attempts_table("effects", columns, rows)


def intents_table(intents: Iterable[Row]) -> Table:
    """A run's outbox effects (docs/outbox.md): delivered, or still to go, dead, in doubt."""
    columns = ("intent", "effect", "node", "status", "attempts", "result/error")
    rows = [
        (
            i["intent_id"],
            i["effect"],
            i["node"],
            status_text(i["status"]),
            f"{i['attempts']}/{i['max_attempts']}",
            _outcome(i),
        )
        for i in intents
    ]
    return _attempts_table("outbox", columns, rows)


def _outcome(row: Row) -> Text | str:
    return Text(row["error"], style="red") if row.get("error") else compact(row.get("result"), 80)


def _attempts_table(title: str, columns: Iterable[str], rows: Iterable[tuple[Any, ...]]) -> Table:
    """Rows of a ledger (effects, intents): cells fold, the attempts column aligns right."""
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(
            column, overflow="fold", justify="right" if column == "attempts" else "left"
        )
    for row in rows:
        table.add_row(*row)
    return table


def waits_table(waits: Iterable[Row], now: float | None = None, *, across: bool = False) -> Table:
    """A run's waits; `across` runs (`keel approvals list`) adds each wait's run and payload,
    what `keel approve RUN` needs and what the approver decides on."""
    table = Table(title="waits", title_justify="left")
    columns = ["wait_id", "kind", "name", "status", "deadline", "decision", "by", "channel"]
    if across:
        columns = ["run_id", *columns[:3], "payload", *columns[3:5]]
    for column in columns:
        table.add_column(column, overflow="fold")
    for w in waits:
        deadline: str | Text = when(w.get("deadline"), now)
        if w["status"] != "pending":
            # Decided: the deadline no longer applies; keep it, quietly, for the record.
            deadline = Text(short_when(w.get("deadline"), now).split(" (")[0], style="dim")
        elif w.get("on_timeout") and w.get("deadline") is not None:
            deadline = f"{deadline} then {w['on_timeout']}"
        if across:
            payload = compact(decoded(w).get("payload"), 80)
            table.add_row(
                w["run_id"],
                w["wait_id"],
                w["kind"],
                w["name"],
                payload,
                status_text(w["status"]),
                deadline,
            )
            continue
        table.add_row(
            w["wait_id"],
            w["kind"],
            w["name"],
            status_text(w["status"]),
            deadline,
            w.get("decision") or "-",
            w.get("decided_by") or "-",
            w.get("channel") or "-",
        )
    return table


def artifacts_table(artifacts: Iterable[Any]) -> Table:
    table = Table(title="artifacts", title_justify="left")
    table.add_column("name", overflow="fold")
    table.add_column("size", justify="right")
    for a in artifacts:
        table.add_row(a.name, size(a.size))
    return table


_WORKER_STATES = {
    "silent": "silent: waiting for its database, or dead",
    "dead": "dead: silent for over three lease TTLs, its leases lapsed",
}


def workers_table(rows: Iterable[Row], now: float | None = None) -> Table:
    table = Table(title="workers", title_justify="left")
    columns = ("worker_id", "host", "pid", "concurrency", "workflows", "started", "heartbeat")
    for column in (*columns, "state"):
        table.add_column(column, overflow="fold")
    for w in rows:
        state = w.get("state", "live")
        table.add_row(
            w["worker_id"],
            w["host"],
            str(w["pid"]),
            str(w["concurrency"]),
            ", ".join(json.loads(w.get("workflows") or "[]")) or "-",
            when(w["started_at"], now),
            short_when(w["heartbeat_at"], now),
            _WORKER_STATES.get(state, state),
        )
    return table


def failure_lines(failure: dict[str, Any]) -> list[Text]:
    """Where a failed run failed and its traceback (keel.core.failures)."""
    where = [f"node {failure['node']}"] if failure.get("node") else []
    if failure.get("inner_node"):
        where.append(f"inside it node {failure['inner_node']}")
    if failure.get("task_path"):
        where.append(f"task {failure['task_path']}")
    if failure.get("step") is not None:
        where.append(f"step {failure['step']}")
    said = f"failed in {', '.join(where)}" if where else "failed"
    return [
        Text(f"{said}: {failure['type']}: {failure['message']}", style="bold red"),
        Text(str(failure.get("traceback", "")).rstrip(), style="dim"),
    ]


def run_view(details: RunDetails, now: float | None = None) -> Group:
    run = details.annotated_run
    parts: list[Any] = [run_summary(run, now), Text(""), timeline_table(details.timeline)]
    failure = details.failure
    if failure is not None:
        parts[1:1] = [Text(""), *failure_lines(failure)]
    parts.append(effects_table(details.effects) if details.effects else Text("effects: none"))
    if details.intents:
        parts.append(intents_table(details.intents))
    parts.append(waits_table(details.waits, now) if details.waits else Text("waits: none"))
    parts.append(
        artifacts_table(details.artifacts) if details.artifacts else Text("artifacts: none")
    )
    return Group(*parts)


# -- output ----------------------------------------------------------------------------------


def out() -> Console:
    # Built per call so that the streams in use right now (a test runner's, say) are the ones used.
    # Piped output is not cut to 80 columns: a grep should see whole ids.
    piped = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    return Console(highlight=False, soft_wrap=False, width=160 if piped else None)


def submitted_lines(row: Submission) -> list[str]:
    """What `keel submit` says about the run it admitted, found or reused."""
    what = f"{row['workflow']}@{row['workflow_version']}, job {row['job_id']}"
    if row.run_id in row.other_runs:
        return [
            f"reused run {row.run_id} ({what}), whose input differs from this one; status "
            f"{row['status']} (--if-exists new admits a run for this input)"
        ]
    if not row.created:
        return [
            f"already admitted: run {row['run_id']} ({what}) exists with the same input and "
            f"version; status {row['status']} (use --rerun for a new attempt)"
        ]
    attempt = f", attempt {row['attempt']}" if row["attempt"] > 1 else ""
    lines = [f"admitted run {row['run_id']} ({what}{attempt}): queued for a worker{_delay(row)}"]
    if row.other_runs:
        lines.append(
            f"note: job {row.job_id} already had {len(row.other_runs)} run(s) with other "
            f"input (latest {row.other_runs[0]}); --if-exists error refuses this"
        )
    return lines


def decided_line(wait: dict[str, Any]) -> str:
    by = wait.get("decided_by") or "(unnamed)"
    channel = f" via {wait['channel']}" if wait.get("channel") else ""
    return (
        f"already decided by {by}{channel} at {when(wait.get('decided_at'))}: "
        f"{wait['decision']} (wait {wait['wait_id']} of run {wait['run_id']})"
    )


def _delay(row: Submission) -> str:
    """ ", not before <time>" for a delayed run (keel.core.timers)."""
    if row.get("not_before") is None:
        return ""
    return f", not before {clock_time(row['not_before'])}"
