"""`keel chaos APP --workflow NAME --input FILE`: the crash matrix from the command line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from keel.chaos.audit import workflow_findings
from keel.chaos.harness import ChaosConfig
from keel.chaos.kinds import NAMES, make_kinds
from keel.chaos.matrix import run_matrix
from keel.chaos.preflight import HarnessError
from keel.chaos.report import output_console, render, write_json, write_junit
from keel.core.errors import UsageError
from keel.core.faults import POINTS
from keel.runtime.loading import BadAppSpec, load_app

HARNESS_FAILED = 2
"""Exit status when the harness could not run the workflow at all (1: a cell failed)."""


def chaos(
    app: Annotated[str, typer.Argument(help="MODULE:ATTRIBUTE of the keel.App")],
    workflow: Annotated[str, typer.Option(help="The registered workflow to test.")],
    input_file: Annotated[
        Path, typer.Option("--input", exists=True, dir_okay=False, help="JSON input file.")
    ],
    backend: Annotated[str, typer.Option(help="sqlite or postgres.")] = "sqlite",
    db: Annotated[
        str | None,
        typer.Option(help="PostgreSQL URL; each cell gets a throwaway database on that server."),
    ] = None,
    decide: Annotated[str, typer.Option(help="Answer approvals: approve, reject or timeout.")] = (
        "approve"
    ),
    env: Annotated[
        list[str] | None,
        typer.Option(
            help="KEY=VALUE for the workers; VALUE may use {smtp_url}, {smtp_spool}, {http_url}."
        ),
    ] = None,
    point: Annotated[list[str] | None, typer.Option(help="Only these fault points.")] = None,
    fault: Annotated[
        list[str] | None,
        typer.Option(
            help=f"Fault kinds, comma-separated or repeated: {', '.join(NAMES)} (default: kill)."
        ),
    ] = None,
    restart_cluster: Annotated[
        str | None,
        typer.Option(
            help="VERSION/NAME of the Debian PostgreSQL cluster serving --db that db-restart "
            "cells may restart (default: a throwaway cluster of their own)."
        ),
    ] = None,
    max_occurrences: Annotated[
        int | None, typer.Option(help="At most this many occurrences per point.")
    ] = None,
    jobs: Annotated[
        int, typer.Option(help="Cells run at once, each on its own database and sinks.")
    ] = 1,
    fork: Annotated[
        bool,
        typer.Option(
            help="Fork worker processes from a warm server (--no-fork: a fresh interpreter each)."
        ),
    ] = True,
    soak: Annotated[int, typer.Option(help="Also run N runs with random kills.")] = 0,
    matrix: Annotated[
        bool, typer.Option(help="Run the matrix (--no-matrix: only the clean run and the soak).")
    ] = True,
    json_report: Annotated[Path | None, typer.Option("--json", help="Write a JSON report.")] = None,
    junit: Annotated[Path | None, typer.Option(help="Write a JUnit XML report.")] = None,
    cell_timeout: Annotated[float, typer.Option(help="Seconds a cell may take.")] = 90.0,
) -> None:
    """Strike a worker at every fault point the workflow reaches (killed, frozen, the database
    restarted or dropped, a worker with a skewed clock beside it) and check every invariant."""
    console = output_console()
    if backend not in ("sqlite", "postgres"):
        raise typer.BadParameter("--backend is sqlite or postgres")
    if decide not in ("approve", "reject", "timeout"):
        raise typer.BadParameter("--decide is approve, reject or timeout")
    if jobs < 1:
        raise typer.BadParameter("--jobs is at least 1")
    if max_occurrences is not None and max_occurrences < 1:
        raise typer.BadParameter("--max-occurrences is at least 1")
    unknown = [p for p in point or [] if p not in POINTS]
    if unknown:
        raise typer.BadParameter(f"unknown fault points {unknown}; known: {', '.join(POINTS)}")
    try:
        data = json.loads(input_file.read_text())
    except ValueError as exc:
        raise typer.BadParameter(f"{input_file} is not JSON: {exc}") from None
    extra = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"--env takes KEY=VALUE, not {item!r}")
        extra[key] = value
    faults = tuple(f.strip() for item in fault or ["kill"] for f in item.split(",") if f.strip())
    config = ChaosConfig(
        app=app,
        workflow=workflow,
        input=data,
        backend=backend,
        postgres_url=db or os.environ.get("KEEL_DATABASE_URL") if backend == "postgres" else None,
        decide=decide,
        env=extra,
        points=tuple(point or ()),
        max_occurrences=max_occurrences,
        jobs=jobs,
        fork=fork,
        faults=faults,
        restart_cluster=restart_cluster,
        cell_timeout=cell_timeout,
    )
    try:
        make_kinds(config)  # refuse a kind this configuration cannot run before any cell
    except UsageError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        with console.status("clean run and crash matrix…"):
            report = run_matrix(
                config,
                soak=soak,
                matrix=matrix,
                on_cell=lambda c: console.print(
                    f"{c.name}: {c.verdict} ({c.seconds:.1f}s) {c.where}", markup=False
                ),
            )
    except (HarnessError, TimeoutError, BadAppSpec) as exc:
        # The harness could not run the workflow at all: a fact about the setup, said in one
        # line; the work dir (kept) holds the workers' logs.
        console.print(f"keel chaos: {exc}", markup=False)
        raise typer.Exit(HARNESS_FAILED) from None
    render(report, console)
    _reconcile_only(app, console)
    if json_report:
        write_json(report, json_report)
    if junit:
        write_junit(report, junit)
    raise typer.Exit(0 if report.ok else 1)


RELIES_ON_RECONCILE = ("effect.reconcile-only", "effect.in-doubt-on-crash")


def _reconcile_only(spec: str, console: Console) -> None:
    """Say which effects the matrix passed only because their reconciler (or a person) settles
    a call cut off mid-way: a provider that commits after its client gave up can still make
    them happen twice, which no crash cell can show (docs/effects.md, "What remains")."""
    findings = [f for f in workflow_findings(load_app(spec)) if f.code in RELIES_ON_RECONCILE]
    if not findings:
        return
    console.print("effects that rely on reconcile alone (keel audit says more):", markup=False)
    for finding in findings:
        console.print(f"  {finding.subject}: {finding.message}; fix: {finding.fix}", markup=False)
