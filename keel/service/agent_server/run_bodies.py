"""What a run request of the Agent Server carries (`RunIn`, as langgraph-sdk sends it), and the
small helpers runs.py shares about it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, Literal

import anyio.to_thread
from pydantic import AfterValidator, BaseModel, Field, field_validator

from keel.core.store.base import Row
from keel.core.threads import check_config
from keel.langgraph.static_interrupts import KWARGS, STATIC_WAITS
from keel.runtime.app import App
from keel.service.errors import Refused

__all__ = ["KWARGS", "RunIn", "in_thread", "names", "paused_statically", "unsupported"]


RunConfig = Annotated[dict[str, Any], AfterValidator(check_config)]
"""LangGraph's config of a run or an assistant: its `configurable` and `metadata` objects, its
`tags` strings (422 otherwise, before anything is admitted or stored)."""


def names(given: str | list[str] | None) -> list[str] | str | None:
    """`interrupt_before`/`interrupt_after` as LangGraph takes them: `"*"` (every node), a list
    of node names, or None."""
    if given is None or given == "*":
        return given
    return [given] if isinstance(given, str) else list(given)


class RunIn(BaseModel):
    """A run as langgraph-sdk sends it (`RunCreate`); fields newer SDKs add are ignored."""

    model_config = {"extra": "ignore"}

    assistant_id: str = Field(min_length=1, max_length=200)
    input: Any = None
    command: dict[str, Any] | None = None
    stream_mode: str | list[str] | None = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None
    metadata: dict[str, Any] | None = None
    config: RunConfig | None = None
    context: Any = None
    checkpoint: dict[str, Any] | None = None
    checkpoint_id: str | None = Field(None, max_length=200)
    checkpoint_during: bool | None = None
    interrupt_before: str | list[str] | None = None
    interrupt_after: str | list[str] | None = None
    feedback_keys: list[str] | None = None
    on_disconnect: Literal["cancel", "continue"] | None = None
    on_completion: Literal["delete", "keep"] | None = None
    webhook: str | None = None
    multitask_strategy: Literal["reject", "enqueue", "interrupt", "rollback"] | None = None
    if_not_exists: Literal["create", "reject"] | None = None
    after_seconds: float | None = None
    durability: Literal["sync", "async", "exit"] | None = None

    @field_validator("command")
    @classmethod
    def _no_empty_command(cls, command: dict[str, Any] | None) -> dict[str, Any] | None:
        # langgraph-sdk drops a Command's None fields: `Command(resume=None)` arrives as `{}`,
        # which langgraph-api takes as no command (the paused node runs again).
        return command or None


def unsupported(message: str) -> Refused:
    return Refused(422, "unsupported", message)


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a worker thread from which the auth handlers can be awaited."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args))


def paused_statically(keel_app: App, thread: Row) -> bool:
    """Whether the thread's active run waits on a static pause (`interrupt_before`/`_after`):
    a run without input or command then goes on from it, as in LangGraph."""
    if thread.get("status") != "interrupted":
        return False
    active = keel_app.active_run(str(thread["thread_id"]))
    if active is None:
        return False
    return any(
        w["status"] == "pending" and w["name"] in STATIC_WAITS
        for w in keel_app.get_run(str(active["run_id"])).waits
    )
