"""What the Agent Server's thread requests carry, as langgraph-sdk sends them (threads.py).

Unknown keys are ignored, as langgraph-api ignores them. (No `from __future__ import
annotations`: FastAPI reads these models' annotations as in threads.py.)
"""

from typing import Any, Literal

from pydantic import BaseModel, Field

MAX_PAGE = 1000
"""The most threads or checkpoints one page holds."""

ThreadStatus = Literal["idle", "busy", "interrupted", "error"]


class Body(BaseModel):
    model_config = {"extra": "ignore"}


class ThreadCreate(Body):
    thread_id: str | None = None
    metadata: dict[str, Any] | None = None
    if_exists: Literal["raise", "do_nothing"] | None = None
    graph_id: str | None = None
    supersteps: list[Any] | None = None
    ttl: Any = None


class ThreadPatch(Body):
    metadata: dict[str, Any] = Field(default_factory=dict)
    ttl: Any = None


class ThreadCount(Body):
    metadata: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    status: ThreadStatus | None = None


class ThreadSearch(ThreadCount):
    ids: list[str] | None = None
    limit: int = Field(10, ge=1, le=MAX_PAGE)
    offset: int = Field(0, ge=0)
    sort_by: (
        Literal["thread_id", "status", "created_at", "updated_at", "state_updated_at"] | None
    ) = None
    sort_order: Literal["asc", "desc"] | None = None
    select: list[str] | None = None
    extract: dict[str, Any] | None = None


class StateUpdate(Body):
    values: Any = None
    as_node: str | None = Field(None, min_length=1, max_length=200)
    checkpoint: dict[str, Any] | None = None
    checkpoint_id: str | None = None


class StateAt(Body):
    checkpoint: dict[str, Any]
    subgraphs: bool = False
    select: list[str] | None = None


class HistoryIn(Body):
    limit: int = Field(10, ge=1, le=MAX_PAGE)
    before: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    select: list[str] | None = None
