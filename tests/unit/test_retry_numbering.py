"""A retry's subgraph invocation numbers, mapped back to its attempt's own for effect keys
(keel.langgraph.retries.renumbered): only what the execution recorded moves."""

from __future__ import annotations

from keel.langgraph.retries import renumbered


def test_a_recorded_number_becomes_the_attempts_own_and_nothing_else_moves() -> None:
    # The task under "a:t" was retried: LangGraph's 2 and 3 were that attempt's 0 and 1.
    ordinals = {"a:t|2": 0, "a:t|3": 1}
    assert renumbered("a:t|2|pay:x", ordinals) == "a:t|pay:x"
    assert renumbered("a:t|3|pay:x", ordinals) == "a:t|1|pay:x"
    assert renumbered("a:t|1|pay:x", ordinals) == "a:t|1|pay:x"  # the first attempt's own
    assert renumbered("b:u|2|pay:x", ordinals) == "b:u|2|pay:x"  # another task's
    assert renumbered("a:t|2|pay:x", {}) == "a:t|2|pay:x"  # another execution's: nothing
    # A retried subgraph's own retried task, one level down.
    nested = {"a:t|2|b:v|4": 1}
    assert renumbered("a:t|2|b:v|4|c:w", {**ordinals, **nested}) == "a:t|b:v|1|c:w"
