"""`keel audit APP`: the production-hardening checklist, one line per finding with its fix.

Exit 1 when any finding is an error (with --strict: any warning too), 0 otherwise; 2 for an
APP that names no keel.App. See docs/chaos.md, "Audit before you deploy".
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from keel.chaos.audit import AuditReport, audit
from keel.cli.guard import say
from keel.runtime.loading import load_app


def audit_command(
    app: Annotated[str, typer.Argument(help="MODULE:ATTRIBUTE of the keel.App")],
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            show_default=False,
            help="Database whose recorded runs to compare with the graphs (read only; "
            "default: the App's).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON document for CI.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Fail on warnings too.")] = False,
) -> None:
    """Check APP before a deploy: effects, waits, versions, lease, API tokens; exit 1 on errors."""
    loaded = load_app(app)
    try:
        report = audit(loaded, spec=app, db=db)
    finally:
        loaded.close()
    if as_json:
        typer.echo(json.dumps(report.as_dict(strict), indent=2))
    else:
        for line in human(report):
            say(line)
    raise typer.Exit(1 if report.failed(strict) else 0)


def human(report: AuditReport) -> list[str]:
    """The report as lines: a heading, the findings by workflow, what was skipped, a summary."""
    where = f" (database {report.database})" if report.database else ""
    lines = [f"keel audit {report.app}{where}"]
    for key, findings in report.by_workflow():
        lines.append(key or "app")
        for f in findings:
            lines.append(f"  {f.level.value:<7} {f.code} [{f.subject}]: {f.message}; fix: {f.fix}")
    for skipped in report.skipped:
        lines.append(f"skipped {skipped.check}: {skipped.reason}")
    lines.append(report.summary())
    return lines
