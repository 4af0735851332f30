"""What the runtime hands back: a submission, everything known about a run, what a worker did."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from keel.core.codec import loads
from keel.core.store.base import Row


class Submission(dict[str, Any]):
    """The run `submit` admitted or found: its row (still a dict to index), and `created`,
    whether this call admitted it."""

    def __init__(self, row: Row, *, created: bool, other_runs: list[str] | None = None) -> None:
        super().__init__(row)
        self.created = created
        self.other_runs = list(other_runs or [])
        """The job's runs of this workflow with other input, newest first (see `if_exists`)."""

    @property
    def run_id(self) -> str:
        return str(self["run_id"])

    @property
    def job_id(self) -> str:
        return str(self["job_id"])

    @property
    def status(self) -> str:
        return str(self["status"])


@dataclass
class RunDetails:
    """Everything Keel knows about one run."""

    run: Row
    timeline: list[Row]
    effects: list[Row]
    waits: list[Row]
    artifacts: list[Any]
    notifications: list[Row] = field(default_factory=list)
    intents: list[Row] = field(default_factory=list)
    """Its outbox effects' intents (keel.core.effects.outbox), oldest first."""
    stranded_reason: str | None = None
    """Why it is stranded: it needs a worker of a version that no worker serves, or that
    workers refuse (their graph differs from the version's); None: it is not."""

    @property
    def stranded(self) -> bool:
        """It needs a worker of a version that no worker serves (see `keel.core.versions`)."""
        return self.stranded_reason is not None

    @property
    def annotated_run(self) -> Row:
        """The run's row with what is derived when it is read: `stranded` and why."""
        return {**self.run, "stranded": self.stranded, "stranded_reason": self.stranded_reason}

    @property
    def failure(self) -> dict[str, Any] | None:
        """Where and how a failed run failed (keel.core.failures: type, message, node,
        task_path, step, traceback), from its last failure event; None unless it is failed."""
        if self.status != "failed":
            return None
        for event in reversed(self.timeline):
            data = event.get("data")
            if isinstance(data, dict) and isinstance(data.get("failure"), dict):
                return dict(data["failure"])
        return None

    @property
    def run_id(self) -> str:
        return str(self.run["run_id"])

    @property
    def job_id(self) -> str:
        return str(self.run["job_id"])

    @property
    def status(self) -> str:
        return str(self.run["status"])

    @property
    def decision(self) -> str:
        return str(self.run["decision"])

    @property
    def termination_reason(self) -> str | None:
        return self.run["termination_reason"]

    @property
    def output(self) -> Any:
        return loads(self.run["output"])


@dataclass
class WorkerStats:
    """What a worker did with the runs it claimed: each ended its execution in one of these."""

    claimed: int = 0
    finished: int = 0
    """Completed, failed or cancelled."""
    waiting: int = 0
    """Paused on a wait (an approval, an in-doubt effect), or queued again by a decision."""
    lost: int = 0
    """Given back (drained at a step boundary) or taken over by another worker."""

    def __str__(self) -> str:
        return (
            f"claimed {self.claimed}: finished {self.finished}, waiting {self.waiting}, "
            f"given back {self.lost}"
        )
