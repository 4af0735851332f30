"""Keel's exceptions. Each class's docstring is its default message."""

from __future__ import annotations

from typing import Any


class KeelError(Exception):
    """Keel error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidId(KeelError, ValueError):
    """The id is not valid."""


class InvalidInput(KeelError, ValueError):
    """The input is not valid."""

    def __init__(self, message: str | None = None, *, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.errors = list(errors or [])
        """One sentence per problem, each naming its field (`input.to: ...`)."""


class InputTooLarge(InvalidInput):
    """The input is larger than the configured limit."""


class JobExists(KeelError):
    """The job already has a run with other input (submit with if_exists="error")."""

    def __init__(self, message: str, *, job_id: str, runs: list[str]) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.runs = runs


class UnknownWorkflow(KeelError, LookupError):
    """No workflow of that name (and version) is registered."""


class InvalidWorkflow(KeelError, ValueError):
    """The workflow's graph cannot be built or compiled."""


class RunNotFound(KeelError, LookupError):
    """No run with that id."""


class ThreadNotFound(KeelError, LookupError):
    """No thread with that id."""


class CheckpointNotFound(KeelError, LookupError):
    """The thread has no checkpoint with that id (a fork's start, a state read)."""


class ScheduleNotFound(KeelError, LookupError):
    """No schedule with that id or name."""


class ScheduleExists(KeelError):
    """A schedule of that name exists."""


class ThreadBusy(KeelError):
    """The thread has an unfinished run and the submission's strategy is `reject`."""

    def __init__(self, message: str, *, thread_id: str, active_run: str) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.active_run = active_run


class RunStillGoing(KeelError, TimeoutError):
    """The run did not end (or wait for input) within the time given: it goes on."""

    def __init__(self, message: str, *, run_id: str, status: str) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.status = status


class DecisionConflict(KeelError):
    """Another answer won the wait first: this one changed nothing."""


class WaitNotFound(KeelError, LookupError):
    """No wait with that id on that run."""


class InvalidTransition(KeelError):
    """That lifecycle transition is not allowed."""


class RunFinished(KeelError):
    """The run has finished; it takes no more decisions."""


class NoPendingWait(KeelError):
    """The run is not waiting for a decision."""


class LeaseLost(KeelError):
    """This worker no longer owns the run: another worker took it over."""


class RunCancelled(KeelError):
    """The run was cancelled."""


class Released(KeelError):
    """The worker is stopping: it gave the run back at a step boundary for another to resume."""


class ClockSkew(KeelError):
    """This host's clock is too far from the database's: fix its time sync (NTP) first."""


class WorkflowVersionMismatch(KeelError):
    """The run's checkpoint does not fit that version of its workflow."""


class SchemaMismatch(KeelError):
    """The database schema is not the version this Keel expects: run `keel migrate`."""


class NotInRun(KeelError, RuntimeError):
    """This must be called inside a node of a run executed by Keel."""


class UsageError(KeelError, RuntimeError):
    """Keel was used in a way it does not support."""


class WrongWaitKind(UsageError):
    """An answer a wait of this kind does not take (approve an in-doubt effect, resolve an
    approval, decide an outbox delivery's wait). Nothing is recorded."""

    def __init__(
        self, message: str, *, wait_id: str, wait_kind: str, with_value: bool = False
    ) -> None:
        super().__init__(message)
        self.wait_id = wait_id
        self.wait_kind = wait_kind
        self.with_value = with_value
        """The refused answer was a resume value (for a plain interrupt only)."""


class IntentNotFound(KeelError, LookupError):
    """No outbox intent has this id."""


class IntentState(KeelError):
    """The outbox intent is not in a state that takes this action (retry a dead one, resolve
    an in-doubt one)."""


class EffectFailed(KeelError):
    """The effect failed permanently; its error is recorded in the ledger."""

    def __init__(self, key: str, error: str) -> None:
        super().__init__(f"effect {key} failed: {error}")
        self.key = key
        self.error = error


class TransientError(KeelError):
    """A transient failure (rate limit, 5xx): retry with backoff under the same key."""

    def __init__(self, message: str | None = None, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NondeterminismError(KeelError):
    """A replay called an effect with other arguments than the call the ledger recorded."""

    def __init__(self, *, node: str, effect: str, key: str, changed: list[str]) -> None:
        what = ", ".join(changed) if changed else "the arguments"
        super().__init__(
            f"node {node!r} called effect {effect!r} with other arguments than the call the "
            f"ledger recorded at this place of the run (changed: {what}; key {key}). Nothing "
            "was performed. Two fixes: compute the arguments in an earlier node and call the "
            "effect in the next one (an LLM's draft, a timestamp: the earlier node's checkpoint "
            "keeps them, so a resume passes the same ones), or name the arguments that identify "
            f"the effect, @keel.effect({effect!r}, key=[...]), so the others may change. Then "
            "`keel runs resume` the run (docs/effects.md, 'Arguments')"
        )
        self.node = node
        self.effect = effect
        self.key = key
        self.changed = changed


class EffectConflict(KeelError):
    """The provider holds more than one outcome for one idempotency key (two charges, two
    messages), or reports an outcome that conflicts with the call: never marked sent on a guess.

    Raise it from a reconciler (or from the effect itself) with what the provider holds; Keel
    marks the key in doubt with those records and waits for a person."""

    def __init__(self, message: str | None = None, *, records: list[Any] | None = None) -> None:
        super().__init__(message or "the provider holds more than one outcome for this key")
        self.records = list(records or [])


class SlowDatabase(KeelError):
    """The database's answer came too late to act on: a lease (or claim) it said was live may
    have lapsed since. Nothing was performed; an infrastructure fault, not the run's failure."""


class WebhookRefused(UsageError):
    """A completion webhook Keel may not call: not http(s), no signing secret, or a private
    address that is not allowed (docs/webhooks.md)."""
