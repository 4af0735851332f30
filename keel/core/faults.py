"""Named fault points: off by default and free when off.

The crash harness arms a point for one occurrence through the environment of a worker
subprocess, e.g. ``KEEL_FAULTS=effect.after_perform@2`` kills the process with SIGKILL the
second time any effect returns, before the ledger records it. ``point:label@n`` narrows a point
to one label (an effect name, a node). A trailing ``!stop`` freezes the process with SIGSTOP
instead (as a long GC pause or a suspended VM would), until someone sends it SIGCONT;
``!fail-next-statement`` makes the next statement it sends through a connector fail as a
dropped connection would, then stops it the same way, so the harness sees the point was reached
(keel chaos --fault db-error on SQLite). Nothing but the harness should set it.

Recording (``KEEL_FAULTS_RECORD=<file>``, the harness's clean run) also keeps a trace: every
point reached, in order, with the node and task path that were running when the caller knows
them and the system-wide monotonic time, so the harness can tell which node a cell interrupts
and which cells follow a delivery its sinks saw.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import threading
import time
from collections import Counter

ENV = "KEEL_FAULTS"

POINTS = (
    "effect.before_reserve",  # the effect is about to be reserved
    "effect.before_call",  # reserved; the lease is about to be checked, then the provider called
    "effect.after_perform",  # the provider accepted it; the ledger has not recorded it
    "effect.after_record",  # recorded as sent; the step's checkpoint is not written yet
    "checkpoint.before_write",  # inside the fenced checkpoint transaction, before the write
    "run.before_first_checkpoint",  # claimed and admitted, nothing checkpointed yet
    "wait.after_interrupt",  # interrupt() paused the graph; the wait is not registered yet
    "decision.after_record",  # a decision is recorded; the run has not resumed
    "handoff.after_commit",  # a submit, decision or run's end committed with our claim, not started
    "artifact.before_rename",  # the temp file is written and fsynced, not yet renamed
    "lease.renew",  # a heartbeat is about to renew leases
    "outbox.before_call",  # an intent is claimed; its claim is about to be checked, then sent
    "outbox.after_call",  # the provider accepted an intent; its delivery is not recorded yet
    "outbox.after_settle",  # an intent is recorded delivered
    "prune.after_commit",  # a prune batch's rows are deleted; its artifact folders are not yet
)


ACTIONS = ("kill", "stop", "fail-next-statement")


def _parse(spec: str) -> dict[str, tuple[int, str]]:
    armed: dict[str, tuple[int, str]] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        item, _, action = item.partition("!")
        name, _, occurrence = item.partition("@")
        if name.split(":", 1)[0] not in POINTS:
            raise ValueError(f"{ENV}: unknown fault point {name!r}; known: {', '.join(POINTS)}")
        if (action or "kill") not in ACTIONS:
            raise ValueError(
                f"{ENV}: unknown action {action!r} for {name!r}; known: {', '.join(ACTIONS)}"
            )
        armed[name] = (int(occurrence or 1), action or "kill")
    return armed


_armed: dict[str, tuple[int, str]] = _parse(os.environ.get(ENV, ""))
_fail_next_statement = False
_seen: Counter[str] = Counter()
reached: Counter[str] = Counter()
trace: list[tuple[str, str, str, str, int]] = []
"""(point, label, node, task path, time.monotonic_ns()) per point reached, when recording."""
# The harness's clean run sets a file path: each process appends what it reached at exit.
_record_to = os.environ.get("KEEL_FAULTS_RECORD", "")
_recording = bool(_record_to)
_started_ns = time.monotonic_ns()


def _dump() -> None:
    with open(_record_to, "a") as fh:
        span = [_started_ns, time.monotonic_ns()]
        line = {"pid": os.getpid(), "reached": dict(reached), "trace": trace, "span": span}
        fh.write(json.dumps(line) + "\n")


if _recording:
    atexit.register(_dump)


def fault_point(name: str, label: str = "", node: str = "", path: str = "") -> None:
    """Kill (or freeze) this process here if the harness armed this point for this
    occurrence. `node` and `path` say which node (and task path) is running, where the caller
    knows it."""
    if not _armed and not _recording:
        return
    if _recording:
        reached[name] += 1
        trace.append((name, label, node, path, time.monotonic_ns()))
    for key in (name, f"{name}:{label}") if label else (name,):
        if key in _armed:
            _seen[key] += 1
            occurrence, action = _armed[key]
            if _seen[key] == occurrence:
                _strike(action)


def _strike(action: str) -> None:
    global _fail_next_statement
    if action == "fail-next-statement":
        _fail_next_statement = True
    # To this thread, not the process: a process-directed signal is taken by whichever thread
    # the kernel wakes first, and meanwhile this one runs on past the point (a frozen worker
    # found later to have paid before it froze). SIGSTOP still stops the whole process.
    signum = signal.SIGKILL if action == "kill" else signal.SIGSTOP
    signal.pthread_kill(threading.get_ident(), signum)


def statement_fails() -> bool:
    """True once after a `fail-next-statement` fault fired: the connector calling this fails
    the statement it is about to send (one global read when off)."""
    global _fail_next_statement
    if not _fail_next_statement:
        return False
    _fail_next_statement = False
    return True


def arm(spec: str) -> None:
    """Arm points in this process (tests of the harness itself)."""
    _armed.clear()
    _seen.clear()
    _armed.update(_parse(spec))
