"""Keel: crash-safe LangGraph runs. Admitted before they start, resumed from their last step,
owned by one fenced worker at a time, with side effects that happen once."""

from keel.app import App
from keel.artifacts import RunArtifacts, artifacts
from keel.clock import ManualClock, SystemClock
from keel.errors import (
    EffectFailed,
    InputTooLarge,
    InvalidId,
    InvalidInput,
    InvalidTransition,
    KeelError,
    LeaseLost,
    NoPendingWait,
    NotInRun,
    RunFinished,
    RunNotFound,
    SchemaMismatch,
    TransientError,
    UnknownWorkflow,
    WaitNotFound,
)
from keel.heartbeat import heartbeat, last_heartbeat
from keel.ids import job_id
from keel.ledger import Retry, effect
from keel.lifecycle import Decision, Status, TerminationReason
from keel.waits import ApprovalDecision, approval

__all__ = [
    "App",
    "ApprovalDecision",
    "Decision",
    "EffectFailed",
    "InputTooLarge",
    "InvalidId",
    "InvalidInput",
    "InvalidTransition",
    "KeelError",
    "LeaseLost",
    "ManualClock",
    "NoPendingWait",
    "NotInRun",
    "Retry",
    "RunArtifacts",
    "RunFinished",
    "RunNotFound",
    "SchemaMismatch",
    "Status",
    "SystemClock",
    "TerminationReason",
    "TransientError",
    "UnknownWorkflow",
    "WaitNotFound",
    "approval",
    "artifacts",
    "effect",
    "heartbeat",
    "job_id",
    "last_heartbeat",
]
