"""A workflow's graph: where a node runs in its run (`locate`), building and compiling it
(`compile_graph`), whether its START step runs any of the user's code (`plain_start`), and
whether a run's checkpoint can go on in it (`checkpoint_misfits`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.constants import START
from langgraph.pregel import Pregel

from keel.core.context import _current as _running
from keel.core.errors import InvalidWorkflow, NotInRun
from keel.core.ids import StepRef, namespace_without_task_ids
from keel.core.workflows import Workflow
from keel.langgraph.retries import SCRATCHPAD, renumbered
from keel.langgraph.savers import FencedSaver

# LangGraph's CONFIG_KEY_TASK_ID (private since 1.0): the id its saver writes the task's
# writes under, which the outbox's staged intents commit with.
CONFIG_KEY_TASK_ID = "__pregel_task_id"


def locate() -> StepRef:
    """The calling node's place in its run, from LangGraph's runnable config."""
    try:
        config = get_config()
    except RuntimeError:
        raise NotInRun("this must be called inside a LangGraph node") from None
    meta = config.get("metadata", {})
    path = meta.get("langgraph_path", ())
    ctx = _running.get()
    return StepRef(
        # A run on a thread of many runs names itself (config metadata); else the thread is it.
        run_id=str(meta.get("keel_run_id") or config["configurable"]["thread_id"]),
        node=str(meta.get("langgraph_node", "")),
        step=int(meta.get("langgraph_step", -1)),
        path="/".join(str(p) for p in path),
        # A retry's subgraph invocations numbered as its first attempt's (keel.langgraph.retries).
        namespace=namespace_without_task_ids(
            renumbered(
                str(meta.get("langgraph_checkpoint_ns", "")),
                ctx.subgraph_ordinals if ctx is not None else {},
            )
        ),
        # LangGraph makes a scratchpad per attempt of a task and shares it with the runnables
        # the node invokes (tools, chains): what numbers the task's effect calls. Without one
        # (another LangGraph), the config, which is per attempt too but not shared with them.
        scope=config.get("configurable", {}).get(SCRATCHPAD) or config,
        task_id=str(config.get("configurable", {}).get(CONFIG_KEY_TASK_ID, "")),
    )


def compile_graph(workflow: Workflow, checkpointer: Any = None, store: Any = None) -> Any:
    """Build and compile the workflow's graph; InvalidWorkflow, naming it, if that fails.
    `store`: the LangGraph store its nodes get (keel.langgraph.stores); None keeps a compiled
    graph's own."""
    try:
        builder = workflow.factory()
    except Exception as exc:
        raise InvalidWorkflow(
            f"workflow {workflow.key}: its factory raised {type(exc).__name__}: {exc}"
        ) from exc
    if isinstance(builder, Pregel):
        # A compiled graph (what a langgraph.json project exports): Keel's saver (and store)
        # in place of whatever it was compiled with, everything else as compiled.
        update: dict[str, Any] = {"checkpointer": checkpointer}
        if store is not None:
            update["store"] = store
        return _runnable(workflow, builder.copy(update=update))
    if not callable(getattr(builder, "compile", None)):
        raise InvalidWorkflow(
            f"workflow {workflow.key}: the factory must return a LangGraph builder (a "
            f"StateGraph) or a compiled graph, not {type(builder).__name__}"
        )
    try:
        graph = builder.compile(checkpointer=checkpointer, store=store)
    except Exception as exc:
        raise InvalidWorkflow(
            f"workflow {workflow.key}: its graph does not compile: {type(exc).__name__}: {exc}"
        ) from exc
    return _runnable(workflow, graph)


def _runnable(workflow: Workflow, graph: Pregel) -> Pregel:
    """The graph, unless LangGraph is known to fail every run of it under the workflow's
    durability: a subgraph node compiled with `checkpointer=False` under "sync" raises
    AttributeError ('_put_checkpoint_fut') in LangGraph itself, with or without Keel."""
    if workflow.durability != "sync":
        return graph
    for name in _checkpointless_subgraphs(graph):
        raise InvalidWorkflow(
            f"workflow {workflow.key}: subgraph {name!r} is compiled with checkpointer=False, "
            "which LangGraph cannot run under durability='sync' (every run fails with "
            "AttributeError). Compile it without a checkpointer argument (it then uses the "
            "run's), or register the workflow with durability='async'"
        )
    return graph


def _checkpointless_subgraphs(graph: Pregel, prefix: str = "") -> Iterator[str]:
    """The namespaces of subgraph nodes compiled with `checkpointer=False`, however deep
    (LangGraph's own `get_subgraphs` leaves them out)."""
    for name, node in graph.nodes.items():
        parts: list[Any] = [node.bound]
        for part in parts:
            parts.extend(getattr(part, "steps", None) or ())  # a node that is a sequence
            if not isinstance(part, Pregel):
                continue
            if part.checkpointer is False:
                yield f"{prefix}{name}"
            else:
                yield from _checkpointless_subgraphs(part, f"{prefix}{name}|")


def plain_start(graph: Any) -> bool:
    """Whether the graph's START step only writes the input onto its channels and goes on along
    plain edges: a StateGraph with no conditional edge out of START (a router there is the
    user's code, and may choose otherwise when run again). Anything else (the functional API,
    a Pregel built by hand): False."""
    builder = getattr(graph, "builder", None)
    branches = getattr(builder, "branches", None)
    if builder is None or branches is None or not hasattr(builder, "edges"):
        return False
    return START not in branches


async def checkpoint_misfits(graph: Any, saver: FencedSaver, run_id: str) -> list[str]:
    """Why the run's latest checkpoint cannot go on in `graph` (another version of its
    workflow, compiled with `saver`); empty when it fits, and for a run never checkpointed (it
    starts from its admitted input).

    The nodes the run would execute next (the one it is interrupted in among them), and the
    nodes a waiting edge has begun to gather for, are read from the checkpoint itself, by name,
    not through `graph`: a graph without such a node just computes no task for it, and the run
    would end there as if finished. A subgraph the run is paused in is read the same way, at its
    own checkpoint, against that version's subgraph of the same node.
    """
    config = cast(RunnableConfig, {"configurable": {"thread_id": run_id}})
    state = await graph.aget_state(config, subgraphs=True)  # empty when never checkpointed
    return await _misfits(graph, saver, run_id, "", state, "")


async def _misfits(
    graph: Any, saver: FencedSaver, run_id: str, namespace: str, state: Any, where: str
) -> list[str]:
    """The misfits of the checkpoint at `namespace` in `graph`, whose state as `graph` reads it
    is `state`; `where` names the subgraph ("node|") in what is said."""
    config = cast(
        RunnableConfig, {"configurable": {"thread_id": run_id, "checkpoint_ns": namespace}}
    )
    saved = await saver.aget_tuple(config)
    if saved is None:
        return []
    values = saved.checkpoint.get("channel_values", {})
    pending = {channel.rsplit(":", 1)[-1] for channel in values if channel.startswith("branch:to:")}
    pending |= {str(send.node) for send in values.get("__pregel_tasks", []) or []}
    gathering = {channel.rsplit(":", 1)[-1] for channel in values if channel.startswith("join:")}
    nodes = set(graph.nodes)
    missing = sorted((pending | gathering) - nodes)
    problems = [f"node {where + name!r} is not in that version" for name in missing]
    if problems:
        return problems
    if pending - set(state.next):
        return [
            f"that version would run {sorted(f'{where}{n}' for n in state.next) or 'nothing'} "
            f"next, not the {sorted(f'{where}{n}' for n in pending)} the run stopped before"
        ]
    subgraphs = dict(graph.get_subgraphs())
    for task in state.tasks:
        inner = getattr(task.state, "config", None)
        if inner is None or task.name not in subgraphs:
            continue
        inner_ns = (inner.get("configurable") or {}).get("checkpoint_ns", "")
        problems += await _misfits(
            subgraphs[task.name], saver, run_id, inner_ns, task.state, f"{where}{task.name}|"
        )
    return problems


def recursion_limit(submitted: dict[str, Any], graph: Any, registered: int) -> int:
    """As LangGraph: the run's own `recursion_limit`, else the one the compiled graph was bound
    with (`.with_config(recursion_limit=...)`, as deep agents set 1000), else the workflow's."""
    for config in (submitted, getattr(graph, "config", None) or {}):
        limit = config.get("recursion_limit")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1:
            return limit
    return registered
