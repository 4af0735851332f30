"""The Python API is one product: the sync App and `app.aio` offer the same operations with
the same return types, and the papercuts a new user meets in the first hour stay fixed."""

from __future__ import annotations

import inspect
import typing

import pytest

import keel
from keel.core.errors import UsageError
from tests.support.by_hand import WORKFLOW, memory_app, on_loop, one_node

# Sync-only by nature: registration and lifetime, not operations on runs.
SYNC_ONLY = {"workflow", "webhook", "add_notifier", "close"}


def operations(cls: type) -> dict[str, typing.Callable[..., typing.Any]]:
    return {
        name: fn
        for name, fn in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") and name not in SYNC_ONLY
    }


def test_every_app_operation_is_on_aio_with_the_same_return_type() -> None:
    sync_ops = operations(keel.App)
    assert {"submit", "approve", "reject", "resolve_effect", "run_worker"} <= set(sync_ops)
    for name, fn in sync_ops.items():
        twin = getattr(keel.AsyncApp, name, None)
        assert twin is not None, f"app.aio has no {name}()"
        assert inspect.iscoroutinefunction(twin), f"app.aio.{name} is not a coroutine function"
        want = typing.get_type_hints(fn)["return"]
        got = typing.get_type_hints(twin)["return"]
        assert got == want, f"app.{name} returns {want}, app.aio.{name} returns {got}"
        # The same parameters, in the same order and kinds; the async core may take more, only
        # as keyword-only ones after them (what the App fills in itself).
        sync_params = list(inspect.signature(fn).parameters.values())
        async_params = list(inspect.signature(twin).parameters.values())
        same = [(p.name, p.kind) for p in async_params[: len(sync_params)]]
        assert same == [(p.name, p.kind) for p in sync_params], f"{name}: {same}"
        extra = async_params[len(sync_params) :]
        assert all(p.kind is p.KEYWORD_ONLY for p in extra), f"{name}: {extra}"


def test_aio_submit_returns_what_submit_returns(clock: keel.ManualClock) -> None:
    with memory_app(clock) as app:
        sync = app.submit(WORKFLOW, job_id="j-1", input={})
        again = on_loop(app, app.aio.submit(WORKFLOW, job_id="j-1", input={}))
        assert isinstance(sync, keel.Submission) and isinstance(again, keel.Submission)
        assert (sync.created, again.created) == (True, False)
        assert again.run_id == sync.run_id == app.get_run(sync.run_id).run_id


def test_registering_the_same_workflow_version_twice_is_refused(
    clock: keel.ManualClock,
) -> None:
    with memory_app(clock) as app:
        app.workflow(WORKFLOW)(one_node)  # the same factory again: harmless

        def other() -> typing.Any:
            return one_node()

        with pytest.raises(UsageError, match="already registered"):
            app.workflow(WORKFLOW)(other)
        app.workflow(WORKFLOW, version="2")(other)  # a new version is the way
