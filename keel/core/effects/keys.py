"""What names an effect call, and what tells a replay's call from the recorded one.

An effect's key is its place in the run: the node's StepRef and its call order among that
task's calls of the same effect. The arguments are not part of it; they are hashed beside it,
one hash per argument name, so a replay that calls the same place with other arguments is
recognized as non-determinism (and told which arguments changed) instead of being performed
as a new effect. `key=` narrows what is compared to the arguments that identify the effect; on
a thread of many runs it also makes them the key (`business_key`): the effect happens once per
thread for those values, whichever run calls it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any

from keel.core.codec import canonical_json
from keel.core.errors import NondeterminismError, UsageError
from keel.core.ids import CallOrder, Identity, StepRef, args_hash, digest

KeySpec = str | tuple[str, ...] | Callable[[dict[str, Any]], Any] | None
"""`@keel.effect(key=...)`: argument name(s), a function of the bound arguments (by name,
defaults applied) returning JSON, or None (all arguments)."""

SUPPLIED = frozenset({"idempotency_key", "fencing_token", "lease_token"})
"""Keywords Keel passes to an effect's function itself; a caller never passes them."""


TOOL_KEYS = 2
"""`keel_runs.effect_keys` of runs whose calls inside a ToolNode's tool call are numbered per
tool call: runs first claimed since migration 0032. Runs first executed before it number them
per task (1), as their recorded rows are."""

tool_call: ContextVar[str | None] = ContextVar("keel_tool_call", default=None)
"""The ToolNode tool call running here (its id and what it asks), set by
keel.langgraph.tool_calls. A ToolNode runs an AI message's tool calls at once, so the order in
which they call an effect is not the same on every execution; the calls, read from the
checkpointed message, are."""


def call_counter(name: str, effect_keys: int) -> tuple[str, str | None]:
    """What numbers a call of effect `name` (the counter's name) and the tool call it is made
    in, if the run's keys name it: calls inside a tool call are numbered within that call."""
    scope = tool_call.get() if effect_keys >= TOOL_KEYS else None
    return (name if scope is None else f"{name}\0tool:{scope}"), scope


def refuse_if_diverged(calls: CallOrder, where: StepRef, tool: str | None) -> None:
    """Raise when the task at `where` (its tool call `tool`, if it is in one) diverged from its
    recorded run and is failing: a call made there meanwhile, another coroutine's too, is
    neither performed nor staged."""
    refused = calls.refusal(where, tool)
    if isinstance(refused, NondeterminismError):
        raise NondeterminismError(
            node=refused.node, effect=refused.effect, key=refused.key, changed=refused.changed
        )


def effect_key(where: StepRef, name: str, call: int, tool: str | None = None) -> str:
    """The key of the `call`-th call (from 0) of effect `name` by the task at `where` (within
    tool call `tool`, when it is made in one and the run's keys say so)."""
    return where.key("effect", name, f"call:{call}" if tool is None else f"tool:{tool}:call:{call}")


def business_key(thread_id: str, name: str, identity: Identity) -> str:
    """The key of effect `name` on a thread of many runs when `key=` says which arguments
    identify it: the thread and those arguments, not the call's place. A fork, a retried turn
    or a later turn of the thread that calls it with the same values is the same effect (its
    recorded result returned), never a second call. One run of a thread is active at a time,
    so the key still has one owner at a time."""
    return f"effect:{name}:" + digest("thread", thread_id, name, identity.digest)[:32]


def legacy_key(where: StepRef, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The key Keel gave the same call before version 0006 (arguments hashed into it)."""
    return where.key("effect", name, args_hash(args, kwargs))


class Arguments:
    """Binds an effect's call arguments to its parameter names and picks those `key=` names."""

    def __init__(self, fn: Callable[..., Any], name: str, key: KeySpec) -> None:
        self.signature = inspect.signature(fn)
        self.name = name
        params = self.signature.parameters
        if isinstance(key, str):
            key = (key,)
        if isinstance(key, tuple | list):
            unknown = [k for k in key if k not in params or k in SUPPLIED]
            if unknown or not key:
                raise UsageError(
                    f"effect {name!r}: key= names {unknown or '(nothing)'}, which are not "
                    f"arguments of the function (its arguments: "
                    f"{', '.join(p for p in params if p not in SUPPLIED)})"
                )
            self.key: tuple[str, ...] | Callable[[dict[str, Any]], Any] | None = tuple(key)
        elif key is None or callable(key):
            self.key = key
        else:
            raise UsageError(
                f"effect {name!r}: key= takes argument names or a function of the bound "
                f"arguments, not {type(key).__name__}"
            )

    def identity(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Identity:
        """Hash what identifies this call; a call the function could not take raises TypeError
        here, before anything is reserved or performed."""
        supplied = SUPPLIED & kwargs.keys()
        if supplied:
            raise UsageError(
                f"effect {self.name!r}: Keel supplies "
                f"{', '.join(f'`{p}`' for p in sorted(supplied))}; do not pass it"
            )
        placeholders = {p: None for p in SUPPLIED if p in self.signature.parameters}
        try:
            bound = self.signature.bind(*args, **kwargs, **placeholders)
        except TypeError as exc:
            raise TypeError(f"effect {self.name!r}: {exc}") from None
        values = self._named(bound)
        if self.key is None:
            chosen: dict[str, Any] = values
        elif isinstance(self.key, tuple):
            bound.apply_defaults()
            with_defaults = self._named(bound)
            chosen = {k: with_defaults.get(k) for k in self.key}
        else:
            bound.apply_defaults()
            chosen = {"key=": self.key(self._named(bound))}
        return Identity({n: digest(canonical_json(v))[:16] for n, v in chosen.items()})

    def _named(self, bound: inspect.BoundArguments) -> dict[str, Any]:
        """Bound arguments by name, `**kwargs` spread out, Keel's own keywords left out."""
        named: dict[str, Any] = {}
        for pname, value in bound.arguments.items():
            kind = self.signature.parameters[pname].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value)
            elif pname not in SUPPLIED:
                named[pname] = list(value) if kind is inspect.Parameter.VAR_POSITIONAL else value
        return named
