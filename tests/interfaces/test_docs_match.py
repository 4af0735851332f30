"""The reference pages say what the code does: docs/cli.md against the real `keel --help`,
docs/reference.md's signatures against the real functions. A command, option or parameter
added, renamed or removed without its page fails here."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

import keel
from keel.cli.commands import cli
from keel.core.clock import parse_duration
from keel.core.store.base import load_migrations

ROOT = Path(__file__).resolve().parents[2]
CLI_MD = (ROOT / "docs" / "cli.md").read_text()
REFERENCE_MD = (ROOT / "docs" / "reference.md").read_text()


def leaf_commands(group: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, command) of every runnable command; typer's click is its own (typer._click)."""
    for name, command in sorted(group.commands.items()):
        path = f"{prefix}{name}"
        if hasattr(command, "commands"):
            yield from leaf_commands(command, f"{path} ")
        else:
            yield path, command


COMMANDS = dict(leaf_commands(typer.main.get_command(cli)))
DATABASE_OPTIONS = {"--app", "--db"}
"""Written once, in docs/cli.md's "Choosing the database", for every command that takes them."""


def synopses() -> dict[str, str]:
    """Command path -> its `## keel ...` heading line (one heading may name two commands)."""
    found: dict[str, str] = {}
    for line in CLI_MD.splitlines():
        if not line.startswith("## `keel "):
            continue
        for words in re.findall(r"`keel ([a-z][a-z-]*(?: [a-z][a-z-]*)?)", line):
            path = words if words in COMMANDS else words.split()[0]
            found[path] = line
    return found


def test_the_help_listing_names_every_command_and_nothing_else() -> None:
    block = CLI_MD.split("$ keel --help\n", 1)[1].split("```", 1)[0]
    listed = " ".join(block.split()).removeprefix("Commands: ")
    documented = set()
    for item in re.finditer(r"([a-z-]+)(?: \(([^)]*)\))?", listed):
        group, subcommands = item.group(1), item.group(2)
        if subcommands:
            documented |= {f"{group} {s.strip()}" for s in subcommands.split(",")}
        else:
            documented.add(group)
    assert documented == set(COMMANDS)


def test_the_database_options_are_written_once_for_all() -> None:
    section = CLI_MD.split("## Choosing the database", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{option}" in section for option in DATABASE_OPTIONS)


def test_a_groups_help_names_each_of_its_commands() -> None:
    root = typer.main.get_command(cli)
    for name, group in root.commands.items():  # type: ignore[attr-defined]
        if hasattr(group, "commands"):
            said = group.help or ""
            assert [c for c in group.commands if c not in said] == [], f"keel {name} --help"


def test_every_command_has_a_synopsis() -> None:
    assert sorted(set(COMMANDS) - set(synopses())) == []


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_a_synopsis_names_exactly_the_commands_options(path: str) -> None:
    line = synopses().get(path)
    if line is None:
        pytest.fail(f"docs/cli.md has no synopsis for `keel {path}`")
    written = set(re.findall(r"(--[a-z][a-z-]*)", line))
    params = [
        p for p in COMMANDS[path].params if p.param_type_name == "option" and p.name != "help"
    ]
    missing = [
        p.opts[0]
        for p in params
        if not written & {*p.opts, *p.secondary_opts} and p.opts[0] not in DATABASE_OPTIONS
    ]
    real = {o for p in params for o in (*p.opts, *p.secondary_opts)}
    assert (missing, sorted(written - real)) == ([], []), f"`keel {path}` in docs/cli.md"


# -- docs/reference.md ---------------------------------------------------------------------------


def documented_calls(prefix: str) -> dict[str, str]:
    """`name(params)` spans after `prefix` (`app.` methods are written bare in their table)."""
    found: dict[str, str] = {}
    for span in re.findall(r"`([^`]*\))(?: -> [^`]*)?`", REFERENCE_MD):
        match = re.fullmatch(rf"{re.escape(prefix)}([a-z_]+)\((.*)\)", span.strip())
        if match and match.group(1) not in found:
            found[match.group(1)] = match.group(2)
    return found


def parameters(text: str) -> dict[str, str | None]:
    """`a, *, b=1, c=None` -> {a: None, b: "1", c: "None"}; `...` and `*` are skipped."""
    names: dict[str, str | None] = {}
    depth, current, parts = 0, "", []
    for char in text:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    for part in (p.strip() for p in parts):
        if part in ("", "*", "...") or part.startswith("*"):
            continue
        name, _, default = part.partition("=")
        names[name.strip()] = default.strip() or None
    return names


def real_parameters(function: Any) -> dict[str, Any]:
    """Name -> default; `**options: Unpack[SomeTypedDict]` counts as the TypedDict's keys
    (their defaults are the function's business: `inspect.Parameter.empty`)."""
    signature = inspect.signature(function)
    found = {
        name: p.default
        for name, p in signature.parameters.items()
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    hints = typing.get_type_hints(function, include_extras=True)
    for name, p in signature.parameters.items():
        if p.kind is p.VAR_KEYWORD and typing.get_origin(hints.get(name)) is typing.Unpack:
            (options,) = typing.get_args(hints[name])
            found |= dict.fromkeys(typing.get_type_hints(options), inspect.Parameter.empty)
    return found


APP_METHODS = {
    name: text
    for name, text in documented_calls("").items()
    if hasattr(keel.App, name) and name not in ("effect", "enqueue")
}


def test_the_reference_documents_app_methods() -> None:
    assert len(APP_METHODS) >= 25, sorted(APP_METHODS)


@pytest.mark.parametrize("name", sorted(APP_METHODS))
def test_an_app_method_has_the_documented_parameters(name: str) -> None:
    text = APP_METHODS[name]
    written, real = parameters(text), real_parameters(getattr(keel.App, name))
    if "..." not in text:
        assert sorted(set(real) - set(written)) == [], f"App.{name}: undocumented parameters"
    assert sorted(set(written) - set(real)) == [], f"App.{name}: documented, not real"
    for param, default in written.items():
        if default is not None and real[param] is not inspect.Parameter.empty:
            assert same_default(default, real[param]), (
                f"App.{name}({param}=...): documented {default}, real {real[param]!r}"
            )


def same_default(written: str, real: Any) -> bool:
    """`1_000_000` is 1000000, `"1h"` is 3600.0 where the parameter takes a duration."""
    if written.replace("_", "") == repr(real).replace("'", '"'):
        return True
    if isinstance(real, float) and written.startswith('"'):
        return parse_duration(written.strip('"')) == real
    return False


@pytest.mark.parametrize(
    ("call", "function"),
    [
        ("keel.App", keel.App.__init__),
        ("keel.enqueue", keel.enqueue),
        ("keel.await_effect", keel.await_effect),
        ("keel.await_effects", keel.await_effects),
        ("keel.approval", keel.approval),
        ("keel.heartbeat", keel.heartbeat),
        ("keel.Retry", keel.Retry),
        ("keel.sleep", keel.sleep),
    ],
)
def test_a_keel_function_has_the_documented_parameters(call: str, function: Any) -> None:
    text = documented_calls("")
    spans = re.findall(rf"`{re.escape(call)}\((.*?)\)`", REFERENCE_MD)
    assert spans, f"docs/reference.md does not show {call}(...)"
    written, real = parameters(spans[0]), real_parameters(function)
    assert text is not None
    assert sorted(set(real) - set(written)) == [], f"{call}: undocumented parameters"
    assert sorted(set(written) - set(real)) == [], f"{call}: documented, not real"


def test_keel_effect_is_documented_with_every_option() -> None:
    spans = re.findall(r"`@keel\.effect\((.*?)\)`", REFERENCE_MD)
    assert len(spans) == 2, "the ledger form and the outbox form"
    written = set().union(*(parameters(span) for span in spans))
    assert sorted(written ^ set(real_parameters(keel.effect))) == []


def test_the_schema_versions_the_docs_show_are_this_keels() -> None:
    latest = load_migrations("sqlite")[-1].version
    assert latest == load_migrations("postgres")[-1].version
    docs = CLI_MD + (ROOT / "docs" / "http.md").read_text()
    shown = re.findall(r"(?:at version|schema_version\":|older than version) ?(\d+)", docs)
    assert shown, "the docs show no schema version"
    assert {int(n) for n in shown} <= {0, latest}, f"this Keel's schema is at version {latest}"
