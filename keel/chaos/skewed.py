"""`python -m keel.chaos.skewed SECONDS MODULE ARGS...`: `python -m MODULE ARGS...` in a process
whose wall clock is SECONDS ahead, as on a host whose NTP is broken (keel chaos --fault
clock-skew runs `keel worker` so).

The process's `time.time` is shifted before the module is imported, so everything Keel reads
from the worker's own clock is ahead; the database's clock and the monotonic clock (asyncio's
timers) are not.
"""

from __future__ import annotations

import runpy
import sys
import time


def skew(seconds: float) -> None:
    real_time, real_time_ns = time.time, time.time_ns
    offset_ns = int(seconds * 1e9)
    time.time = lambda: real_time() + seconds
    time.time_ns = lambda: real_time_ns() + offset_ns


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: python -m keel.chaos.skewed SECONDS MODULE [ARGS...]")
    try:
        seconds = float(argv[0])
    except ValueError:
        raise SystemExit(f"keel.chaos.skewed: SECONDS must be a number, not {argv[0]!r}") from None
    skew(seconds)
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
