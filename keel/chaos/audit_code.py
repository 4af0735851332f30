"""What `keel audit` reads in the user's code, without running it: node functions and factories.

- Each node of a builder, and the functions it runs (partials, bound methods, wrappers and
  LangGraph's executor partial undone; a ToolNode's tools; a subgraph's nodes as `outer/inner`).
- From those functions, transitively through the functions of the same package they name
  (globals, closures, attributes of modules and of objects whose class is the package's own):
  the effects they use, the known network clients they name or import, and their waits
  (`keel.approval()` without `timeout=`, LangGraph's plain `interrupt()`).
- Whether a workflow was registered without `version=`, from its factory module's source.

It sees what the functions name, not what they do at run time: a client reached through a
parameter is not seen, and a read over HTTP is counted like a write.
"""

from __future__ import annotations

import ast
import builtins
import dis
import functools
import inspect
import textwrap
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from langgraph.types import interrupt

from keel.core.effects.ledger import Effect
from keel.core.effects.outbox import OutboxEffect
from keel.core.waits import approval as keel_approval
from keel.core.workflows import Workflow

CLIENTS = (
    "smtplib",
    "requests",
    "httpx",
    "urllib.request",
    "urllib3",
    "http.client",
    "socket",
    "aiohttp",
    "boto3",
    "botocore",
    "stripe",
    "slack_sdk",
)
"""Modules whose use in a node is a call to the outside world (submodules included)."""

MAX_FUNCTIONS = 400
"""At most this many functions read per node (a guard against a huge package)."""

AnyEffect = Effect[Any, Any] | OutboxEffect[Any, Any]

_MISSING = object()
"""A name or attribute that could not be read without running code."""


@dataclass(frozen=True)
class Wait:
    kind: str  # "approval" | "interrupt"
    where: str  # function qualname
    name: str | None


@dataclass(frozen=True)
class ClientUse:
    client: str
    where: str
    named: str


# -- a builder's nodes ------------------------------------------------------------------------


def read_nodes(builder: Any) -> Iterator[tuple[str, Reader]]:
    """(node name, what reading its functions found) for each node of a StateGraph builder."""
    for node, fns in _nodes(builder):
        reader = Reader(fns[0] if fns else None)
        for fn in fns:
            reader.read(fn)
        yield node, reader


def _nodes(builder: Any, prefix: str = "") -> Iterator[tuple[str, list[Callable[..., Any]]]]:
    """(node name, the functions it runs) for each node; a subgraph's nodes as `outer/inner`."""
    for name, spec in builder.nodes.items():
        runnable = getattr(spec, "runnable", spec)
        where = f"{prefix}{name}"
        inner = getattr(runnable, "builder", None)
        if inner is not None and isinstance(getattr(inner, "nodes", None), Mapping):
            yield from _nodes(inner, f"{where}/")
            continue
        yield where, list(_functions_of(runnable))


def _functions_of(runnable: Any) -> Iterator[Callable[..., Any]]:
    """The user functions a node's runnable calls: a function's own, a ToolNode's tools."""
    found = False
    for attr in ("func", "afunc"):
        fn = _plain(getattr(runnable, attr, None))
        if fn is not None:
            found = True
            yield fn
            break
    tools = getattr(runnable, "tools_by_name", None)
    if isinstance(tools, Mapping):
        for tool in tools.values():
            for attr in ("func", "coroutine"):
                fn = _plain(getattr(tool, attr, None))
                if fn is not None:
                    found = True
                    yield fn
    if not found:
        fn = _plain(runnable)
        if fn is not None:
            yield fn


def _plain(obj: Any) -> Callable[..., Any] | None:
    """The Python function behind `obj` (partials, bound methods and wrappers undone)."""
    for _ in range(10):
        if isinstance(obj, functools.partial):
            obj = obj.func if not _is_executor(obj) else next(iter(obj.args[1:]), None)
        elif inspect.ismethod(obj):
            obj = obj.__func__
        elif inspect.isfunction(obj):
            unwrapped = inspect.unwrap(obj)
            return unwrapped if inspect.isfunction(unwrapped) else obj
        else:
            return None
    return None


def _is_executor(partial: functools.partial[Any]) -> bool:
    """LangGraph's `partial(run_in_executor, None, fn)` around a sync node's function."""
    return getattr(partial.func, "__name__", "") == "run_in_executor" and len(partial.args) >= 2


# -- reading a node's functions ---------------------------------------------------------------


class Reader:
    """Reads functions the way a node runs them: what they name, and what that names."""

    def __init__(self, root: Callable[..., Any] | None) -> None:
        module = getattr(root, "__module__", None) or ""
        # The node's own package: its module's siblings are the user's code too.
        self.package = module.rpartition(".")[0] or module
        self.module = module
        self.effects: dict[str, AnyEffect] = {}
        self.clients: list[ClientUse] = []
        self.waits: list[Wait] = []
        self._seen: set[int] = set()

    def ours(self, fn: Any) -> bool:
        module = getattr(fn, "__module__", None) or ""
        return bool(module) and (
            module == self.module or module.startswith(self.package + ".") or module == self.package
        )

    def read(self, fn: Callable[..., Any]) -> None:
        code = getattr(fn, "__code__", None)
        if code is None or id(code) in self._seen or len(self._seen) >= MAX_FUNCTIONS:
            return
        self._seen.add(id(code))
        where = getattr(fn, "__qualname__", getattr(fn, "__name__", "?"))
        scope = _Scope(fn)
        for co in _codes(code):
            self._scan(co, scope, where)
        self._read_source(fn, scope, where)

    def _consider(self, value: Any, named: str, where: str) -> None:
        if isinstance(value, Effect | OutboxEffect):
            self.effects.setdefault(str(value.name), value)
            return
        client = _client_of(value)
        if client is not None:
            self.clients.append(ClientUse(client, where, named))
            return
        fn = _plain(value)
        if fn is not None and self.ours(fn):
            self.read(fn)

    def _scan(self, co: types.CodeType, scope: _Scope, where: str) -> None:
        """The names the bytecode loads (and the attributes read off them), and its imports."""
        current: Any = _MISSING
        named = ""
        for ins in dis.get_instructions(co):
            op = ins.opname
            if op in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF"):
                named = str(ins.argval)
                current = scope.lookup(named, free_only=op != "LOAD_GLOBAL")
                if current is not _MISSING:
                    self._consider(current, named, where)
            elif op in ("LOAD_ATTR", "LOAD_METHOD") and current is not _MISSING:
                named = f"{named}.{ins.argval}"
                current = _attribute(current, str(ins.argval), self)
                if current is not _MISSING:
                    self._consider(current, named, where)
            elif op == "IMPORT_NAME":
                module = str(ins.argval)
                client = _client_module(module)
                if client is not None:
                    self.clients.append(ClientUse(client, where, f"import {module}"))
                current = _MISSING
            else:
                current = _MISSING

    def _read_source(self, fn: Callable[..., Any], scope: _Scope, where: str) -> None:
        """The waits, read from the source: a call's arguments are not in the bytecode's names."""
        tree = _source_tree(fn)
        if tree is None:
            return
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            target = _resolve(node.func, scope)
            if target is _MISSING:
                continue
            if target is keel_approval:
                if not any(k.arg in ("timeout", None) for k in node.keywords):
                    self.waits.append(Wait("approval", where, _constant(node.args)))
            elif target is interrupt:
                self.waits.append(Wait("interrupt", where, None))


class _Scope:
    """A function's names: its closure's cells, then its globals, then the builtins."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.globals: dict[str, Any] = getattr(fn, "__globals__", {})
        code = getattr(fn, "__code__", None)
        cells = getattr(fn, "__closure__", None) or ()
        self.closure: dict[str, Any] = {}
        for name, cell in zip(code.co_freevars if code else (), cells, strict=False):
            try:
                self.closure[name] = cell.cell_contents
            except ValueError:  # an empty cell
                continue

    def lookup(self, name: str, *, free_only: bool = False) -> Any:
        if name in self.closure:
            return self.closure[name]
        if free_only:
            return _MISSING
        if name in self.globals:
            return self.globals[name]
        return getattr(builtins, name, _MISSING)


def _client_module(module: str) -> str | None:
    """The known network client `module` is, or is a submodule of, if any."""
    return next((c for c in CLIENTS if module == c or module.startswith(c + ".")), None)


def _client_of(value: Any) -> str | None:
    """The known network client `value` belongs to (a module, a function or class of one, or
    an object of such a class), if any."""
    if isinstance(value, types.ModuleType):
        module = value.__name__
    elif inspect.isfunction(value) or inspect.isclass(value) or inspect.isbuiltin(value):
        module = getattr(value, "__module__", None) or ""
    else:
        module = type(value).__module__ or ""
    return _client_module(module)


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """A code object and those nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _attribute(value: Any, name: str, reader: Reader) -> Any:
    """`value.name` read without running user code: a module's attribute, a class's or an
    object's class's function (never a property or `__getattr__`)."""
    if isinstance(value, types.ModuleType):
        return getattr(value, name, _MISSING)
    owner = value if inspect.isclass(value) else type(value)
    if not reader.ours(owner) and not inspect.isclass(value):
        # Another library's object: only what it is matters (a client), not its insides.
        return _MISSING
    try:
        found = inspect.getattr_static(owner, name)
    except AttributeError:
        return _MISSING
    if isinstance(found, staticmethod | classmethod):
        found = found.__func__
    return found


def _resolve(expr: ast.expr, scope: _Scope) -> Any:
    """What a call's callee (`name`, `module.name`) names, from the function's scope."""
    if isinstance(expr, ast.Name):
        return scope.lookup(expr.id)
    if isinstance(expr, ast.Attribute):
        base = _resolve(expr.value, scope)
        if isinstance(base, types.ModuleType):
            return getattr(base, expr.attr, _MISSING)
    return _MISSING


def _constant(args: list[ast.expr]) -> str | None:
    first = args[0] if args else None
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


# -- a workflow's registration ----------------------------------------------------------------


def registered_without_version(workflow: Workflow) -> bool:
    """Whether `workflow` was registered without `version=` (the App's default, "1").

    Read from the registration in the factory's module: `@app.workflow("name")` above the
    factory, or `app.workflow("name")(factory)` (a lambda or a function's name). False when it
    cannot be told (a factory registered from another module).
    """
    call = _registration(workflow.factory)
    if call is None:
        return False
    return len(call.args) < 2 and not any(k.arg in ("version", None) for k in call.keywords)


def _registration(factory: Any) -> ast.Call | None:
    """The `….workflow(...)` call that registered `factory`, in its module's source."""
    code = getattr(factory, "__code__", None)
    tree = _module_tree(factory)
    if code is None or tree is None:
        return None
    first, name = code.co_firstlineno, getattr(factory, "__name__", "")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = [node.lineno, *(d.lineno for d in node.decorator_list)]
            if min(lines) == first:
                found = [d for d in node.decorator_list if _is_workflow_call(d)]
                return cast(ast.Call, found[0]) if found else None
        elif isinstance(node, ast.Call) and _is_workflow_call(node.func):
            for arg in node.args:
                if (isinstance(arg, ast.Lambda) and arg.lineno == first) or (
                    isinstance(arg, ast.Name) and arg.id == name
                ):
                    return cast(ast.Call, node.func)
    return None


def _is_workflow_call(node: ast.expr) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "workflow") or (
        isinstance(func, ast.Name) and func.id == "workflow"
    )


# -- sources ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=512)
def _parsed(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _module_tree(fn: Any) -> ast.Module | None:
    """The parsed source of the module that defines `fn`, if readable."""
    try:
        module = inspect.getmodule(fn)
        source = inspect.getsource(module) if module is not None else None
    except (OSError, TypeError):
        return None
    return _parsed(source) if source else None


def _source_tree(fn: Any) -> ast.Module | None:
    """The parsed source of `fn` (with its decorators; a lambda's whole line), if readable."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return None
    source = textwrap.dedent(source)
    tree = _parsed(source)
    if tree is None:
        # A lambda's line may be part of a longer expression: try it as one.
        tree = _parsed("(" + source.strip().rstrip(",") + ")")
    return tree
