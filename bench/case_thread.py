"""Case 12: long threads. A chat of many turns on one thread: does a step cost more late on?

A turn is one run of a one-node chat graph on the same thread: the user's message goes in
through `add_messages`, the node appends a reply, so turn k starts from a state of 2(k-1)
messages and every checkpoint of it carries them all (LangGraph stores a channel's value whole
each time it changes). Keel and raw LangGraph (official async saver) take turns, one turn each
on their own thread, for all the turns; then the 200-turn threads are read back with
`get_state` and `get_history(limit=10)`.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from bench.common import (
    CaseResult,
    Databases,
    Loop,
    Settings,
    Summary,
    Table,
    Traffic,
    interleave,
    ratios,
)
from bench.runners import BenchError, KeelRunner, RawRunner, traffic_per_run

WORKFLOW = "chat"
USER_TEXT = "Could you look at the order I placed last week and tell me when it ships? " * 2
"""About 150 characters: a user's message of ordinary length (the reply echoes it)."""


class Chat(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]


def _reply(state: Chat) -> dict[str, Any]:
    last = state["messages"][-1]
    return {"messages": [{"role": "assistant", "content": f"Noted: {last.content}"}]}


def chat() -> StateGraph:
    g = StateGraph(Chat)
    g.add_node("reply", _reply)
    g.add_edge(START, "reply")
    g.add_edge("reply", END)
    return g


def user_turn(k: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"[{k}] {USER_TEXT}"}]}


# -- how much, and where it is read -------------------------------------------------------------


def plan(settings: Settings) -> tuple[int, tuple[int, ...], int, int, int]:
    """(turns, marks, window, read samples, warm-up turns): the issue's 200 turns read at
    turns 1, 50 and 200 over 5 neighbouring turns; quick mode a dozen."""
    if settings.quick:
        return 12, (1, 6, 12), 3, 3, 1
    return 200, (1, 50, 200), 5, 30, 3


def window(mark: int, turns: int, width: int) -> range:
    """The `width` turns around `mark` (1-based), kept inside 1..turns: 1-5, 48-52, 196-200."""
    first = max(1, min(mark - width // 2, turns - width + 1))
    return range(first, first + width)


def at(series: list[float], turns: range) -> list[float]:
    return [series[t - 1] for t in turns if t - 1 < len(series)]


# -- the contenders -------------------------------------------------------------------------------


class KeelThread(KeelRunner):
    """Turns of one Keel thread, each timed as case 1 times a run: from just before
    `app.submit(..., thread_id=...)` to the run's `finished_at`, executed by the standing
    in-process worker (so admission on the thread, the claim, the step and completion are in)."""

    def __init__(self, dbs: Databases, url: str) -> None:
        super().__init__(dbs, url)
        self.app.workflow(WORKFLOW)(chat)

    def turn(self, thread_id: str, item: Any) -> float:
        ended = self._ended()
        start = time.time()
        # No job id (a chat's turns have none): the turn is the newest run of the thread's job.
        run = self.app.submit(WORKFLOW, item, thread_id=thread_id)
        row = self._wait(run.job_id, "completed", ended)
        if row["run_id"] != run.run_id:
            raise BenchError(f"turn {run.run_id} of {thread_id}: found run {row['run_id']}")
        return float(row["finished_at"]) - start


class RawThread:
    """Turns of one raw LangGraph thread: `ainvoke(input, config, durability="sync")` on the
    official async saver, the same thread id every turn."""

    def __init__(self, loop: Loop, url: str) -> None:
        self.runner = RawRunner(loop, url)
        self.loop = loop
        self.graph = self.runner.graph(chat)

    @staticmethod
    def config(thread_id: str) -> dict[str, Any]:
        return {"configurable": {"thread_id": thread_id}}

    def turn(self, thread_id: str, item: Any) -> float:
        start = time.perf_counter()
        self.loop.run(self.graph.ainvoke(item, self.config(thread_id), durability="sync"))
        return time.perf_counter() - start

    def get_state(self, thread_id: str) -> Any:
        return self.loop.run(self.graph.aget_state(self.config(thread_id)))

    def get_history(self, thread_id: str, limit: int) -> list[Any]:
        async def read() -> list[Any]:
            config = self.config(thread_id)
            return [s async for s in self.graph.aget_state_history(config, limit=limit)]

        return self.loop.run(read())

    def close(self) -> None:
        self.runner.close()


def _timed(fn: Callable[[], Any], check: Callable[[Any], bool], what: str) -> float:
    start = time.perf_counter()
    value = fn()
    elapsed = time.perf_counter() - start
    if not check(value):
        raise BenchError(f"{what} read back something unexpected: {value!r:.300}")
    return elapsed


def _state_bytes(snapshot: Any) -> int:
    """Bytes of the messages channel as the savers serialize it (once per checkpoint)."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    return len(JsonPlusSerializer().dumps_typed(snapshot.values["messages"])[1])


# -- the case -------------------------------------------------------------------------------------


def run(settings: Settings, dbs: Databases) -> CaseResult:
    turns, marks, width, reads, warm = plan(settings)
    spans = [window(m, turns, width) for m in marks]
    span_text = ", ".join(f"{s[0]}-{s[-1]}" for s in spans)
    result = CaseResult(
        "thread",
        "12. Long threads",
        f"A chat graph (one node; a `messages` channel with `add_messages`; the user's message "
        f"is ~{len(USER_TEXT)} characters and the node appends a reply of about the same "
        f"size) for {turns} turns on one thread. Each round is one turn of Keel's thread and "
        "one of raw LangGraph's, in turn (A B, then B A), so both threads grow together. "
        "Keel: `app.submit(input, thread_id=...)`, executed by a standing in-process worker "
        "at concurrency 1, timed from just before `submit` to the run's `finished_at` (as in "
        'case 1). Raw LangGraph: `ainvoke(input, config, durability="sync")` on the official '
        "async saver with the same thread id every turn. A turn is one run of one step, so "
        f"ms/step = ms/turn. Figures at turn {', '.join(map(str, marks))} are medians (min-max) "
        f"over turns {span_text}; Keel/raw is the median of the per-turn ratios there. Each "
        f"contender first runs {warm} unmeasured turn(s) on another thread. Then, with "
        f"the worker stopped, the {turns}-turn threads are read back {reads} times each, "
        "interleaved: Keel's `app.get_state` / `app.get_history(limit=10)` (the sync App) "
        "against the compiled graph's `aget_state` / `aget_state_history(limit=10)` on the "
        "official saver. Last, database traffic per turn is counted (bench/wire.py, untimed "
        f"batches of 2 and {2 + settings.count_runs} turns) on a new thread and on the long "
        "one.",
    )
    rows: list[list[str]] = []
    read_rows: list[list[str]] = []
    traffic_rows: list[list[str]] = []
    for backend in settings.backends:
        found = _one_backend(settings, dbs, backend, turns, reads, warm)
        ms = found["ms"]
        at_mark = {
            who: [Summary.of(at(ms[who], span)) for span in spans] for who in ("raw", "keel")
        }
        per_mark_ratio = [ratios(at(ms["keel"], s), at(ms["raw"], s)) for s in spans]
        growth = {who: at_mark[who][-1].median / at_mark[who][0].median for who in ("raw", "keel")}
        for who, label in (("raw", "raw LangGraph"), ("keel", "Keel")):
            rows.append(
                [
                    backend,
                    label,
                    *(s.fmt(2) for s in at_mark[who]),
                    f"{growth[who]:.2f}",
                    *((r.fmt(2) for r in per_mark_ratio) if who == "keel" else [""] * len(spans)),
                ]
            )
        reads_ms = found["reads"]
        read_rows.append(
            [
                backend,
                reads_ms["raw_state"].fmt(2),
                reads_ms["keel_state"].fmt(2),
                reads_ms["raw_history"].fmt(2),
                reads_ms["keel_history"].fmt(2),
                f"{found['state_bytes'] / 1e3:,.0f}",
                f"{found['grew']['raw'] / 1e6:,.1f}",
                f"{found['grew']['keel'] / 1e6:,.1f}",
            ]
        )
        for who, label in (("raw", "raw LangGraph"), ("keel", "Keel")):
            traffic_rows.append(
                [backend, label, *(_traffic(found["traffic"][where][who]) for where in PLACES)]
            )
        result.data[f"{backend}.turns"] = ms
        result.figures[f"{backend}.thread_keel_growth"] = growth["keel"]
        result.figures[f"{backend}.thread_raw_growth"] = growth["raw"]
        for mark, r in zip(marks, per_mark_ratio, strict=True):
            result.figures[f"{backend}.thread_keel_raw_{mark}"] = r.median
        for name, summary in reads_ms.items():
            result.figures[f"{backend}.thread_{name}_ms"] = summary.median

    result.tables.append(
        Table(
            f"ms per step by turn, one {turns}-turn thread",
            [
                "backend",
                "contender",
                *(f"ms/step at turn {m}" for m in marks),
                f"turn {marks[-1]} / turn 1",
                *(f"Keel/raw at {m}" for m in marks),
            ],
            rows,
            f"Medians (min-max) over turns {span_text}; a turn is one run of one step.",
        )
    )
    result.tables.append(
        Table(
            f"Reading a {turns}-turn thread back (ms), and what the thread wrote",
            [
                "backend",
                "raw aget_state",
                "Keel get_state",
                "raw aget_state_history(10)",
                "Keel get_history(limit=10)",
                "messages channel KB",
                "raw database MB",
                "Keel database MB",
            ],
            read_rows,
            f"Medians (min-max) of {reads} reads each, interleaved, with no worker running. "
            "Messages channel: the thread's messages as the savers serialize them, the bytes "
            f"each checkpoint of the last turn rewrites. Database MB: growth over the {turns} "
            "turns (and the warm-up), measured as case 6 measures it.",
        )
    )
    n = settings.count_runs
    result.tables.append(
        Table(
            "Database traffic per turn",
            ["backend", "contender", *PLACES],
            traffic_rows,
            "Counted as in case 1 (bench/wire.py): the difference between batches of 2 and "
            f"{n + 2} turns, per turn; each batch of the first column on a thread of its own, "
            f"those of the second on the long thread, after its {turns} measured turns. "
            "SQLite: statements and durable "
            "commits; PostgreSQL: round trips and transactions (those that wrote).",
        )
    )
    result.tables.append(targets(result, marks))
    return result


PLACES = ("on a new thread", "on the long thread")


def _one_backend(
    settings: Settings, dbs: Databases, backend: str, turns: int, reads: int, warm: int
) -> dict[str, Any]:
    """Turns, reads and traffic of both contenders on one backend (see `run`)."""
    loop = Loop()
    raw_url = dbs.new(backend, "thread_raw")
    keel_url = dbs.keel(backend, "thread_keel")
    raw = RawThread(loop, raw_url)
    k = KeelThread(dbs, keel_url)
    before = {"raw": dbs.size(raw_url), "keel": dbs.size(keel_url)}
    tid = f"chat-{uuid.uuid4().hex[:8]}"
    expect = 2 * turns

    def whole(s: Any) -> bool:
        return len(s.values.get("messages", [])) == expect

    def ten(h: list[Any]) -> bool:
        # A turn writes three checkpoints (its input's, `__start__`'s, its step's).
        return len(h) == min(10, 3 * turns)

    try:
        k.start_worker()
        for i in range(warm):
            raw.turn(f"warm-{tid}", user_turn(i + 1))
            k.turn(f"warm-{tid}", user_turn(i + 1))
        series = interleave(
            {
                "raw": lambda r: raw.turn(tid, user_turn(r + 1)),
                "keel": lambda r: k.turn(tid, user_turn(r + 1)),
            },
            turns,
            warmup=0,
        )
        k.stop_worker()
        reads_of = interleave(
            {
                "keel_state": lambda r: _timed(
                    lambda: k.app.get_state(tid), whole, "Keel get_state"
                ),
                "raw_state": lambda r: _timed(lambda: raw.get_state(tid), whole, "raw aget_state"),
                "keel_history": lambda r: _timed(
                    lambda: k.app.get_history(tid, limit=10), ten, "Keel get_history"
                ),
                "raw_history": lambda r: _timed(
                    lambda: raw.get_history(tid, 10), ten, "raw aget_state_history"
                ),
            },
            reads,
            warmup=1,
        )
        keel_state = k.app.get_state(tid)
        raw_state = raw.get_state(tid)
        runs = len(k.app.thread_runs(tid))
    finally:
        raw.close()
        k.close()
    if runs != turns or not whole(keel_state) or not whole(raw_state):
        loop.close()
        raise BenchError(
            f"after {turns} turns: Keel's thread has {runs} runs and "
            f"{len(keel_state.values['messages'])} messages, raw's "
            f"{len(raw_state.values['messages'])} (expected {expect})"
        )
    grew = {"raw": dbs.size(raw_url) - before["raw"], "keel": dbs.size(keel_url) - before["keel"]}
    try:
        traffic = {
            PLACES[0]: _count(settings, dbs, loop, raw_url, keel_url, None),
            PLACES[1]: _count(settings, dbs, loop, raw_url, keel_url, tid),
        }
    finally:
        loop.close()
    dbs.drop(raw_url)
    dbs.drop(keel_url)
    return {
        "ms": {who: [v * 1e3 for v in values] for who, values in series.items()},
        "reads": {name: Summary.of([v * 1e3 for v in vals]) for name, vals in reads_of.items()},
        "state_bytes": _state_bytes(keel_state),
        "grew": grew,
        "traffic": traffic,
    }


def _count(
    settings: Settings,
    dbs: Databases,
    loop: Loop,
    raw_url: str,
    keel_url: str,
    thread: str | None,
) -> dict[str, Traffic]:
    """Traffic per turn of each contender on `thread` (its next turns), in untimed batches;
    None: each batch on a new thread, so both batches have a first turn and it cancels out."""

    def raw_turns(n: int, url: str) -> None:
        runner = RawThread(loop, url)
        on = thread or f"count-{uuid.uuid4().hex[:8]}"
        try:
            for i in range(n):
                runner.turn(on, user_turn(i))
        finally:
            runner.close()

    def keel_turns(n: int, url: str) -> None:
        runner = KeelThread(dbs, url)
        on = thread or f"count-{uuid.uuid4().hex[:8]}"
        try:
            for i in range(n):
                runner.app.submit(WORKFLOW, user_turn(i), thread_id=on)
            runner.drain(n)
        finally:
            runner.close()

    small, large = 2, 2 + settings.count_runs
    return {
        "raw": traffic_per_run(raw_url, raw_turns, small, large),
        "keel": traffic_per_run(keel_url, keel_turns, small, large),
    }


def _traffic(t: Traffic) -> str:
    if t.backend == "sqlite":
        return f"{t.get('statements'):.1f} statements, {t.durable:.1f} durable commits"
    return (
        f"{t.get('round_trips'):.1f} round trips, "
        f"{t.get('transactions'):.1f} transactions ({t.durable:.1f} wrote)"
    )


def targets(result: CaseResult, marks: tuple[int, ...]) -> Table:
    """The issue's bounds, judged on this run's figures as shown (2 decimals)."""
    rows = []

    def judge(label: str, key: str, ok: Callable[[float], bool], backends: tuple[str, ...]) -> None:
        cells, verdicts = [], []
        for b in ("sqlite", "postgres"):
            v = result.figures.get(f"{b}.{key}")
            cells.append("n/a" if v is None else f"{v:.2f}")
            if v is not None and b in backends:
                verdicts.append(f"{b}: {'met' if ok(round(v, 2)) else '**not met**'}")
        rows.append([label, *cells, "; ".join(verdicts) or "n/a"])

    both = ("sqlite", "postgres")
    last = marks[-1]
    judge(f"Keel turn-{last} step ≤ 1.2x its turn-1 step", "thread_keel_growth", _le(1.2), both)
    for m in marks:
        judge(f"Keel/raw at turn {m} ≤ 1.0", f"thread_keel_raw_{m}", _le(1.0), both)
    judge(f"Keel get_state on a {last}-turn thread < 20 ms (PostgreSQL)",
          "thread_keel_state_ms", lambda v: v < 20, ("postgres",))  # fmt: skip
    judge(f"Keel get_history(limit=10) on a {last}-turn thread < 20 ms (PostgreSQL)",
          "thread_keel_history_ms", lambda v: v < 20, ("postgres",))  # fmt: skip
    return Table(
        "Targets (issue 31)",
        ["target", "SQLite", "PostgreSQL", "status"],
        rows,
        "Ratios are medians over the turns' windows; read times are medians in ms.",
    )


def _le(limit: float) -> Callable[[float], bool]:
    return lambda v: v <= limit


# -- plot -----------------------------------------------------------------------------------------


def plot(ax: Any, result: CaseResult, span: int = 5) -> None:
    """ms per turn along the thread, a running median of `span` turns (one slow turn, a
    neighbour's disk flush, is not the trend), per backend and contender (plots.draw calls it)."""
    for key, ms in sorted(result.data.items()):
        if not key.endswith(".turns"):
            continue
        backend = key.split(".")[0]
        for who, style in (("raw", "--"), ("keel", "-")):
            values = ms[who]
            smooth = [
                statistics.median(values[max(0, i - span // 2) : i + span // 2 + 1])
                for i in range(len(values))
            ]
            label = f"{backend} {'Keel' if who == 'keel' else 'raw LangGraph'}"
            ax.plot(range(1, len(values) + 1), smooth, style, linewidth=1.2, label=label)
    ax.set_xlabel("turn on the thread")
    ax.set_ylabel(f"ms per step, running median of {span} turns")
    ax.set_ylim(bottom=0)
    ax.set_title("Step cost along one long thread (one step per turn)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
