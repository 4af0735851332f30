"""Named fault points: off by default and free when off.

The crash harness arms a point for one occurrence through the environment of a worker
subprocess, e.g. ``KEEL_FAULTS=effect.after_perform@2`` kills the process with SIGKILL the
second time any effect returns, before the ledger records it. ``point:label@n`` narrows a point
to one label (an effect name, a node). A trailing ``!stop`` freezes the process with SIGSTOP
instead (as a long GC pause or a suspended VM would), until someone sends it SIGCONT.
Nothing but the harness should set it.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import threading
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
    "artifact.before_rename",  # the temp file is written and fsynced, not yet renamed
    "lease.renew",  # a heartbeat is about to renew leases
)


SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def _parse(spec: str) -> dict[str, tuple[int, signal.Signals]]:
    armed: dict[str, tuple[int, signal.Signals]] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        item, _, action = item.partition("!")
        name, _, occurrence = item.partition("@")
        if name.split(":", 1)[0] not in POINTS:
            raise ValueError(f"{ENV}: unknown fault point {name!r}; known: {', '.join(POINTS)}")
        if (action or "kill") not in SIGNALS:
            raise ValueError(f"{ENV}: unknown action {action!r} for {name!r}; known: kill, stop")
        armed[name] = (int(occurrence or 1), SIGNALS[action or "kill"])
    return armed


_armed: dict[str, tuple[int, signal.Signals]] = _parse(os.environ.get(ENV, ""))
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
    """Kill (or freeze) this process here if the harness armed this point for this occurrence."""
    if not _armed and not _recording:
        return
    if _recording:
        reached[name] += 1
    for key in (name, f"{name}:{label}") if label else (name,):
        if key in _armed:
            _seen[key] += 1
            occurrence, signum = _armed[key]
            if _seen[key] == occurrence:
                # To this thread, not the process: a process-directed signal is taken by
                # whichever thread the kernel wakes first, and meanwhile this one runs on past
                # the point (a frozen worker found later to have paid before it froze).
                signal.pthread_kill(threading.get_ident(), signum)


def arm(spec: str) -> None:
    """Arm points in this process (tests of the harness itself)."""
    _armed.clear()
    _seen.clear()
    _armed.update(_parse(spec))
