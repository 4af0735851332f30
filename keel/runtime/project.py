"""A LangGraph CLI project (`langgraph.json`) as a keel.App: `load_project(path)`.

`keel dev`, `keel serve --config` and `keel worker --config` read the file `langgraph dev` reads.
Each entry of `graphs` (`./path.py:attr` or `module:attr`, naming a StateGraph builder, a compiled
graph, or a function of no argument or of a RunnableConfig that returns one) becomes a workflow
named by its graph id, version "1" unless the file's `keel` section says otherwise; `env` (a
mapping, or a .env file) fills the environment; `store` and `auth` are kept for the server
(`project_of`). What Keel does not use is said, never silently dropped. See docs/projects.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import json
import logging
import os
import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from langgraph.pregel import Pregel

from keel.core.errors import InvalidWorkflow, UsageError
from keel.runtime.app import App

log = logging.getLogger("keel.project")

CONFIG_NAME = "langgraph.json"
DEFAULT_VERSION = "1"
KEEL_KEY = "keel"
"""Keel's own section of a langgraph.json: `{"versions": {graph_id: version}}`."""

# Keys that only shape the Docker image LangGraph's CLI builds: nothing for a running process.
BUILD_KEYS = frozenset(
    {
        "$schema",
        "python_version",
        "node_version",
        "api_version",
        "base_image",
        "image_distro",
        "pip_config_file",
        "pip_installer",
        "dockerfile_lines",
        "keep_pkg_tools",
        "_INTERNAL_docker_tag",
    }
)
# LangGraph features Keel does not offer (yet): said at every start, then ignored.
UNSUPPORTED_KEYS = {
    "checkpointer": "Keel checkpoints every run in its own database, with its fenced saver",
    "http": "custom routes, CORS and route switches are not supported by Keel yet",
    "encryption": "at-rest encryption hooks are not supported by Keel yet",
    "webhooks": "webhooks are not supported by Keel yet",
    "ui": "generative UI components are not supported by Keel yet",
    "ui_config": "generative UI components are not supported by Keel yet",
}
KNOWN_KEYS = frozenset({"graphs", "env", "dependencies", "store", "auth", KEEL_KEY}) | BUILD_KEYS


class ProjectError(UsageError):
    """The langgraph.json project cannot be loaded (the message says which part and why)."""


@dataclass(frozen=True)
class GraphEntry:
    """One entry of `graphs`: the graph id (the workflow's name), where it is, its version."""

    graph_id: str
    spec: str
    version: str = DEFAULT_VERSION
    description: str | None = None


@dataclass(frozen=True)
class Project:
    """A langgraph.json as read: nothing imported, no environment variable set."""

    path: Path
    """The config file, absolute."""
    graphs: tuple[GraphEntry, ...]
    env: Mapping[str, str]
    """The variables of `env` (its mapping, or the .env file it names)."""
    store: Mapping[str, Any] | None
    auth: Mapping[str, Any] | None
    notes: tuple[str, ...]
    """What Keel leaves to the user by design (`dependencies`): logged at INFO."""
    warnings: tuple[str, ...]
    """Keys Keel does not honour or does not know: logged as warnings."""
    config: Mapping[str, Any]
    """The whole file, for what later reads it (the server's store and auth)."""

    @property
    def root(self) -> Path:
        """The config's folder: graph paths and the env file are relative to it."""
        return self.path.parent

    @property
    def default_url(self) -> str:
        """The database when neither `url` nor $KEEL_DATABASE_URL says: `.keel/keel.db` beside
        the config."""
        return f"sqlite:///{self.root / '.keel' / 'keel.db'}"


_projects: weakref.WeakKeyDictionary[App, Project] = weakref.WeakKeyDictionary()


def project_of(app: App) -> Project | None:
    """The project `app` was loaded from by `load_project` (None for an App made otherwise)."""
    return _projects.get(app)


def load_project(path: str | Path, *, url: str | None = None) -> App:
    """A keel.App serving the graphs of the langgraph.json at `path` (or in the folder `path`).

    The database is `url`, else $KEEL_DATABASE_URL (which the project's `env` may set), else
    `sqlite:///<config folder>/.keel/keel.db`; artifacts go to $KEEL_ARTIFACTS_DIR, else
    `.keel/artifacts` beside the config. Variables of `env` fill the environment where they
    are not set already. Each graph is imported (its folder made importable) and registered;
    ProjectError says what is wrong with the file, a spec, an import or what it names.
    """
    project = read_project(path)
    for note in project.notes:
        log.info("%s: %s", project.path.name, note)
    for warning in project.warnings:
        log.warning("%s: %s", project.path.name, warning)
    for name, value in project.env.items():
        os.environ.setdefault(name, value)
    _importable(project.root)
    app = App(
        url or os.environ.get("KEEL_DATABASE_URL") or project.default_url,
        artifacts_dir=os.environ.get("KEEL_ARTIFACTS_DIR") or project.root / ".keel" / "artifacts",
    )
    try:
        for entry in project.graphs:
            factory = graph_factory(entry, project.root)
            try:
                app.workflow(entry.graph_id, entry.version)(factory)
            except InvalidWorkflow as exc:
                raise ProjectError(f"graph {entry.graph_id!r} ({entry.spec}): {exc}") from exc
    except BaseException:
        app.close()
        raise
    _projects[app] = project
    return app


# -- reading the file ---------------------------------------------------------------------------


def read_project(path: str | Path) -> Project:
    """Read and check the langgraph.json at `path` (a file, or a folder holding one)."""
    given = Path(path)
    file = (given / CONFIG_NAME if given.is_dir() else given).resolve()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProjectError(f"no project config at {file}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProjectError(f"cannot read {file}: {exc}") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProjectError(
            f"{file} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(config, dict):
        raise ProjectError(f"{file}: expected a JSON object, got {type(config).__name__}")
    notes, warnings = [], []
    if config.get("dependencies"):
        notes.append(
            "`dependencies` are not installed by Keel: install them into this environment "
            "(e.g. `pip install -e .`); the config's folder is importable"
        )
    for key in config:
        if key in UNSUPPORTED_KEYS:
            warnings.append(f"`{key}` is ignored: {UNSUPPORTED_KEYS[key]}")
        elif key not in KNOWN_KEYS:
            warnings.append(
                f"unknown key `{key}` is ignored (a typo? Keel reads graphs, env, store, auth "
                f"and its own `{KEEL_KEY}` section)"
            )
    versions = _versions(config.get(KEEL_KEY), file)
    graphs = _graphs(config.get("graphs"), versions, file)
    return Project(
        path=file,
        graphs=graphs,
        env=_env(config.get("env"), file),
        store=_section(config, "store", file),
        auth=_auth(config, file),
        notes=tuple(notes),
        warnings=tuple(warnings),
        config=config,
    )


def _graphs(value: Any, versions: Mapping[str, str], file: Path) -> tuple[GraphEntry, ...]:
    if not isinstance(value, dict) or not value:
        raise ProjectError(
            f'{file}: `graphs` must map each graph id to "./path.py:attribute" or '
            '"module:attribute", e.g. {"agent": "./agent.py:graph"}'
        )
    entries = []
    for graph_id, spec in value.items():
        description = None
        if isinstance(spec, dict):
            description = spec.get("description")
            spec = spec.get("path")
            if description is not None and not isinstance(description, str):
                raise ProjectError(f"{file}: the description of graph {graph_id!r} is not text")
        if not graph_id or not isinstance(spec, str) or not spec.strip():
            raise ProjectError(
                f'{file}: graph {graph_id!r} needs a "./path.py:attribute" or "module:attribute" '
                '(or {"path": ..., "description": ...})'
            )
        version = versions.get(graph_id, DEFAULT_VERSION)
        entries.append(GraphEntry(graph_id, spec.strip(), version, description))
    unknown = sorted(set(versions) - set(value))
    if unknown:
        raise ProjectError(f"{file}: `{KEEL_KEY}.versions` names no graph {', '.join(unknown)}")
    return tuple(entries)


def _versions(section: Any, file: Path) -> dict[str, str]:
    if section is None:
        return {}
    if not isinstance(section, dict) or set(section) - {"versions"}:
        raise ProjectError(f'{file}: `{KEEL_KEY}` takes only {{"versions": {{graph_id: version}}}}')
    versions = section.get("versions") or {}
    if not isinstance(versions, dict) or not all(
        isinstance(v, str | int) and not isinstance(v, bool) and str(v) for v in versions.values()
    ):
        raise ProjectError(f"{file}: `{KEEL_KEY}.versions` maps graph ids to version strings")
    return {str(k): str(v) for k, v in versions.items()}


def _env(value: Any, file: Path) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, str):
        env_file = (file.parent / value).resolve()
        try:
            return parse_env_file(env_file.read_text(encoding="utf-8"), env_file)
        except FileNotFoundError:
            raise ProjectError(f"{file}: `env` names {env_file}, which does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ProjectError(f"{file}: cannot read the env file {env_file}: {exc}") from None
    if not isinstance(value, dict):
        raise ProjectError(f"{file}: `env` must be an object of variables or a .env file's path")
    env = {}
    for name, setting in value.items():
        if isinstance(setting, dict | list) or setting is None:
            raise ProjectError(f"{file}: env variable {name!r} must be a string")
        env[str(name)] = str(setting).lower() if isinstance(setting, bool) else str(setting)
    return env


def parse_env_file(text: str, where: Path) -> dict[str, str]:
    """`KEY=value` lines (`export ` allowed, `#` comments, values optionally quoted)."""
    env = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or " " in name:
            raise ProjectError(f"{where}, line {number}: expected KEY=value")
        if value[:1] in ("'", '"') and value.find(value[0], 1) > 0:
            value = value[1 : value.find(value[0], 1)]  # what follows the quote: a comment
        else:
            value = value.split(" #", 1)[0].rstrip()
        env[name] = value
    return env


def _section(config: Mapping[str, Any], key: str, file: Path) -> Mapping[str, Any] | None:
    value = config.get(key)
    if value is not None and not isinstance(value, dict):
        raise ProjectError(f"{file}: `{key}` must be an object")
    return value


def _auth(config: Mapping[str, Any], file: Path) -> Mapping[str, Any] | None:
    auth = _section(config, "auth", file)
    if auth is not None and not isinstance(auth.get("path"), str):
        raise ProjectError(f'{file}: `auth` needs a "path" to a langgraph_sdk.Auth object')
    return auth


# -- importing the graphs -----------------------------------------------------------------------


def graph_factory(entry: GraphEntry, root: Path) -> Callable[[], Any]:
    """What the workflow registers: a function giving the graph `entry` names (imported, and
    built once if it is a factory, so that every compilation gets the same graph)."""
    target = import_target(entry, root)
    if is_graph(target):
        _check_supported(entry, target)
        return lambda: target
    if isinstance(target, type) or not callable(target):
        what = "a class" if isinstance(target, type) else f"a {type(target).__name__}"
        raise ProjectError(
            f"graph {entry.graph_id!r}: {entry.spec} is {what}, not a graph (a StateGraph, a "
            "compiled graph, or a function returning one)"
        )
    made = _call_factory(entry, target)
    if not is_graph(made):
        hint = ""
        if hasattr(made, "__enter__") or hasattr(made, "__aenter__"):
            hint = " (a context manager: Keel builds each graph once, so return the graph itself)"
        raise ProjectError(
            f"graph {entry.graph_id!r}: {entry.spec} returned a {type(made).__name__}, not a "
            f"StateGraph or a compiled graph{hint}"
        )
    _check_supported(entry, made)
    return lambda: made


def _check_supported(entry: GraphEntry, graph: Any) -> None:
    # Keel reads a graph's structure from its StateGraph builder (keel.langgraph.shape).
    if isinstance(graph, Pregel) and getattr(graph, "builder", None) is None:
        raise ProjectError(
            f"graph {entry.graph_id!r}: {entry.spec} is a graph without a StateGraph builder "
            "(the functional API's @entrypoint, a Pregel built by hand): not supported by Keel "
            "yet; build it with StateGraph"
        )


def is_graph(value: Any) -> bool:
    """A compiled graph (a Pregel: `builder.compile()`, `@entrypoint`) or a builder to compile."""
    if isinstance(value, Pregel):
        return True
    return not isinstance(value, type) and callable(getattr(value, "compile", None))


def import_target(entry: GraphEntry, root: Path) -> Any:
    """The object `entry.spec` names: `./path.py:attr` (a file, relative to `root`) or
    `module:attr` (`root` importable); a dotted `attr` walks attributes."""
    where, sep, attr = entry.spec.rpartition(":")
    if not sep or not where or not attr:
        raise ProjectError(
            f"graph {entry.graph_id!r}: expected ./path.py:attribute or module:attribute, "
            f"got {entry.spec!r}"
        )
    try:
        if where.endswith(".py") or "/" in where or "\\" in where:
            module = _load_file((root / where).resolve(), entry)
        else:
            _importable(root)
            module = importlib.import_module(where)
    except ProjectError:
        raise
    except Exception as exc:
        raise ProjectError(
            f"graph {entry.graph_id!r}: importing {where} failed: {_why(exc)}"
        ) from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ProjectError(
                f"graph {entry.graph_id!r}: {where} has no attribute {attr!r}"
            ) from None
    return target


def _load_file(path: Path, entry: GraphEntry) -> ModuleType:
    if not path.is_file():
        raise ProjectError(f"graph {entry.graph_id!r}: no file {path} (from {entry.spec})")
    # A file inside packages is imported by its dotted name, so that its relative imports and
    # its package's absolute ones work as they do once the project is installed.
    top, parts = path.parent, [path.stem]
    while (top / "__init__.py").is_file():
        parts.insert(0, top.name)
        top = top.parent
    _importable(top)
    if len(parts) > 1:
        name = ".".join(parts)
        module = importlib.import_module(name)
        if not _same_file(module, path):
            raise ProjectError(
                f"graph {entry.graph_id!r}: importing {name} gave {module.__file__}, not {path} "
                "(another package of that name comes first on sys.path)"
            )
        return module
    # A lone file: under its own name unless a module of that name is another file; never
    # replacing what sys.modules holds.
    name = path.stem
    known = sys.modules.get(name)
    if known is not None and not _same_file(known, path):
        name = f"{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
        known = sys.modules.get(name)
    if known is not None:
        return known
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ProjectError(f"graph {entry.graph_id!r}: {path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs, as an import does: LangGraph resolves the state's type hints
    # through sys.modules.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _same_file(module: ModuleType, path: Path) -> bool:
    file = getattr(module, "__file__", None)
    return file is not None and Path(file).resolve() == path


def _importable(folder: Path) -> None:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def _call_factory(entry: GraphEntry, factory: Callable[..., Any]) -> Any:
    try:
        params = [
            p
            for p in inspect.signature(factory).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    if sum(p.default is p.empty for p in params) > 1:
        raise ProjectError(
            f"graph {entry.graph_id!r}: {entry.spec} takes more than one argument; a graph "
            "factory takes none or a RunnableConfig"
        )
    # Built once for every run, not per run as LangGraph's server does: the config is empty.
    args: tuple[Any, ...] = ({"configurable": {}},) if params else ()
    try:
        made = factory(*args)
        if inspect.isawaitable(made):
            made = _run_coroutine(made)
    except Exception as exc:
        raise ProjectError(
            f"graph {entry.graph_id!r}: calling {entry.spec} as a graph factory failed: {_why(exc)}"
        ) from exc
    return made


def _run_coroutine(awaitable: Any) -> Any:
    async def wait() -> Any:
        return await awaitable

    coro: Coroutine[Any, Any, Any] = wait()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # Called on a running loop (an async caller): the factory gets a loop of its own.
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name="keel-graph-factory")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _why(exc: BaseException) -> str:
    """`Type: message (at file:line)`, the place being the innermost frame of the user's code."""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" (at {exc.filename}:{exc.lineno})"
    else:
        frames = [
            frame
            for frame in traceback.extract_tb(exc.__traceback__)
            if not frame.filename.startswith("<frozen ")
            and frame.filename != __file__
            and Path(frame.filename).parent.name != "importlib"
        ]
        where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    hint = ""
    if isinstance(exc, ModuleNotFoundError):
        hint = "; Keel does not install the project's `dependencies`: install them here"
    return f"{type(exc).__name__}: {exc}{where}{hint}"
