"""A run's answers on `keel.AsyncApp` (mixed into it): approve or reject its pending approval,
or say whether its in-doubt effect reached the provider. The rule (the first decision wins,
what it queues) lives in keel.core.decisions; this is its face, with the hand-off of the run
it queues to a worker of this process.
"""

from __future__ import annotations

from typing import Any, Unpack

from keel.core import decisions
from keel.runtime.handoff import Reserved
from keel.runtime.runtime import Runtime


class Answers:
    """The answer operations of `AsyncApp` (`runtime` is the app's)."""

    runtime: Runtime

    async def open(self) -> None: ...  # AsyncApp's

    async def _decide(self, run_id: str, **kwargs: Any) -> decisions.DecisionResult:
        await self.open()
        # A worker of this process with a free slot claims in the decision's commit: the run
        # it queued resumes without waiting for the worker to wake and claim it.
        taker, claim = self.runtime.taker()
        if taker is None:
            return await decisions.decide(self.runtime.services, run_id, **kwargs)
        slot = Reserved(taker)
        try:
            return await decisions.decide(
                self.runtime.services, run_id, then=claim, taken=slot.adopt, **kwargs
            )
        finally:
            slot.give_back()

    async def approve(
        self, run_id: str, **answer: Unpack[decisions.Answer]
    ) -> decisions.DecisionResult:
        """Approve the run's pending approval; the first decision wins."""
        return await self._decide(run_id, decision="approved", **answer)

    async def reject(
        self, run_id: str, **answer: Unpack[decisions.Answer]
    ) -> decisions.DecisionResult:
        """Reject the run's pending approval; the first decision wins."""
        return await self._decide(run_id, decision="rejected", **answer)

    async def resolve_effect(
        self,
        run_id: str,
        *,
        performed: bool,
        result: Any = None,
        **answer: Unpack[decisions.Answer],
    ) -> decisions.DecisionResult:
        """Tell an in-doubt effect's run whether the effect reached the provider."""
        return await self._decide(
            run_id,
            decision="performed" if performed else "not_performed",
            value={"performed": performed, "result": result},
            **answer,
        )
