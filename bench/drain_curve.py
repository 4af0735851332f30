"""Case 4's curve: CPU busy while workers drain, commits per executed run, where it saturates.

Apart from bench/case_drain.py so that module stays readable.
"""

from __future__ import annotations

from bench.common import Databases, Settings, Summary
from bench.runners import KeelRunner, traffic_per_run


def workers(count: int) -> str:
    return f"{count} worker" + ("s" if count > 1 else "")


def cpu_times() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine so far, or None without psutil."""
    try:
        import psutil
    except ImportError:
        return None
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    total = sum(t)
    return total - idle, total


def busy_since(before: tuple[float, float] | None) -> float | None:
    after = cpu_times()
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def execution_commits(settings: Settings, dbs: Databases, url: str) -> float:
    """Durable commits per run that a worker makes executing a 5-step run (admission apart).

    Counted like case 1 (two untimed batches, bench/wire.py): admit and drain, minus admit
    alone. The admit-alone batches leave their runs queued; the caller drains nothing after.
    """
    small, large = 2, 2 + settings.count_runs

    def admit_and_drain(m: int, u: str) -> None:
        runner = KeelRunner(dbs, u)
        try:
            runner.batch("chain5", [{"n": 0}] * m)
        finally:
            runner.close()

    def admit(m: int, u: str) -> None:
        runner = KeelRunner(dbs, u)
        try:
            runner.submit("chain5", [{"n": 0}] * m)
        finally:
            runner.close()

    whole = traffic_per_run(url, admit_and_drain, small, large)
    return (whole - traffic_per_run(url, admit, small, large)).durable


def saturation(
    backend: str,
    rates: dict[int, Summary],
    cpu: dict[int, float],
    ceiling: float,
    grouped: float | None,
) -> str:
    """Where adding workers stops paying, read from the medians."""
    best = max(rates.values(), key=lambda s: s.median)
    # The first worker count within 10% of the best: more workers than that buy nothing here.
    knee = min(w for w, s in rates.items() if s.median >= 0.9 * best.median)
    busy = f", the machine's CPU {cpu[knee] * 100:.0f}% busy" if knee in cpu else ""
    more = max(rates)
    tail = f"; {more} workers give {rates[more].median:.1f} runs/s" if more != knee else ""
    return (
        f"{backend}: Keel's drain saturates at {workers(knee)} ({rates[knee].median:.1f} "
        f"runs/s{busy}){tail}. The database alone, one durable commit at a time, would allow "
        f"{ceiling:.0f} runs/s"
        + (f"; committing concurrently, {grouped:.0f} runs/s." if grouped else ".")
    )
