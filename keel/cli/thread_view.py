"""What `keel threads` prints: tables and views of threads, their runs, waits and history."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from langgraph.types import StateSnapshot
from rich.console import Group
from rich.table import Table
from rich.text import Text

from keel.cli import render
from keel.cli.render import compact, short_when, status_text, when
from keel.core.codec import loads
from keel.core.store.base import Row
from keel.core.threads import graph_start
from keel.core.wait_model import WaitKind
from keel.core.waits import resume_value

THREAD_STYLE = {"idle": "green", "busy": "cyan", "interrupted": "yellow", "error": "red"}


def _thread_status(status: str) -> Text:
    return Text(status, style=THREAD_STYLE.get(status, ""))


def threads_table(rows: list[Row], now: float | None = None) -> Table:
    table = Table(title="threads", title_justify="left")
    table.add_column("thread_id", no_wrap=True, overflow="fold")
    for column in ("workflow@version", "status", "runs", "metadata"):
        table.add_column(column, overflow="fold", justify="right" if column == "runs" else "left")
    table.add_column("created", no_wrap=True)
    table.add_column("updated", no_wrap=True)
    for t in rows:
        table.add_row(
            t["thread_id"],
            f"{t['workflow']}@{t['workflow_version']}",
            _thread_status(t["status"]),
            str(t["runs"]),
            compact(t["metadata"] or None, 60),
            short_when(t["created_at"], now),
            short_when(t["updated_at"], now),
        )
    return table


def started_with(run: Row) -> str:
    """What the run started with: its input, a command, a state update; from a fork."""
    kind = graph_start(run)[0]
    return f"{kind}, fork" if run.get("checkpoint_id") else kind


def runs_table(runs: list[Row], now: float) -> Table:
    table = Table(title="runs, in order", title_justify="left")
    table.add_column("seq", justify="right")
    table.add_column("run_id", no_wrap=True, overflow="fold")
    for column in ("status", "termination reason", "strategy", "start"):
        table.add_column(column, overflow="fold")
    table.add_column("admitted", no_wrap=True)
    table.add_column("finished", no_wrap=True)
    for r in runs:
        table.add_row(
            str(r["thread_seq"]),
            r["run_id"],
            status_text(r["status"]),
            r["termination_reason"] or "-",
            r["multitask_strategy"] or "-",
            started_with(r),
            short_when(r["created_at"], now),
            short_when(r.get("finished_at"), now),
        )
    return table


def json_text(value: Any, limit: int) -> str:
    """A value as one line of JSON (a string keeps its quotes), cut to `limit` characters."""
    return compact(json.dumps(value, ensure_ascii=False, default=str), limit)


def _pending_lines(thread_id: str, waits: list[Row], now: float) -> list[Text]:
    """What the thread's active run waits on, and the command that answers it."""
    lines = []
    for w in waits:
        run_id, payload = w["run_id"], json_text(render.decoded(w).get("payload"), 300)
        what = w["kind"] if w["name"] == w["kind"] else f"{w['kind']} {w['name']}"
        lines.append(
            Text(
                f"run {run_id} waits on {what} (wait {w['wait_id']}, deadline "
                f"{when(w.get('deadline'), now)}): {payload}",
                style="yellow",
            )
        )
        if w["kind"] == WaitKind.INTERRUPT:
            answer = f"keel threads resume {thread_id} VALUE"
            if len(waits) > 1:
                answer += f" --wait-id {w['wait_id']}"
        elif w["kind"] == WaitKind.APPROVAL:
            answer = f"keel approve {run_id}` or `keel reject {run_id}"
        else:
            answer = f"keel resolve-effect {run_id} --performed` or `--not-performed"
        lines.append(Text(f"  answer with `{answer}`"))
    return lines


def thread_json(thread: Row, runs: list[Row], waits: list[Row]) -> dict[str, Any]:
    def run(row: Row) -> dict[str, Any]:
        found = render.decoded(row)
        for column in ("command", "config"):
            if isinstance(found.get(column), str):
                found[column] = loads(found[column])
        return found

    return {
        "thread": thread,
        "runs": [run(r) for r in runs],
        "waiting": [render.decoded(w) for w in waits],
    }


def view(thread: Row, runs: list[Row], waits: list[Row], now: float) -> Group:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, value in (
        ("thread", thread["thread_id"]),
        ("workflow", f"{thread['workflow']}@{thread['workflow_version']}"),
        ("status", _thread_status(thread["status"])),
        ("metadata", compact(thread["metadata"] or None, 300)),
        ("runs", str(thread["runs"])),
        ("created", when(thread["created_at"], now)),
        ("updated", when(thread["updated_at"], now)),
    ):
        grid.add_row(label, value)
    parts: list[Any] = [grid, Text("")]
    parts.append(runs_table(runs, now) if runs else Text("runs: none"))
    parts.extend(_pending_lines(thread["thread_id"], waits, now))
    return Group(*parts)


def _epoch(iso: str | None) -> float | None:
    """A checkpoint's `created_at` (ISO 8601, UTC) as epoch seconds."""
    return dt.datetime.fromisoformat(iso).timestamp() if iso else None


def answered(wait: Row) -> str:
    """Who answered the wait first, and with what."""
    recorded = loads(wait["value"]) if wait.get("value") else None
    value = resume_value(recorded) if recorded is not None else wait.get("decision")
    by = wait.get("decided_by") or "(unnamed)"
    channel = f" via {wait['channel']}" if wait.get("channel") else ""
    return (
        f"already answered by {by}{channel} at {when(wait.get('decided_at'))} with "
        f"{json_text(value, 200)} (wait {wait['wait_id']} of run {wait['run_id']})"
    )


def history_table(thread_id: str, history: list[StateSnapshot], now: float) -> Table:
    """The thread's checkpoints, newest first: what `--checkpoint` and `--before` take."""
    table = Table(title=f"history of thread {thread_id}", title_justify="left")
    # The checkpoint id goes whole into --checkpoint/--before; the run id may fold.
    table.add_column("checkpoint", no_wrap=True)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("source", no_wrap=True)
    table.add_column("run", overflow="fold")
    table.add_column("next", no_wrap=True)
    table.add_column("created", no_wrap=True)
    for s in history:
        meta = s.metadata or {}
        table.add_row(
            s.config["configurable"]["checkpoint_id"],
            str(meta.get("step", "-")),
            str(meta.get("source", "-")),
            str(meta.get("keel_run_id") or "-"),
            ", ".join(s.next) or "-",
            short_when(_epoch(s.created_at), now),
        )
    return table
