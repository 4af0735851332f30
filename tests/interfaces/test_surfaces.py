"""The three surfaces are one product: docs/reference.md's table of operations is walked
against the Python API (sync and async), the `keel` command and the HTTP API."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import typer
from fastapi.testclient import TestClient

import keel
from keel.cli.commands import cli
from keel.service.api import create_app
from keel.service.errors import DECISION_CONFLICT, KEEL_ERRORS

ROOT = Path(__file__).resolve().parents[2]
SYNC_ONLY = {"workflow", "webhook", "add_notifier", "close"}
# Codes the service decides itself (keel.service.errors.Refused and FastAPI's validation).
SERVICE_CODES = {"invalid_request", "artifact_not_found", DECISION_CONFLICT[1]}


def table() -> list[dict[str, str]]:
    text = (ROOT / "docs" / "reference.md").read_text()
    section = text.split("## One product, three surfaces", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    assert header[:4] == ["operation", "Python (`app.` / `await app.aio.`)", "CLI", "HTTP"]
    return [
        dict(zip(("operation", "python", "cli", "http", "errors"), cells, strict=True))
        for row in rows[2:]
        for cells in [[c.strip() for c in row.strip().strip("|").split("|")]]
    ]


def commands(group: typer.core.TyperGroup, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for name, command in group.commands.items():
        if isinstance(command, typer.core.TyperGroup):
            found |= commands(command, (*prefix, name))
        else:
            found.add((*prefix, name))
    return found


def test_every_python_operation_is_in_the_table_and_on_aio() -> None:
    rows = table()
    named = {r["python"].strip("`") for r in rows}
    operations = {
        name
        for name, _ in inspect.getmembers(keel.App, inspect.isfunction)
        if not name.startswith("_") and name not in SYNC_ONLY
    }
    assert operations <= named, f"not in docs/reference.md: {operations - named}"
    for name in named:
        assert callable(getattr(keel.App, name)), name
        assert inspect.iscoroutinefunction(getattr(keel.AsyncApp, name)), name


def last_name(annotation: object) -> str:
    # Annotations are strings (postponed): "DecisionResult" and "decisions.DecisionResult" agree.
    return str(annotation).rpartition(".")[2]


def test_aio_takes_the_same_parameters_and_returns_the_same_type() -> None:
    for name, method in inspect.getmembers(keel.App, inspect.isfunction):
        if name.startswith("_") or name in SYNC_ONLY:
            continue
        sync, coro = inspect.signature(method), inspect.signature(getattr(keel.AsyncApp, name))
        assert list(sync.parameters.values()) == list(coro.parameters.values()), (
            f"{name}: App{sync} but app.aio{coro}"
        )
        assert last_name(sync.return_annotation) == last_name(coro.return_annotation), name


def test_the_cli_and_http_offer_what_the_table_says(tmp_path: Path) -> None:
    group = typer.main.get_group(cli)
    assert isinstance(group, typer.core.TyperGroup)
    cli_commands = commands(group)
    api = create_app(keel.App(f"sqlite:///{tmp_path}/k.db"), tokens={})
    routes = {
        (method.upper(), path)
        for path, methods in api.openapi()["paths"].items()
        for method in methods
    }
    console = TestClient(api)
    known_codes = {code for _, _, code in KEEL_ERRORS} | SERVICE_CODES
    for row in table():
        if row["cli"] != "-":
            words = tuple(row["cli"].strip("`").split()[1:])
            assert words[0:1] != (), row
            assert words in cli_commands, f"{row['operation']}: no `keel {' '.join(words)}`"
        if row["http"] != "-":
            method, path = row["http"].strip("`").split()
            if path.startswith("/ui/"):
                # A console page (not in the API's schema): it exists when it is not a 404.
                status = console.request(
                    method, path.replace("{run_id}", "r"), follow_redirects=False
                ).status_code
                assert status not in (404, 405), f"{row['operation']}: no {method} {path}"
            else:
                assert (method, path) in routes, f"{row['operation']}: no {method} {path}"
        for code in re.findall(r"`([a-z_]+)`", row["errors"]):
            assert code in known_codes, f"{row['operation']}: unknown error code {code}"
