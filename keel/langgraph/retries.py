"""A task retried by LangGraph's `RetryPolicy`, inside a Keel execution: the effects of the
subgraphs it invokes keep the keys of its first attempt's.

LangGraph numbers the subgraph invocations of a task (`PregelScratchpad.subgraph_counter`): the
first runs under the task's namespace, the n-th under `<namespace>|n`. A retry gets a fresh
scratchpad but the same counter, so the retry's first invocation runs under `|1`, as a second
invocation would. An effect's key names the namespace it is called in (`keel.core.ids`), so the
retry's effects got new keys and were performed again: the one exception to "a retried node
finds its first attempt's effects".

LangGraph's namespaces stay as they are (the retry's subgraphs run afresh, with the input the
retry gives them). Each retry's invocations are counted from the first as well, and
`renumbered` maps a namespace's `|n` back to that count for the keys alone: the retry's first
invocation keys its effects as the first attempt's first did. An effect called again with
other arguments is refused as any changed replay is (NondeterminismError).

Left as it was: a subgraph nested inside the retried one runs under its parent's new task id
(a fresh run checkpoints anew), so its effects still get new keys (docs/effects.md).

LangGraph offers no hook for this: the helper its retry loops call to start each attempt
(`_reset_interrupt_counter`, which already counts the attempt's `interrupt()` calls from the
first again) is wrapped when LangGraph has it, and changes nothing outside a Keel execution.
`tests/store/test_effects.py` fails if LangGraph stops calling it, or counts otherwise.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from keel.core.context import RunContext
from keel.core.context import _current as _running

log = logging.getLogger("keel.langgraph")

SCRATCHPAD = "__pregel_scratchpad"
"""LangGraph's CONFIG_KEY_SCRATCHPAD (a private module), one per task attempt, shared with the
runnables the node invokes: tests/store/test_effects.py fails if LangGraph stops doing so."""
NAMESPACE = "checkpoint_ns"  # LangGraph's CONFIG_KEY_CHECKPOINT_NS
SEPARATOR = "|"


class AttemptCounter:
    """A retry's subgraph counter: LangGraph's numbers, each kept with the attempt's own in the
    execution's `RunContext.subgraph_ordinals` (another execution, a replay among them, keeps
    its own: a task id LangGraph gives again is never read with this one's numbers)."""

    def __init__(self, numbers: Callable[[], int], namespace: str, ctx: RunContext) -> None:
        self.numbers = numbers
        self.namespace = namespace
        self.ctx = ctx
        self._ordinal = itertools.count(0).__next__
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:  # the pair taken together: a node may invoke subgraphs from threads
            number, ordinal = self.numbers(), self._ordinal()
            self.ctx.subgraph_ordinals[f"{self.namespace}{SEPARATOR}{number}"] = ordinal
        return number


def renumbered(namespace: str, ordinals: Mapping[str, int]) -> str:
    """`namespace` with each retry's invocation numbers as its first attempt's would be."""
    if not ordinals or SEPARATOR not in namespace:
        return namespace
    parts = namespace.split(SEPARATOR)
    kept: list[str] = []
    for index, part in enumerate(parts):
        if part.isdigit() and index > 0:
            ordinal = ordinals.get(SEPARATOR.join(parts[: index + 1]))
            if ordinal is not None:
                if ordinal:
                    kept.append(str(ordinal))
                continue
        kept.append(part)
    return SEPARATOR.join(kept)


def _counting_each_attempt(reset: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def attempt_config(config: Any) -> Any:
        config = reset(config)
        configurable = config.get("configurable", {})
        scratchpad = configurable.get(SCRATCHPAD)
        ctx = _running.get()
        if ctx is None or scratchpad is None:
            return config
        numbers = scratchpad.subgraph_counter
        numbers = getattr(numbers, "numbers", numbers)  # an earlier retry's: LangGraph's own
        counter = AttemptCounter(numbers, str(configurable.get(NAMESPACE, "")), ctx)
        fresh = dataclasses.replace(scratchpad, subgraph_counter=counter)
        return {**config, "configurable": {**configurable, SCRATCHPAD: fresh}}

    attempt_config.keel_wrapped = True  # type: ignore[attr-defined]
    return attempt_config


def install() -> None:
    """Wrap LangGraph's per-attempt reset once (idempotent); a LangGraph without it is left as
    it is, with a warning."""
    from langgraph.pregel import _retry

    current = getattr(_retry, "_reset_interrupt_counter", None)
    if current is None:
        log.warning(
            "this LangGraph has no _reset_interrupt_counter: a subgraph retried by a "
            "RetryPolicy may perform its effects again (docs/effects.md)"
        )
        return
    if not getattr(current, "keel_wrapped", False):
        _retry._reset_interrupt_counter = _counting_each_attempt(current)  # type: ignore[assignment]
