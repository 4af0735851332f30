"""How `keel runs replay` shows its report: one line of verdict, then the differences."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from keel.cli.render import compact
from keel.runtime.replay import ReplayReport

DIVERGED = 3
"""`keel runs replay`'s exit code when the replay diverged (1 and 2 keep their meaning)."""


def verdict(report: ReplayReport) -> Text:
    where = f"run {report.run_id} ({report.workflow}@{report.version}, {report.status})"
    if not report.diverged:
        line = Text(f"no divergence: {where}, replayed from step {report.from_step}", "green")
        shown = f"; {report.effects_served} effect(s) served from the ledger"
        line.append(f"{shown}, {report.approvals_answered} approval(s) answered as recorded")
        return line
    nodes = ", ".join(report.nodes) or "-"
    return Text(f"diverged at step {report.step} (node {nodes}): {where}", "bold red")


def report_view(report: ReplayReport) -> Group:
    parts: list[Text | Table] = [verdict(report)]
    if report.differences:
        table = Table(title=f"step {report.step}", title_justify="left")
        for column in ("what", "node", "recorded", "replayed", "detail"):
            table.add_column(column, overflow="fold")
        for d in report.differences:
            table.add_row(
                d.what, d.node or "-", compact(d.recorded, 80), compact(d.replayed, 80), d.detail
            )
        parts.append(table)
    if report.note:
        parts.append(Text(report.note, style="dim"))
    return Group(*parts)
