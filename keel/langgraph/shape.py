"""A graph's structure, as a digest a version can be held to.

A run resumes on the graph of the version it started on (keel.core.versions). Editing that
graph's structure without a new version (a node renamed, an edge added, a state key removed)
would let a worker continue a run with a graph it was not built for: LangGraph would find no
task for the checkpoint's next nodes and end the run as completed, or run nodes the run never
reached in its own graph. So each `name@version` is held to the structure it was first served
with. What counts is what decides which code runs next and what state it sees: nodes, edges
(plain, waiting and conditional, with the targets a branch may take), the nodes a `Command`
may go to, and the state's keys with their reducers. A node's body does not count: fixing a
prompt or a bug under the same version is what versions are for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

SHAPE_FORMAT = 1
"""Bumped when what `graph_shape` records changes, so old digests are not compared to new."""


def graph_shape(builder: Any) -> dict[str, Any]:
    """The structure of an uncompiled LangGraph builder (a StateGraph), as plain JSON."""
    nodes = getattr(builder, "nodes", {}) or {}
    shape: dict[str, Any] = {
        "format": SHAPE_FORMAT,
        "nodes": {name: _node(spec) for name, spec in sorted(nodes.items())},
        "edges": sorted([str(a), str(b)] for a, b in getattr(builder, "edges", ()) or ()),
        "waiting_edges": sorted(
            [sorted(str(s) for s in starts), str(end)]
            for starts, end in getattr(builder, "waiting_edges", ()) or ()
        ),
        "branches": {
            str(source): {str(name): _branch(spec) for name, spec in sorted(branches.items())}
            for source, branches in sorted((getattr(builder, "branches", {}) or {}).items())
        },
        "state": {str(key): _channel(channel) for key, channel in sorted(_state(builder).items())},
    }
    return shape


def shape_digest(shape: Mapping[str, Any]) -> str:
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def describe_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """The difference between two shapes in one line, first things first."""
    if before.get("format") != after.get("format"):
        return "the graph was recorded by another Keel version's rules"
    said: list[str] = []
    said += _named_sets("node", before.get("nodes", {}), after.get("nodes", {}))
    for name in sorted(set(before.get("nodes", {})) & set(after.get("nodes", {}))):
        if before["nodes"][name] != after["nodes"][name]:
            said.append(f"node {name!r} goes to other nodes")
    said += _edges("edge", before.get("edges", []), after.get("edges", []))
    said += _edges("waiting edge", before.get("waiting_edges", []), after.get("waiting_edges", []))
    old_branches, new_branches = before.get("branches", {}), after.get("branches", {})
    for source in sorted(set(old_branches) | set(new_branches)):
        if old_branches.get(source) != new_branches.get(source):
            said.append(f"the conditional edges from {source!r} changed")
    said += _named_sets("state key", before.get("state", {}), after.get("state", {}))
    for key in sorted(set(before.get("state", {})) & set(after.get("state", {}))):
        if before["state"][key] != after["state"][key]:
            said.append(
                f"state key {key!r} is reduced by {after['state'][key]} "
                f"(was {before['state'][key]})"
            )
    if not said:
        return "the graph's structure changed"
    more = f" (and {len(said) - 3} more)" if len(said) > 3 else ""
    return "; ".join(said[:3]) + more


def _state(builder: Any) -> dict[str, Any]:
    # The state schema's own channels: `builder.channels` also holds the keys of every node's
    # input annotation, which would hide a key removed from the state.
    schemas = getattr(builder, "schemas", {}) or {}
    own = schemas.get(getattr(builder, "state_schema", None))
    return dict(own) if own is not None else dict(getattr(builder, "channels", {}) or {})


def _node(spec: Any) -> dict[str, Any]:
    ends = getattr(spec, "ends", None)
    node: dict[str, Any] = {"goes_to": sorted(str(e) for e in ends) if ends else []}
    if getattr(spec, "defer", False):
        node["defer"] = True
    inner = getattr(getattr(spec, "runnable", None), "builder", None)
    if inner is not None and hasattr(inner, "nodes"):
        # A compiled subgraph as a node: its structure is part of the run's path.
        node["subgraph"] = graph_shape(inner)
    return node


def _branch(spec: Any) -> Any:
    ends = getattr(spec, "ends", None)
    if ends:
        return sorted({str(target) for target in ends.values()})
    # No path map and no Literal annotation: the targets are whatever the function returns;
    # the function's name is the best stand-in for them.
    path = getattr(spec, "path", None)
    return {"path": str(getattr(path, "name", None) or type(path).__name__)}


def _channel(channel: Any) -> str:
    kind = type(channel).__name__
    operator = getattr(channel, "operator", None)
    if operator is None:
        return kind
    name = getattr(operator, "__qualname__", None) or type(operator).__name__
    return f"{kind}({getattr(operator, '__module__', '')}.{name})"


def _named_sets(what: str, before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    gone = sorted(set(before) - set(after))
    new = sorted(set(after) - set(before))
    if len(gone) == 1 and len(new) == 1:
        return [f"{what} {gone[0]!r} renamed to {new[0]!r}"]
    return [f"{what} {n!r} removed" for n in gone] + [f"{what} {n!r} added" for n in new]


def _edges(what: str, before: list[Any], after: list[Any]) -> list[str]:
    old = {json.dumps(e) for e in before}
    new = {json.dumps(e) for e in after}

    def arrow(edge: str) -> str:
        start, end = json.loads(edge)
        starts = "+".join(start) if isinstance(start, list) else start
        return f"{starts}->{end}"

    return [f"{what} {arrow(e)} removed" for e in sorted(old - new)] + [
        f"{what} {arrow(e)} added" for e in sorted(new - old)
    ]
