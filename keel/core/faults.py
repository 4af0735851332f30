"""Named fault points: off by default and free when off.

The crash harness arms a point for one occurrence through the environment of a worker
subprocess, e.g. ``KEEL_FAULTS=effect.after_perform@2`` kills the process with SIGKILL the
second time any effect returns, before the ledger records it. ``point:label@n`` narrows a point
to one label (an effect name, a node). Nothing but the harness should set it.

``KEEL_FAULTS_ACTION`` says what happens at the armed occurrence (see docs/chaos.md):
``kill`` (default) SIGKILLs the process; ``stop`` SIGSTOPs it, so the harness can act on the
world while it is held (let another worker take the run over, restart the database, drop its
connections) and SIGCONT it after; ``fail-next-statement`` makes the next statement this
process sends through a connector fail as a dropped connection would, then stops like ``stop``
(the harness sees that the point was reached and continues it at once).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
from collections import Counter

ENV = "KEEL_FAULTS"
ACTION_ENV = "KEEL_FAULTS_ACTION"
ACTIONS = ("kill", "stop", "fail-next-statement")

POINTS = (
    "effect.before_reserve",  # the effect is about to be reserved
    "effect.after_perform",  # the provider accepted it; the ledger has not recorded it
    "effect.after_record",  # recorded as sent; the step's checkpoint is not written yet
    "checkpoint.before_write",  # inside the fenced checkpoint transaction, before the write
    "run.before_first_checkpoint",  # claimed and admitted, nothing checkpointed yet
    "wait.after_interrupt",  # interrupt() paused the graph; the wait is not registered yet
    "decision.after_record",  # a decision is recorded; the run has not resumed
    "artifact.before_rename",  # the temp file is written and fsynced, not yet renamed
    "lease.renew",  # a heartbeat is about to renew leases
)


def _parse(spec: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, occurrence = item.partition("@")
        if name.split(":", 1)[0] not in POINTS:
            raise ValueError(f"{ENV}: unknown fault point {name!r}; known: {', '.join(POINTS)}")
        armed[name] = int(occurrence or 1)
    return armed


def _parse_action(value: str) -> str:
    action = value.strip() or "kill"
    if action not in ACTIONS:
        raise ValueError(f"{ACTION_ENV}: unknown action {action!r}; known: {', '.join(ACTIONS)}")
    return action


_armed: dict[str, int] = _parse(os.environ.get(ENV, ""))
_action = _parse_action(os.environ.get(ACTION_ENV, ""))
_fail_next_statement = False
_seen: Counter[str] = Counter()
reached: Counter[str] = Counter()
# The harness's clean run sets a file path: each process appends what it reached at exit.
_record_to = os.environ.get("KEEL_FAULTS_RECORD", "")
_recording = bool(_record_to)


def _dump() -> None:
    with open(_record_to, "a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "reached": dict(reached)}) + "\n")


if _recording:
    atexit.register(_dump)


def fault_point(name: str, label: str = "") -> None:
    """Kill this process here if the harness armed this point for this occurrence."""
    if not _armed and not _recording:
        return
    if _recording:
        reached[name] += 1
    for key in (name, f"{name}:{label}") if label else (name,):
        if key in _armed:
            _seen[key] += 1
            if _seen[key] == _armed[key]:
                _strike()


def _strike() -> None:
    global _fail_next_statement
    if _action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if _action == "fail-next-statement":
        _fail_next_statement = True
    # The whole process stops here, whichever thread reached the point; the harness continues
    # it with SIGCONT once it has done what the fault is about.
    os.kill(os.getpid(), signal.SIGSTOP)


def statement_fails() -> bool:
    """True once after a `fail-next-statement` fault fired: the connector calling this must
    fail the statement it is about to send (cheap when off: one global read)."""
    global _fail_next_statement
    if not _fail_next_statement:
        return False
    _fail_next_statement = False
    return True


def arm(spec: str, action: str = "kill") -> None:
    """Arm points in this process (tests of the harness itself)."""
    global _action
    _armed.clear()
    _seen.clear()
    _armed.update(_parse(spec))
    _action = _parse_action(action)
