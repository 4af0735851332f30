"""The `keel` command's observability parts: the logging options every long-running command
takes, `keel prune`, and `keel runs watch`."""

from __future__ import annotations

import functools
import inspect
import os
import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from keel.core import logs
from keel.core.codec import dumps
from keel.runtime.app import App
from keel.runtime.follow import Cursor, event_json

F = TypeVar("F", bound=Callable[..., Any])


def _log_option(flag: str, env: str, choices: str, default: str) -> Any:
    """A `--log-*` option (the parameter's annotation): not given, read from `env`."""
    help = f"{choices} (env: {env}; default: {default})."
    return Annotated[str | None, typer.Option(flag, envvar=env, show_default=False, help=help)]


LogLevel = _log_option("--log-level", logs.LEVEL_ENV, "debug, info, warning or error", "info")
LogFormat = _log_option(
    "--log-format",
    logs.FORMAT_ENV,
    "text (one readable line per event) or json (one object per line)",
    "text",
)


def logged(fn: F) -> F:
    """Give a command `--log-level` and `--log-format`, and set logging up before it runs."""

    @functools.wraps(fn)
    def wrapper(
        *args: Any, log_level: str | None = None, log_format: str | None = None, **kwargs: Any
    ) -> Any:
        try:
            logs.configure(log_level, log_format)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        # Processes this one starts (chaos's workers, a server's) log the same way.
        for name, value in ((logs.LEVEL_ENV, log_level), (logs.FORMAT_ENV, log_format)):
            if value:
                os.environ[name] = value.lower()
        return fn(*args, **kwargs)

    sig = inspect.signature(fn)
    # Resolved here, not left as the strings of a module with postponed annotations: typer
    # takes a given __signature__ as it is, and a string hides `Annotated[..., typer.Option()]`
    # (every option of `keel chaos` turned into a bare --name, its arguments into positionals).
    hints = typing_hints(fn)
    extra = [
        inspect.Parameter(
            "log_level", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=LogLevel
        ),
        inspect.Parameter(
            "log_format", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=LogFormat
        ),
    ]
    params = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
        for p in sig.parameters.values()
    ]
    wrapper.__signature__ = sig.replace(parameters=[*params, *extra])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**hints, "log_level": LogLevel, "log_format": LogFormat}
    return wrapper  # type: ignore[return-value]


def typing_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """`fn`'s annotations resolved in its own module (they may be strings there)."""
    import typing

    return typing.get_type_hints(fn, include_extras=True)


def print_prune(report: Any) -> None:
    if report.dry_run:
        typer.echo(
            f"dry run: {report.runs} finished run(s) ({', '.join(report.statuses) or 'none'}) "
            f"finished before {_when(report.before)} would be pruned"
        )
        for run_id in report.run_ids[:50]:
            typer.echo(f"  {run_id}")
        if report.runs > 50:
            typer.echo(f"  ... and {report.runs - 50} more")
        return
    rows = ", ".join(f"{table} {n}" for table, n in sorted(report.rows.items()) if n)
    typer.echo(
        f"pruned {report.runs} run(s) finished before {_when(report.before)} in "
        f"{report.batches} batch(es): {rows or 'no rows'}; {report.folders} artifact folder(s)"
    )


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def watch(app: App, run_id: str, *, after: int, as_json: bool, follow: bool, poll: float) -> str:
    """Print the run's events after `after`, then new ones as they commit, until the run has
    finished (or at once with follow=False); return its last status."""
    cursor = Cursor(app, run_id, after)
    while True:
        rows, over = cursor.poll()
        for row in rows:
            typer.echo(dumps(event_json(row)) if as_json else event_line(row))
        if over or (not follow and not rows):
            return cursor.status
        if not rows:
            time.sleep(poll)


def event_line(row: dict[str, Any]) -> str:
    when = time.strftime("%H:%M:%S", time.gmtime(row["at"]))
    who = f" [{row['worker_id']} #{row['lease_token']}]" if row.get("worker_id") else ""
    text = logs.describe(row["kind"], row["data"] if isinstance(row["data"], dict) else {})
    return logs.redact(f"{row['event_id']:>6} {when}{who} {text}")
