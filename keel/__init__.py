"""Keel: crash-safe LangGraph runs. Admitted before they start, resumed from their last step,
owned by one fenced worker at a time, with side effects that happen once."""

from keel.core.artifacts import RunArtifacts, artifacts
from keel.core.clock import ManualClock, SystemClock
from keel.core.effects.declare import effect
from keel.core.effects.options import KEY, Retry
from keel.core.effects.outbox import await_effect, await_effects, enqueue
from keel.core.errors import (
    CheckpointNotFound,
    ClockSkew,
    DecisionConflict,
    EffectConflict,
    EffectFailed,
    InputTooLarge,
    IntentNotFound,
    IntentState,
    InvalidId,
    InvalidInput,
    InvalidTransition,
    InvalidWorkflow,
    JobExists,
    KeelError,
    LeaseLost,
    NondeterminismError,
    NoPendingWait,
    NotInRun,
    RunFinished,
    RunNotFound,
    ScheduleExists,
    ScheduleNotFound,
    SchemaMismatch,
    ThreadBusy,
    ThreadNotFound,
    TransientError,
    UnknownWorkflow,
    WaitNotFound,
    WorkflowVersionMismatch,
)
from keel.core.heartbeat import heartbeat, last_heartbeat
from keel.core.ids import job_id
from keel.core.lifecycle import Decision, Status, TerminationReason
from keel.core.schedules import ScheduleSpec
from keel.core.timers import asleep, sleep
from keel.core.waits import ApprovalDecision, approval, interrupt
from keel.runtime.aio import AsyncApp
from keel.runtime.app import App
from keel.runtime.records import RunDetails, Submission

__all__ = [
    "KEY",
    "App",
    "ApprovalDecision",
    "AsyncApp",
    "CheckpointNotFound",
    "ClockSkew",
    "Decision",
    "DecisionConflict",
    "EffectConflict",
    "EffectFailed",
    "InputTooLarge",
    "IntentNotFound",
    "IntentState",
    "InvalidId",
    "InvalidInput",
    "InvalidTransition",
    "InvalidWorkflow",
    "JobExists",
    "KeelError",
    "LeaseLost",
    "ManualClock",
    "NoPendingWait",
    "NondeterminismError",
    "NotInRun",
    "Retry",
    "RunArtifacts",
    "RunDetails",
    "RunFinished",
    "RunNotFound",
    "ScheduleExists",
    "ScheduleNotFound",
    "ScheduleSpec",
    "SchemaMismatch",
    "Status",
    "Submission",
    "SystemClock",
    "TerminationReason",
    "ThreadBusy",
    "ThreadNotFound",
    "TransientError",
    "UnknownWorkflow",
    "WaitNotFound",
    "WorkflowVersionMismatch",
    "approval",
    "artifacts",
    "asleep",
    "await_effect",
    "await_effects",
    "effect",
    "enqueue",
    "heartbeat",
    "interrupt",
    "job_id",
    "last_heartbeat",
    "sleep",
]
