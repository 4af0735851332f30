"""What every case shares: settings, statistics, interleaving, databases and commit counters."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg

import keel
from bench.graphs import register

T = TypeVar("T")
PG_URL = os.environ.get("KEEL_BENCH_POSTGRES_URL", "postgresql://keel:keel@127.0.0.1:5432/keel")
REPO = Path(__file__).resolve().parent.parent
BACKENDS = ("sqlite", "postgres")


@dataclass
class Settings:
    """How much of each case to run: the full run, or `--quick` for a smoke test."""

    quick: bool = False
    backends: tuple[str, ...] = BACKENDS
    rounds: int = 7  # measured rounds of the floor, after one warm-up round
    samples: int = 80  # runs per contender, one per round, in the per-run cases
    warmup: int = 3  # rounds not counted at the start of the per-run cases
    count_runs: int = 12  # extra runs of the larger batch when counting commits
    drain_runs: int = 500
    drain_rounds: dict[str, int] = field(default_factory=lambda: {"sqlite": 2, "postgres": 2})
    # Keel worker processes per drain (issue 34's curve: 1, 2, 4 on PostgreSQL).
    drain_workers: dict[str, tuple[int, ...]] = field(
        default_factory=lambda: {"sqlite": (1, 2), "postgres": (1, 2, 4)}
    )
    drain_ratio_runs: int = 200
    drain_ratio_rounds: int = 3
    drain_ratio_count: tuple[int, int] = (10, 50)
    accumulate_levels: dict[str, tuple[int, int]] = field(
        default_factory=lambda: {
            "1k finished": (1_000, 0),
            "10k finished": (10_000, 0),
            "100k finished": (100_000, 0),
            "1k waiting": (0, 1_000),
            "10k waiting": (0, 10_000),
        }
    )
    accumulate_rounds: int = 40
    takeover_rounds: int = 3
    takeover_runs: int = 8
    lease_ttl: float = 2.0
    state_sizes: tuple[int, ...] = (1_000, 100_000, 1_000_000)
    # Measured by case 6 only, with few rounds: a 10 MB state costs seconds per run, and case
    # 6b's stall mix (max of state_sizes) would take minutes with it.
    state_large: tuple[int, ...] = (10_000_000,)
    state_large_rounds: int = 3
    memory_runs: dict[str, int] = field(default_factory=lambda: {"sqlite": 2000, "postgres": 2000})
    floor_commits: int = 60
    memory_inflight: int = 100  # runs one worker holds in flight at once (its concurrency)
    memory_waiting: int = 1_000  # runs waiting for approval, for RSS per waiting run

    @classmethod
    def make(cls, quick: bool, backends: Sequence[str]) -> Settings:
        if not quick:
            return cls(backends=tuple(backends))
        return cls(
            quick=True,
            backends=tuple(backends),
            rounds=2,
            samples=4,
            warmup=1,
            count_runs=4,
            drain_runs=40,
            drain_rounds={"sqlite": 1, "postgres": 1},
            drain_ratio_runs=30,
            drain_ratio_rounds=1,
            drain_ratio_count=(4, 12),
            accumulate_levels={
                "200 finished": (200, 0),
                "1k finished": (1_000, 0),
                "200 waiting": (0, 200),
            },
            accumulate_rounds=3,
            takeover_rounds=1,
            takeover_runs=2,
            state_sizes=(1_000, 100_000),
            state_large=(),
            memory_runs={"sqlite": 60, "postgres": 60},
            floor_commits=20,
            memory_inflight=10,
            memory_waiting=50,
        )


# -- statistics ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        return cls(statistics.median(values), min(values), max(values), len(values))

    def scaled(self, factor: float) -> Summary:
        return Summary(self.median * factor, self.lo * factor, self.hi * factor, self.n)

    def fmt(self, digits: int = 2, unit: str = "") -> str:
        if self.n == 0:
            return "n/a"
        if self.n == 1 or self.lo == self.hi:
            return f"{self.median:.{digits}f}{unit}"
        return f"{self.median:.{digits}f}{unit} ({self.lo:.{digits}f}-{self.hi:.{digits}f})"


def ratios(a: Sequence[float], b: Sequence[float]) -> Summary:
    """Per-round ratios a/b of two interleaved series (round i of a ran next to round i of b)."""
    return Summary.of([x / y for x, y in zip(a, b, strict=False) if y > 0])


def interleave(
    variants: dict[str, Callable[[int], float]], rounds: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Run A B C, C B A, ... and keep each variant's measured rounds (after the warm-up).

    Each callable gets the round number and returns the figure it measured (e.g. s per run),
    or NaN if that sample failed (the case reports why).
    """
    results: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants.items())
    for r in range(warmup + rounds):
        # A B C, then C B A: whoever goes first does not always inherit the same disk state.
        for name, fn in order if r % 2 == 0 else order[::-1]:
            value = fn(r)
            if r >= warmup and value == value:  # a NaN marks a failed sample
                results[name].append(value)
    return results


# -- one event loop for raw LangGraph and DBOS-free async code --------------------------------


class Loop:
    """A private event loop driven from the main thread (Keel runs on its own, in a thread)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


# -- databases -----------------------------------------------------------------------------------


def pg_admin() -> psycopg.Connection[Any]:
    return psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)


def pg_url(dbname: str) -> str:
    base, _, _ = PG_URL.rpartition("/")
    return f"{base}/{dbname}"


def pg_dbname(url: str) -> str:
    return url.rpartition("/")[2].split("?")[0]


class Databases:
    """Fresh, empty databases for one bench run; all dropped (or deleted) at the end."""

    def __init__(self, tmp_root: str | None = None) -> None:
        # Next to the repository, not in a tmpfs /tmp: SQLite must pay for fsync like PostgreSQL.
        root = tmp_root or os.environ.get("KEEL_BENCH_TMP") or str(REPO / ".keel")
        Path(root).mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-", dir=root))
        self.tag = f"{os.getpid()}_{uuid.uuid4().hex[:4]}"
        self.created: list[str] = []
        self._admin: psycopg.Connection[Any] | None = None

    @property
    def admin(self) -> psycopg.Connection[Any]:
        if self._admin is None or self._admin.closed:
            self._admin = pg_admin()
        return self._admin

    def new(self, backend: str, label: str) -> str:
        """A URL to a new empty database (no Keel tables)."""
        safe = re.sub(r"[^a-z0-9_]", "_", label.lower())
        if backend == "sqlite":
            folder = self.tmp / safe
            folder.mkdir(parents=True, exist_ok=True)
            return f"sqlite:///{folder}/db.sqlite"
        name = f"keel_bench_{safe}_{self.tag}"[:63]
        self.admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.admin.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return pg_url(name)

    def keel(self, backend: str, label: str) -> str:
        """A URL to a new migrated Keel database."""
        url = self.new(backend, label)
        with keel.App(url, artifacts_dir=self.tmp / "artifacts") as app:
            app.migrate()
        return url

    def app(self, url: str, **kwargs: Any) -> keel.App:
        kwargs.setdefault("artifacts_dir", self.tmp / "artifacts")
        return register(keel.App(url, **kwargs))

    def sqlite_path(self, url: str) -> str:
        return url.removeprefix("sqlite:///")

    def size(self, url: str) -> int:
        """Bytes the database occupies (SQLite: after folding the WAL into the main file)."""
        if url.startswith("sqlite:"):
            import sqlite3

            path = self.sqlite_path(url)
            conn = sqlite3.connect(path)
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                pages = conn.execute("PRAGMA page_count").fetchone()[0]
                free = conn.execute("PRAGMA freelist_count").fetchone()[0]
                page = conn.execute("PRAGMA page_size").fetchone()[0]
            finally:
                conn.close()
            return int((pages - free) * page)
        row = self.admin.execute("SELECT pg_database_size(%s)", (pg_dbname(url),)).fetchone()
        return int(row[0]) if row else 0

    def _drop(self, name: str, tries: int = 1, report: bool = False) -> bool:
        for attempt in range(tries):
            try:
                self.admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except psycopg.Error as exc:
                # An autovacuum worker (not ours to terminate) may be on it: try again later.
                if attempt == tries - 1:
                    if report:
                        print(f"bench: could not drop database {name}: {exc}", file=sys.stderr)
                    return False
                time.sleep(1.0)
            else:
                if name in self.created:
                    self.created.remove(name)
                return True
        return False

    def drop(self, url: str) -> None:
        """Drop a database early to free space; if it is busy, close() tries again."""
        if url.startswith("postgresql:"):
            with suppress(psycopg.Error):
                self._drop(pg_dbname(url))

    def close(self) -> None:
        for name in list(self.created):
            with suppress(psycopg.Error):
                self._drop(name, tries=5, report=True)
        if self._admin is not None:
            self._admin.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


# -- database traffic ----------------------------------------------------------------------

TRAFFIC_KEYS = {
    "sqlite": ("statements", "commits", "durable"),
    "postgres": ("round_trips", "pool_checks", "transactions", "durable"),
}


@dataclass(frozen=True)
class Traffic:
    """What one client asked of its database, per run (bench.wire counts it exactly).

    SQLite: statements, commits, and `durable` commits (those whose transaction wrote, the ones
    that cost an fsync). PostgreSQL: round trips on the wire (of which `pool_checks`),
    transactions, and `durable` (writing) transactions.
    """

    backend: str
    values: dict[str, float]

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(self.backend, {k: v - other.values[k] for k, v in self.values.items()})

    def scaled(self, factor: float) -> Traffic:
        return Traffic(self.backend, {k: v * factor for k, v in self.values.items()})

    def get(self, key: str) -> float:
        return self.values.get(key, float("nan"))

    @property
    def durable(self) -> float:
        return self.get("durable")

    @classmethod
    def zero(cls, backend: str) -> Traffic:
        return cls(backend, dict.fromkeys(TRAFFIC_KEYS[backend], 0.0))

    def fmt_commits(self) -> str:
        """The commits column: SQLite's commits (writing), PostgreSQL's transactions (writing)."""
        total = self.get("commits" if self.backend == "sqlite" else "transactions")
        return f"{total:.1f} ({self.durable:.1f} wrote)"


@dataclass(frozen=True)
class PgCounters:
    xact_commit: int

    def __sub__(self, other: PgCounters) -> PgCounters:
        return PgCounters(self.xact_commit - other.xact_commit)


def pg_counters(dbs: Databases, url: str, settle: bool = True) -> PgCounters:
    """Committed transactions of one database (pg_stat_database.xact_commit).

    Backends report their statistics lazily (at exit or when idle, at most once a second), so
    the caller closes its connections first and this waits until the numbers stop moving.
    """
    name = pg_dbname(url)

    def read() -> PgCounters:
        dbs.admin.execute("SELECT pg_stat_clear_snapshot()")
        row = dbs.admin.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (name,)
        ).fetchone()
        return PgCounters(int(row[0] or 0) if row else 0)

    last = read()
    if not settle:
        return last
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = read()
        if now == last:
            break
        last = now
    return last


@contextmanager
def timed() -> Iterator[list[float]]:
    """`with timed() as t: ...` then t[0] is the elapsed wall time in seconds."""
    out: list[float] = []
    start = time.perf_counter()
    try:
        yield out
    finally:
        out.append(time.perf_counter() - start)


# -- results ---------------------------------------------------------------------------------


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclass
class CaseResult:
    key: str
    title: str
    method: str
    tables: list[Table] = field(default_factory=list)
    plots: list[tuple[str, str]] = field(default_factory=list)  # (file name, caption)
    notes: list[str] = field(default_factory=list)
    # Headline figures for the summary/targets, e.g. {"sqlite.keel_raw_ratio": 1.2}.
    figures: dict[str, float] = field(default_factory=dict)
    # Raw series, for plots.
    data: dict[str, Any] = field(default_factory=dict)
