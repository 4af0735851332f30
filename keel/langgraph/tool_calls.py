"""Which tool call of a ToolNode an effect is made in.

LangGraph's ToolNode runs the tool calls of one AI message at once (sync tools on threads, async
ones as tasks), so the order in which they reach an effect changes from one execution to the
next. Keys numbered by that order named another call after a crash or a resume: a call refused
as changed, or, worse, sent again under a number no call had used yet.

A ToolNode's calls come from its input, which LangGraph checkpointed (the model's message in the
state, or a `Send`), so each call's id, name and arguments are the same on every execution.
`install()` wraps the ToolNode method that runs one call so that it names the call in
`keel.core.effects.keys.tool_call` while it runs: the tool's effects are numbered within their
tool call. Tools run any other way (a node that invokes them itself, with ids a model made up
anew on each execution) are not named: their calls keep the task's order, which is theirs.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from keel.core.codec import canonical_json
from keel.core.effects.keys import tool_call
from keel.core.ids import digest

log = logging.getLogger("keel.langgraph.tool_calls")


def scope_of(call: Mapping[str, Any]) -> str:
    """A tool call's name in effect keys: its id, and a digest of its tool and arguments (two
    calls of one message with the same id, or none, are still told apart by what they ask)."""
    asked = digest(str(call.get("name", "")), canonical_json(call.get("args", {})))[:16]
    return f"{call.get('id') or ''}:{asked}"


def _named(call: Mapping[str, Any]) -> str:
    """The scope the call runs in: nested in the one around it (a ToolNode a tool runs)."""
    outer = tool_call.get()
    return scope_of(call) if outer is None else f"{outer}/{scope_of(call)}"


def _sync(run_one: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(run_one)
    def run_one_named(self: Any, call: Any, *args: Any, **kwargs: Any) -> Any:
        # On the pool thread ToolNode gave this call, in a context copied for it alone.
        token = tool_call.set(_named(call))
        try:
            return run_one(self, call, *args, **kwargs)
        finally:
            tool_call.reset(token)

    run_one_named.keel_wrapped = True  # type: ignore[attr-defined]
    return run_one_named


def _async(arun_one: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(arun_one)
    async def arun_one_named(self: Any, call: Any, *args: Any, **kwargs: Any) -> Any:
        # In the task ToolNode's gather made for this call: its context is its own.
        token = tool_call.set(_named(call))
        try:
            return await arun_one(self, call, *args, **kwargs)
        finally:
            tool_call.reset(token)

    arun_one_named.keel_wrapped = True  # type: ignore[attr-defined]
    return arun_one_named


def install() -> None:
    """Wrap ToolNode's `_run_one` and `_arun_one` once (idempotent). A LangGraph without them
    is left as it is, with a warning: its tool calls' effects keep the task's order."""
    try:
        from langgraph.prebuilt.tool_node import ToolNode
    except ImportError:  # langgraph-prebuilt is not installed: no ToolNode to run tools
        return
    for name, wrap in (("_run_one", _sync), ("_arun_one", _async)):
        current = getattr(ToolNode, name, None)
        if current is None:
            log.warning(
                "this LangGraph's ToolNode has no %s: effects of its parallel tool calls are "
                "numbered in the order they run, which a resume may change (docs/effects.md)",
                name,
            )
            continue
        if not getattr(current, "keel_wrapped", False):
            setattr(ToolNode, name, wrap(current))
