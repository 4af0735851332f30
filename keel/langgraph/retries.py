"""A task retried by LangGraph's `RetryPolicy`, inside a Keel execution, invokes its subgraphs
under the namespaces its first attempt used.

LangGraph numbers the subgraph invocations of a task (`PregelScratchpad.subgraph_counter`): the
first goes under the task's namespace, the n-th under `<namespace>|n`. A retry gets a fresh
scratchpad, but the same counter, so the retry's first invocation runs under `|1`, as a second
invocation would. An effect's key names the namespace it is called in (`keel.core.ids`), so the
retry's effects got new keys and were performed again: the one exception to "a retried node
finds its first attempt's effects". Counting each attempt's invocations from the first again
gives the retry the first attempt's namespaces, hence its keys; and its subgraphs resume from
the checkpoints the first attempt committed there, which is what LangGraph's retry asks of them
(it sets `CONFIG_KEY_RESUMING`).

LangGraph offers no hook for this: the helper its retry loops call to start each attempt
(`_reset_interrupt_counter`, which already counts the attempt's `interrupt()` calls from the
first again) is wrapped, and it changes nothing outside a Keel execution.
`tests/store/test_effects.py` fails if LangGraph stops calling it, or counts otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from langgraph.pregel import _algo, _retry

from keel.core.context import _current as _running

SCRATCHPAD = "__pregel_scratchpad"  # LangGraph's CONFIG_KEY_SCRATCHPAD


def _counting_from_the_first(reset: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def attempt_config(config: Any) -> Any:
        config = reset(config)
        scratchpad = config.get("configurable", {}).get(SCRATCHPAD)
        if _running.get() is None or scratchpad is None:
            return config
        fresh = dataclasses.replace(scratchpad, subgraph_counter=_algo.LazyAtomicCounter())
        return {**config, "configurable": {**config["configurable"], SCRATCHPAD: fresh}}

    attempt_config.keel_wrapped = True  # type: ignore[attr-defined]
    return attempt_config


def install() -> None:
    """Wrap LangGraph's per-attempt reset once (idempotent)."""
    current = _retry._reset_interrupt_counter
    if not getattr(current, "keel_wrapped", False):
        _retry._reset_interrupt_counter = _counting_from_the_first(current)  # type: ignore[assignment]
