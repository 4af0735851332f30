"""The `keel` command."""

from __future__ import annotations

import importlib
import os
import sys

import typer

import keel

cli = typer.Typer(no_args_is_help=True, add_completion=False, help="Crash-safe LangGraph runs.")


@cli.callback()
def root() -> None:
    """Keel: admitted, resumable LangGraph runs whose side effects happen once."""


def load_app(spec: str) -> keel.App:
    """Import `module:attribute` (the current folder is importable, as with uvicorn)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise typer.BadParameter(f"expected MODULE:ATTRIBUTE, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    app = getattr(importlib.import_module(module_name), attr)
    if not isinstance(app, keel.App):
        raise typer.BadParameter(f"{spec} is a {type(app).__name__}, not a keel.App")
    return app


@cli.command()
def worker(
    app: str = typer.Argument(..., help="MODULE:ATTRIBUTE of a keel.App"),
    concurrency: int = typer.Option(4, min=1),
    stop_when_idle: bool = typer.Option(False, help="Exit when no run is queued or running."),
    grace: float = typer.Option(30.0, help="Seconds running runs get to finish on SIGTERM."),
) -> None:
    """Execute runs of APP's workflows until stopped (SIGTERM drains; twice stops now)."""
    loaded = load_app(app)
    stats = loaded.run_worker(concurrency=concurrency, stop_when_idle=stop_when_idle, grace=grace)
    typer.echo(f"worker stopped: claimed {stats.claimed}, finished {stats.finished}")


def main() -> None:
    cli()
