"""What a failed run keeps of its failure: enough to find the bug without the worker's log.

`str(exc)` alone (`KeyError: 'recipients'`) says neither where nor how. A failed run keeps, in
its `status.failed` (or `attempt.failed`) event: the exception's type and message, where in the
graph it happened (the node, the task's path, the step: filled in by the executor, which knows
the graph), and a bounded traceback. The traceback puts the user's frames first: those of the
node and the code it called are the ones that matter, LangGraph's and Keel's own (the frames
between the worker and the node) are counted, not printed, when the whole would not fit.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from typing import Any

MAX_TRACEBACK = 8_000
"""Characters of traceback a run keeps (the rest is said to be cut)."""
MAX_MESSAGE = 2_000

_LIBRARIES = tuple(
    os.path.normcase(os.path.realpath(p))
    for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)
_KEEL = os.path.normcase(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def describe(exc: BaseException, where: dict[str, Any] | None = None) -> dict[str, Any]:
    """The failure as a run keeps it: type, message, where (node, task_path, step) and the
    bounded traceback, user frames first."""
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:MAX_MESSAGE],
        **{k: v for k, v in (where or {}).items() if v is not None},
        "traceback": bounded_traceback(exc),
    }


def bounded_traceback(exc: BaseException, limit: int = MAX_TRACEBACK) -> str:
    """The traceback as Python prints it when it fits; else the user's frames (those outside
    the standard library, installed packages and Keel), then the exception, within `limit`."""
    whole = "".join(traceback.format_exception(exc))
    if len(whole) <= limit:
        return whole
    frames = traceback.extract_tb(exc.__traceback__)
    users = [f for f in frames if is_user_frame(f.filename)]
    skipped = len(frames) - len(users)
    head = (
        f"Traceback (the user's {len(users)} frame(s); {skipped} of Keel and libraries left out):\n"
    )
    tail = "".join(traceback.format_exception_only(type(exc), exc))
    body = "".join(traceback.format_list(users))
    room = limit - len(head) - len(tail)
    if len(body) > room:
        # The innermost frames are nearest the error: keep those.
        body = "  ...\n" + body[len(body) - max(room - 6, 0) :]
    return head + body + tail


def is_user_frame(filename: str) -> bool:
    """A frame of the user's code: not the standard library, an installed package or Keel."""
    if filename.startswith("<"):  # <string> is code someone wrote; <frozen ...> is Python's
        return not filename.startswith("<frozen")
    path = os.path.normcase(os.path.realpath(filename))
    return not (path.startswith(_LIBRARIES) or path.startswith(_KEEL + os.sep))
