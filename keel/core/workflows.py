"""The registry of workflows: a name and version for each graph factory, and how it runs."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from keel.core.errors import UnknownWorkflow, UsageError

DURABILITIES = ("sync", "async", "exit")


@dataclass(frozen=True)
class Workflow:
    name: str
    version: str
    factory: Callable[[], Any]
    durability: str = "sync"
    termination: Callable[[Any], str | None] | None = None
    recursion_limit: int = 100
    max_concurrency: int | None = None
    """At most this many runs of this workflow execute at once, across all workers."""
    schedule: Any = field(default=None, compare=False)
    """A `keel.core.schedules.ScheduleSpec` its workers upsert at start, or None."""

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"


def _where(factory: Callable[[], Any]) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', factory)}"


@dataclass
class Workflows:
    _by_key: dict[str, Workflow] = field(default_factory=dict)
    _latest: dict[str, Workflow] = field(default_factory=dict)

    def add(self, workflow: Workflow) -> None:
        if workflow.durability not in DURABILITIES:
            raise UsageError(f"durability must be one of {DURABILITIES}")
        known = self._by_key.get(workflow.key)
        if known is not None and known.factory is not workflow.factory:
            # Silently keeping either would run some submissions on a graph nobody meant.
            raise UsageError(
                f"workflow {workflow.key!r} is already registered (by "
                f"{_where(known.factory)}); give the new one another version"
            )
        self._by_key[workflow.key] = workflow
        self._latest[workflow.name] = workflow

    def get(self, name: str, version: str | None = None) -> Workflow:
        found = self._latest.get(name) if version is None else self._by_key.get(f"{name}@{version}")
        if found is None:
            known = ", ".join(sorted(self._by_key)) or "none"
            what = name if version is None else f"{name}@{version}"
            raise UnknownWorkflow(f"no workflow {what!r} is registered (registered: {known})")
        return found

    def all(self) -> list[Workflow]:
        return [self._by_key[k] for k in sorted(self._by_key)]

    def keys(self) -> list[str]:
        return sorted(self._by_key)

    def without(self, keys: Iterable[str]) -> Workflows:
        """A registry of the same workflows but `keys` (what a worker serves of its own)."""
        left = Workflows()
        for workflow in self.all():
            if workflow.key not in set(keys):
                left.add(workflow)
        return left

    def limits(self) -> dict[str, int]:
        return {k: w.max_concurrency for k, w in self._by_key.items() if w.max_concurrency}
