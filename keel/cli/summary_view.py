"""`keel runs show RUN`'s opening: the run summary (keel.runtime.summary) as text tables."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from keel.cli.render import clock_time, size, status_text
from keel.runtime.story import NodeTime
from keel.runtime.summary import RunSummary, seconds_text


def summary_view(s: RunSummary) -> Group:
    head = Text()
    head.append(s.outcome, style="bold")
    head.append(f" — {s.why}" if s.why else "")
    t = s.totals
    facts = [
        f"run {s.run_id} · job {s.job_id} · {s.workflow}@{s.version} · ",
        f"{seconds_text(t.total)} since admission: queued {seconds_text(t.queued)}, "
        f"running {seconds_text(t.running)}, waiting for a person {seconds_text(t.waiting)}, "
        f"lost to crashes {seconds_text(t.lost)} · ",
        f"{len(s.attempts)} attempt(s), {s.takeovers} takeover(s)",
    ]
    if s.trace_id:
        facts.append(f" · trace {s.trace_id}")
    parts: list[Any] = [head, Text("".join(facts)), Text("")]
    if s.nodes:
        parts.append(_nodes(s.nodes))
    if s.attempts:
        parts.append(_attempts(s))
    if s.marks:
        marks = Table(title="crashes, takeovers and resumes", title_justify="left")
        for column in ("at", "what", "worker #lease"):
            marks.add_column(column, no_wrap=column != "what")
        for m in s.marks:
            who = f"{m.worker_id} #{m.lease_token}" if m.worker_id else "-"
            marks.add_row(clock_time(m.at), f"{m.kind}: {m.text}", who)
        parts.append(marks)
    parts.append(_effects(s) if s.effect_lines else Text("effects: none"))
    parts.append(_waits(s) if s.wait_lines else Text("waits: none"))
    if s.artifacts:
        files = ", ".join(f"{a.name} ({size(a.size)})" for a in s.artifacts)
        parts.append(Text(f"artifacts: {files}"))
    else:
        parts.append(Text("artifacts: none"))
    parts.append(Text(""))
    return Group(*parts)


def _nodes(nodes: list[NodeTime]) -> Table:
    table = Table(title="time per node", title_justify="left")
    table.add_column("node", no_wrap=True)
    for column in ("queued", "running", "waiting", "lost", "total", "runs"):
        table.add_column(column, justify="right", no_wrap=True)
    for n in nodes:
        table.add_row(
            n.node,
            seconds_text(n.queued),
            seconds_text(n.running),
            seconds_text(n.waiting),
            seconds_text(n.lost),
            seconds_text(n.total),
            str(n.executions),
        )
    return table


def _attempts(s: RunSummary) -> Table:
    table = Table(title="attempts", title_justify="left")
    for column in ("lease", "worker", "began", "how, why", "ended by", "steps", "took"):
        table.add_column(column, no_wrap=column not in ("how, why", "worker"))
    for a in s.attempts:
        took = None if a.ended_at is None else a.ended_at - a.started_at
        start = f" at {a.first_node}" if a.first_node else ""
        table.add_row(
            f"#{a.lease_token}",
            a.worker_id or "-",
            clock_time(a.started_at),
            f"{a.how}{start}: {a.why}",
            a.ended_by or "(still holding it)",
            str(a.steps),
            seconds_text(took) if took is not None else "-",
        )
    return table


def _effects(s: RunSummary) -> Table:
    table = Table(title="effects", title_justify="left")
    for column in ("effect", "node", "outcome", "attempts", "idempotency key"):
        table.add_column(column, no_wrap=column != "idempotency key", overflow="fold")
    for e in s.effect_lines:
        outcome = status_text(e.status)
        if e.error:
            outcome.append(f" ({e.error[:80]})")
        table.add_row(e.name, e.node or "-", outcome, str(e.attempts), e.key)
    return table


def _waits(s: RunSummary) -> Table:
    table = Table(title="waits", title_justify="left")
    for column in ("wait", "status", "decision", "by", "took", "comment"):
        table.add_column(column, no_wrap=column in ("status", "took"))
    for w in s.wait_lines:
        by = w.decided_by or "-"
        if w.channel:
            by += f" via {w.channel}"
        status = w.status + (f" (escalated {w.escalation_level})" if w.escalation_level else "")
        took = seconds_text(w.seconds) + ("" if w.decided_at is not None else " so far")
        table.add_row(
            f"{w.kind} {w.name}", status, w.decision or "-", by, took, (w.comment or "-")[:80]
        )
    return table
