"""How a `keel` command ends and what it reads: Keel's errors (and unreachable databases) become
one red line on stderr and an exit code, 2 for bad usage or input and 1 for everything else;
the user's input and login name are read here, and the checks made before touching a database.
"""

from __future__ import annotations

import functools
import getpass
import json
import sqlite3
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from keel.cli.render import out, redact
from keel.core.errors import (
    InvalidId,
    InvalidInput,
    JobExists,
    KeelError,
    UnknownWorkflow,
    UsageError,
    WrongWaitKind,
)
from keel.core.runs import job_exists_message
from keel.core.wait_model import WaitKind
from keel.runtime import preflight
from keel.runtime.app import App
from keel.runtime.loading import BadAppSpec
from keel.runtime.runtime import RunDetails

P = ParamSpec("P")
R = TypeVar("R")


class IfExists(StrEnum):
    """`keel submit --if-exists`: what to do when the job already has a run with other input."""

    NEW = "new"
    REUSE = "reuse"
    ERROR = "error"


BAD_USAGE = 2


def _wrong_kind(exc: KeelError) -> str:
    """An answer the wait does not take, with the command that gives the one it does."""
    assert isinstance(exc, WrongWaitKind)
    if exc.wait_kind == WaitKind.EFFECT:
        return (
            f"wait {exc.wait_id} is an in-doubt effect, not an approval: use "
            "`keel resolve-effect RUN --performed` or `--not-performed`"
        )
    if exc.wait_kind == WaitKind.APPROVAL:
        return (
            f"wait {exc.wait_id} is an approval, not an in-doubt effect: use "
            "`keel approve RUN` or `keel reject RUN`"
        )
    return str(exc)  # another kind: the core's own words


def _job_exists(exc: KeelError) -> str:
    """`--if-exists error` refused: the other choices as options, not Python's keywords."""
    assert isinstance(exc, JobExists)
    return job_exists_message(
        exc.job_id, exc.runs[0], new="--if-exists new", reuse="--if-exists reuse"
    )


# Keel's errors at the terminal, most specific first: the exit code, and the message (None:
# the exception's own sentence). Bad usage or input is 2, everything else 1.
KEEL_ERRORS: tuple[tuple[type[KeelError], int, Callable[[KeelError], str] | None], ...] = (
    (WrongWaitKind, BAD_USAGE, _wrong_kind),
    (JobExists, 1, _job_exists),
    (InvalidId, BAD_USAGE, None),
    (InvalidInput, BAD_USAGE, None),
    (UnknownWorkflow, BAD_USAGE, None),
    (UsageError, BAD_USAGE, None),
    (KeelError, 1, None),
)


def say(message: str) -> None:
    """One message line; the terminal, not rich, wraps it."""
    out().print(message, soft_wrap=True, markup=False)


def warn(message: str) -> None:
    """One yellow line on stderr; the command goes on."""
    Console(stderr=True, highlight=False).print(
        Text(f"warning: {message}", style="yellow"), soft_wrap=True
    )


def fail(message: str, code: int = 1) -> NoReturn:
    """One red line on stderr, no traceback, and the exit code."""
    Console(stderr=True, highlight=False).print(
        Text(f"error: {message}", style="red"), soft_wrap=True
    )
    raise typer.Exit(code)


def database_error(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return isinstance(exc, sqlite3.Error) or module.startswith(("psycopg", "psycopg_pool"))


def bad_spec_is_usage(fn: Callable[P, R]) -> Callable[P, R]:
    """An APP argument that names no App is a bad argument: click's usage error, exit 2."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except BadAppSpec as exc:
            raise typer.BadParameter(str(exc)) from None

    return wrapper


def guarded(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn Keel's errors (and unreachable databases) into `fail()`; let bugs raise."""

    spec_checked = bad_spec_is_usage(fn)

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return spec_checked(*args, **kwargs)
        except KeelError as exc:
            code, words = next((c, w) for cls, c, w in KEEL_ERRORS if isinstance(exc, cls))
            fail(words(exc) if words else str(exc), code)
        except OverflowError as exc:
            # A number past what the database (or a date) holds: --limit 99999999999999999999.
            fail(f"a number given is out of range: {exc}", BAD_USAGE)
        except Exception as exc:
            if not database_error(exc):
                raise
            if type(exc).__name__ == "NumericValueOutOfRange":  # PostgreSQL's word for it
                fail(f"a number given is out of range: {exc}".strip(), BAD_USAGE)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            fail(f"database error ({type(exc).__name__}): {redact(first)}")

    return wrapper


OPTIONS_HINT = "or pass --db/--app"
APP_HINT = "or point APP at an existing database: App(url) or $KEEL_DATABASE_URL"
"""For commands whose APP argument chooses the database: they take no --db/--app."""


def check_database(app: App, *, existing: bool = True, hint: str = OPTIONS_HINT) -> None:
    """Fail fast where the database is missing (unless `existing` is False) or unreachable;
    `hint` names what this command takes to choose another database."""
    try:
        preflight.check_database(app.url, existing=existing)
    except preflight.NoDatabase as exc:
        fail(f"{exc} ({hint})")


def read_input(input_json: str | None, input_file: str | None) -> Any:
    if (input_json is None) == (input_file is None):
        fail("give the run's input with exactly one of --input JSON or --input-file PATH", 2)
    if input_file is not None:
        try:
            text = sys.stdin.read() if input_file == "-" else Path(input_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read --input-file {input_file}: {exc}", BAD_USAGE)
        where = f"--input-file {input_file}"
    else:
        assert input_json is not None
        text, where = input_json, "--input"
    return json_value(text, where)


def json_value(text: str, where: str) -> Any:
    """`text` as JSON, or exit 2 saying where it is not (and, for a bare word, how a string
    is written)."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        hint = f" (a string is written with quotes: '\"{text}\"')" if text.isidentifier() else ""
        fail(
            f"{where} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}{hint}",
            BAD_USAGE,
        )


def _no_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity; JSON has none, and no other reader takes them back.
    raise json.JSONDecodeError(f"{name} is not JSON (JSON has no NaN or infinity)", name, 0)


def effect_wait(details: RunDetails, wait_id: str | None) -> str | None:
    """The wait `keel resolve-effect` answers: the one named, else the run's pending one (None:
    the core picks it), else, nothing pending, the in-doubt effect resolved last, so that a
    repeat is told what was recorded. Whether the wait takes the answer is the core's say."""
    if wait_id is not None or any(w["status"] == "pending" for w in details.waits):
        return wait_id
    decided = [w for w in details.waits if w["kind"] == WaitKind.EFFECT]
    if not decided:
        rid = details.run["run_id"]
        fail(f"run {rid} ({details.status}) has no in-doubt effect to resolve")
    return str(decided[-1]["wait_id"])


def login() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in this environment (a bare container)
        return "cli"


def json_object(text: str | None, where: str) -> dict[str, Any] | None:
    """`text` (an option's JSON) as a dict, None if not given; a clear usage error, naming
    `where`, for JSON that does not parse or is not an object."""
    if text is None:
        return None
    value = json_value(text, where)
    if not isinstance(value, dict):
        fail(f"{where} must be a JSON object, not {type(value).__name__}", BAD_USAGE)
    return value
