"""Let LangGraph's conformance suite write through Keel's fenced savers.

Keel's savers refuse every checkpoint write for a thread this process holds no lease for (see
`Fencing._held`). The suite knows nothing of leases: it invents thread ids and writes.
So, on the first write for a thread id, the adapter does what Keel does before a run's first
step: it admits a run with that id and claims it, then holds the claim's token, so the write
goes through the same fenced transaction a real run's checkpoint does.

Run ids: Keel validates ids at admission (`keel.core.ids`: `[a-z0-9][a-z0-9._-]*`), and
`runs.admit` derives a run's id from its job, so it cannot take the suite's thread ids. The
adapter inserts the run row with Keel's own `insert_run` query instead, which takes the id as
given. That skips the validator on purpose: the saver itself never validates a thread id, and
it stores and returns the id verbatim (the suite compares them), so mapping ids to valid ones
would test something else. The suite's ids (uuid4 strings, `thread-N`) fit the rules anyway.

The adapter is a subclass of Keel's saver class that overrides only `aput` and `aput_writes`
and then calls Keel's own; the saver object is the one `make_saver` built when the runtime
opened. Everything else, including what the suite's capability detection sees, is Keel's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata

from keel.core import leases
from keel.core.codec import canonical_json
from keel.langgraph.savers import FencedPostgresSaver, FencedSaver, FencedSqliteSaver

WORKFLOW = "conformance"
VERSION = "1"
WORKER = "conformance-worker"
LEASE_TTL = 3600.0
"""Longer than any test: the suite's writes never race a lease expiry."""


class LeaseOnFirstWrite:
    """Admit and claim a run for each new thread id before Keel's fenced write runs."""

    async def _lease_for(self, config: RunnableConfig) -> None:
        saver: FencedSaver = self  # type: ignore[assignment]
        run_id = str(config["configurable"]["thread_id"])
        if run_id in saver.holders:
            return
        async with saver.store.transaction() as tx:
            admitted = await tx.one(
                "insert_run",
                {
                    "run_id": run_id,
                    "job_id": WORKFLOW,
                    "workflow": WORKFLOW,
                    "workflow_version": VERSION,
                    "attempt": 1,
                    "input_hash": "conformance",
                    "input": canonical_json(None),
                    "delay": None,
                    "not_before": None,
                },
            )
            assert admitted is not None, f"run {run_id} already exists but is not held"
        # Every run admitted earlier is already claimed under a live lease, so the oldest
        # claimable run of the workflow is the one just admitted.
        claimed = await leases.claim(saver.store, WORKER, [f"{WORKFLOW}@{VERSION}"], LEASE_TTL)
        assert claimed is not None and claimed[0].run_id == run_id, claimed
        saver.hold(run_id, claimed[0].token, WORKER)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        await self._lease_for(config)
        return await super().aput(config, checkpoint, metadata, new_versions)  # type: ignore[misc]

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._lease_for(config)
        await super().aput_writes(config, writes, task_id, task_path)  # type: ignore[misc]


class LeasingSqliteSaver(LeaseOnFirstWrite, FencedSqliteSaver):
    pass


class LeasingPostgresSaver(LeaseOnFirstWrite, FencedPostgresSaver):
    pass


_LEASING: dict[type, type] = {
    FencedSqliteSaver: LeasingSqliteSaver,
    FencedPostgresSaver: LeasingPostgresSaver,
}


def leasing(saver: FencedSaver) -> FencedSaver:
    """The same saver object, with the admit-and-claim hook in front of its writes."""
    saver.__class__ = _LEASING[type(saver)]
    return saver
