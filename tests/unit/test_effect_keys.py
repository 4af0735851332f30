"""An effect call's key is its place in the run and its call order, never its arguments; the
arguments are hashed beside it, by name, and `key=` picks the ones that identify the effect."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from keel.core.effects.keys import Arguments, effect_key, legacy_key
from keel.core.errors import UsageError
from keel.core.ids import CallOrder, StepRef


def send(to: str, body: str, *, idempotency_key: str) -> None: ...


def place(step: int = 3, path: str = "__pregel_pull/send", scope: object = None) -> StepRef:
    return StepRef("r-1", "send", step, path, scope=scope)


def keys(order: CallOrder, where: StepRef, *names: str) -> list[str]:
    return [effect_key(where, n, order.next(where, n)) for n in names]


# -- call order --------------------------------------------------------------------------------


def test_calls_of_one_effect_in_one_task_are_numbered_in_order_and_others_counted_apart() -> None:
    order, task = CallOrder(), object()
    where = place(scope=task)
    assert [order.next(where, n) for n in ("email", "email", "sms", "email", "sms")] == [
        0,
        1,
        0,
        2,
        1,
    ]


def test_the_same_call_twice_in_one_task_is_two_keys_the_same_on_every_replay() -> None:
    first = keys(CallOrder(), place(scope=object()), "email", "email")
    replay = keys(CallOrder(), place(scope=object()), "email", "email")  # another process
    assert first[0] != first[1]
    assert first == replay


def test_a_retried_task_counts_from_its_first_call_again() -> None:
    order = CallOrder()
    attempt_1 = keys(order, place(scope=object()), "email", "email")
    attempt_2 = keys(order, place(scope=object()), "email", "email")  # LangGraph retried it
    assert attempt_1 == attempt_2


def test_without_a_scope_the_place_itself_names_the_task() -> None:
    order = CallOrder()
    assert keys(order, place(), "email") != keys(order, place(), "email")


def test_loop_iterations_are_later_steps_with_their_own_keys() -> None:
    order = CallOrder()
    iterations = [keys(order, place(step=s, scope=object()), "email")[0] for s in (1, 3, 5)]
    assert len(set(iterations)) == 3
    again = CallOrder()
    assert iterations == [keys(again, place(step=s, scope=object()), "email")[0] for s in (1, 3, 5)]


def test_parallel_sends_have_their_own_paths_and_keys_whatever_order_they_run_in() -> None:
    paths = [f"__pregel_push/{i}" for i in range(4)]
    order = CallOrder()
    forward = {p: keys(order, place(path=p, scope=object()), "email")[0] for p in paths}
    order = CallOrder()
    backward = {p: keys(order, place(path=p, scope=object()), "email")[0] for p in reversed(paths)}
    assert forward == backward
    assert len(set(forward.values())) == 4


def test_finished_steps_are_forgotten_but_a_subgraphs_steps_do_not_reset_its_parent() -> None:
    order, parent = CallOrder(), object()
    outer = StepRef("r-1", "call_sub", 5, "__pregel_pull/call_sub", scope=parent)
    assert order.next(outer, "email") == 0
    for step in range(1, 9):  # the subgraph runs its own steps inside the parent's node
        order.next(StepRef("r-1", "inner", step, "p", "call_sub:t1|inner", scope=object()), "x")
    assert order.next(outer, "email") == 1
    order.next(place(step=6, scope=object()), "email")
    assert len(order._tasks) <= 3  # the subgraph's finished steps are gone


def test_the_key_depends_on_the_place_and_the_call_order_and_differs_from_the_old_key() -> None:
    where = place()
    key = effect_key(where, "email", 0)
    assert key.startswith("effect:email:")
    assert key == effect_key(StepRef("r-1", "send", 3, "__pregel_pull/send"), "email", 0)
    assert key != effect_key(where, "email", 1)
    assert key != effect_key(where, "sms", 0)
    assert key != legacy_key(where, "email", (), {})


# -- which arguments identify a call -----------------------------------------------------------


def test_positional_and_keyword_spellings_of_a_call_are_one_identity() -> None:
    args = Arguments(send, "send", None)
    a = args.identity(("a@x", "hi"), {})
    b = args.identity((), {"body": "hi", "to": "a@x"})
    assert a == b and a.digest == b.digest
    assert set(a.hashes) == {"to", "body"}  # Keel's own keywords are never compared


def test_changed_names_the_arguments_that_differ() -> None:
    args = Arguments(send, "send", None)
    recorded = args.identity(("a@x", "sent at 10:00"), {}).hashes
    replay = args.identity(("a@x", "sent at 10:05"), {})
    assert replay.digest != args.identity(("a@x", "sent at 10:00"), {}).digest
    assert replay.changed(recorded) == ["body"]
    assert replay.changed(None) == []  # a row from before per-argument hashes: nothing to say


def test_key_names_compare_only_those_arguments() -> None:
    args = Arguments(send, "send", ("to",))
    at_ten = args.identity(("a@x", f"sent at {dt.time(10)}"), {})
    assert at_ten == args.identity(("a@x", f"sent at {dt.time(10, 5)}"), {})
    assert at_ten != args.identity(("b@x", f"sent at {dt.time(10)}"), {})
    assert at_ten.changed(args.identity(("b@x", "x"), {}).hashes) == ["to"]


def test_key_as_a_function_sees_the_bound_arguments_with_defaults() -> None:
    seen: list[dict[str, Any]] = []

    def ticket(bound: dict[str, Any]) -> Any:
        seen.append(bound)
        return bound["to"].lower()

    def reply(to: str, body: str, cc: str = "", *, idempotency_key: str) -> None: ...

    args = Arguments(reply, "reply", ticket)
    assert args.identity(("A@x", "one"), {}) == args.identity(("a@x",), {"body": "two"})
    assert seen[0] == {"to": "A@x", "body": "one", "cc": ""}


def test_var_keyword_arguments_are_compared_by_their_own_names() -> None:
    def post_effect(channel: str, *, idempotency_key: str, **fields: Any) -> None: ...

    args = Arguments(post_effect, "post", None)
    one = args.identity(("c",), {"text": "hi", "ts": 1})
    assert one.changed(args.identity(("c",), {"text": "hi", "ts": 2}).hashes) == ["ts"]


def test_a_key_naming_something_the_function_does_not_take_is_refused_at_decoration() -> None:
    with pytest.raises(UsageError, match=r"key= names \['ticket'\].*its arguments: to, body"):
        Arguments(send, "send", ("to", "ticket"))
    with pytest.raises(UsageError, match="key= names"):
        Arguments(send, "send", ("idempotency_key",))
    with pytest.raises(UsageError, match="not int"):
        Arguments(send, "send", 3)  # type: ignore[arg-type]


def test_a_call_the_function_cannot_take_is_a_type_error_naming_the_effect() -> None:
    args = Arguments(send, "send", None)
    with pytest.raises(TypeError, match="effect 'send': missing a required argument: 'body'"):
        args.identity(("a@x",), {})
    with pytest.raises(TypeError, match="effect 'send'"):
        args.identity(("a@x", "b", "c"), {})
