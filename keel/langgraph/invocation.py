"""The config a claimed run's graph is invoked with: what the run was submitted with, under
Keel's own keys (which thread and checkpoint it reads, its run id, its job and worker in every
checkpoint's metadata), which the caller's config does not set."""

from __future__ import annotations

from typing import Any

from keel.core.store.base import Row
from keel.core.workflows import Workflow
from keel.langgraph import chunks
from keel.langgraph.graphs import recursion_limit

KEEL_OWNED = frozenset({"thread_id", "checkpoint_id", "checkpoint_ns", "checkpoint_map"})
"""Configurable keys a run's submitted config does not set: which thread and checkpoint it reads
(a fork names its checkpoint at submit, `checkpoint_id=`, read only while it has none of its own;
a config's would send every restart back there)."""


def invocation_config(
    run: Row,
    submitted: dict[str, Any],
    graph: Any,
    workflow: Workflow,
    *,
    run_id: str,
    worker_id: str,
) -> dict[str, Any]:
    """The config for `graph.ainvoke` of `run` (`submitted`: its `threads.run_config`)."""
    return {
        # What the run was submitted with first: Keel's own keys are not the caller's to set.
        "configurable": {
            # As LangGraph's server, for its runs: their context also reads as
            # configurable keys (graphs written against `configurable` see it). Not for
            # Keel's own: configurable's plain values land in every checkpoint's metadata,
            # and a context may hold what must not (a key, a token).
            **(_context_keys(submitted.get("context")) if chunks.KWARGS in submitted else {}),
            "run_id": run_id,
            **{
                key: value
                for key, value in (submitted.get("configurable") or {}).items()
                if key not in KEEL_OWNED  # where a checkpoint is read is Keel's to say
            },
            "thread_id": run.get("thread_id") or run_id,
        },
        "recursion_limit": recursion_limit(submitted, graph, workflow.recursion_limit),
        "tags": list(submitted.get("tags") or []),  # an assistant's, the Agent Server's
        **_run_name(submitted, workflow.name),
        "metadata": {
            **(submitted.get("metadata") or {}),
            "keel_job_id": run["job_id"],
            "keel_worker": worker_id,
            "keel_run_id": run_id,
            # As the Agent Server: each checkpoint and message chunk names its run.
            "run_id": run_id,
        },
    }


def _context_keys(context: Any) -> dict[str, Any]:
    if not isinstance(context, dict):
        return {}
    return {str(k): v for k, v in context.items() if str(k) not in KEEL_OWNED}


def _run_name(submitted: dict[str, Any], graph: str) -> dict[str, Any]:
    """The root of `events` and of a trace: the run's own name, else, for a run of the Agent
    Server protocol, its graph's, as langgraph-api names it (not kept in the run's config, which
    its answers show as the client sent it)."""
    if isinstance(submitted.get("run_name"), str):
        return {"run_name": submitted["run_name"]}
    return {"run_name": graph} if chunks.KWARGS in submitted else {}
