"""Issue 34's cost curves as plots: fan-out width, drain by workers, drain ratio, footprint.

Called by bench.plots.draw with its `save`; kept apart so plots.py stays short.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.common import CaseResult, Summary

Save = Callable[[Any, str, str, str], None]
# One colour per backend; raw LangGraph (or DBOS) dashed beside Keel's solid line.
COLOURS = {"sqlite": "tab:blue", "postgres": "tab:red"}


def draw(plt: Any, results: dict[str, CaseResult], backends: list[str], save: Save) -> None:
    if fanout := results.get("fanout"):
        _fanout(plt, fanout, backends, save)
    if drain := results.get("drain"):
        _drain(plt, drain, backends, save)
    if ratio := results.get("drain-ratio"):
        _drain_ratio(plt, ratio, backends, save)
    if memory := results.get("memory"):
        _footprint(plt, memory, backends, save)


def _errors(values: list[Summary]) -> list[list[float]]:
    return [[s.median - s.lo for s in values], [s.hi - s.median for s in values]]


def _fanout(plt: Any, res: CaseResult, backends: list[str], save: Save) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for b in backends:
        widths = sorted(int(k.split(".")[1]) for k in res.data if k.startswith(b + "."))
        for who, style, label in (("raw", "--", "raw"), ("keel", "-", "Keel")):
            ys = [res.data[f"{b}.{w}"][who] for w in widths]
            left.errorbar(
                widths,
                [s.median for s in ys],
                yerr=_errors(ys),
                fmt=style,
                marker="o",
                capsize=3,
                color=COLOURS[b],
                label=f"{b} {label}",
            )
            key = "durable"
            counts = [res.figures.get(f"{b}.fanout{w}_{who}_{key}") for w in widths]
            if all(c is not None for c in counts):
                right.plot(
                    widths, counts, style, marker="o", color=COLOURS[b], label=f"{b} {label}"
                )
    widths = sorted({int(k.split(".")[1]) for k in res.data if "." in k})
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.set_xlabel("fan-out width W (Send tasks)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    left.set_ylabel("ms per run (median, min-max)")
    left.set_title("Time per run by fan-out width")
    right.set_ylabel("durable commits per run (counted)")
    right.set_title("Writing commits/transactions per run")
    save(fig, "fanout", "fanout.png", "time and durable commits per run by Send fan-out width")


def _drain(plt: Any, res: CaseResult, backends: list[str], save: Save) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for b in backends:
        curve = res.data.get(f"{b}.curve")
        if not curve:
            continue
        for who, style in (("Keel", "-"), ("DBOS", "--")):
            points: dict[int, Summary] = curve.get(who) or {}
            if points:
                xs = sorted(points)
                ys = [points[x] for x in xs]
                ax.errorbar(
                    xs,
                    [s.median for s in ys],
                    yerr=_errors(ys),
                    fmt=style,
                    marker="o",
                    capsize=3,
                    color=COLOURS[b],
                    label=f"{b} {who}",
                )
                drawn = True
        grouped = curve.get("ceiling_parallel")
        if grouped and grouped == grouped:
            ax.axhline(
                grouped,
                color=COLOURS[b],
                linestyle="-.",
                label=f"{b}: database alone, commits at once",
            )
        ceiling = curve.get("ceiling")
        if ceiling and ceiling == ceiling:
            ax.axhline(
                ceiling,
                color=COLOURS[b],
                linestyle=":",
                label=f"{b}: database alone, 1 commit at a time",
            )
    if not drawn:
        plt.close(fig)
        return
    ax.set_xlabel("worker processes (8 concurrent runs each)")
    ax.set_ylabel("runs/s (median, min-max)")
    # The concurrent-commit line sits far above the drains: a log axis keeps both readable.
    ax.set_yscale("log")
    ax.set_xticks(
        sorted({w for b in backends for w in (res.data.get(f"{b}.curve") or {}).get("Keel", {})})
    )
    ax.set_title("Drain throughput by worker processes")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, "drain", "drain.png", "drain throughput by worker processes, with the database's")


def _drain_ratio(plt: Any, res: CaseResult, backends: list[str], save: Save) -> None:
    from bench.plots import _bars

    names = sorted({k.split(".", 1)[1] for k in res.data if "." in k} - {"raw"})
    series = {"raw LangGraph": [res.data.get(f"{b}.raw") for b in backends]}
    for name in names:
        label = "Keel `keel worker`" if name == "keel" else f"Keel `{name}`"
        series[label] = [res.data.get(f"{b}.{name}") for b in backends]
    scaled = {k: [None if s is None else s.scaled(1e3) for s in v] for k, v in series.items()}
    fig, ax = plt.subplots(figsize=(7, 4))
    _bars(ax, backends, scaled, "ms per run (median, min-max)")
    for i, b in enumerate(backends):
        ratio = res.figures.get(f"{b}.drain_ratio")
        if ratio is not None:
            ax.annotate(
                f"Keel/raw {ratio:.2f}",
                (i, 0),
                xytext=(0, -28),
                fontsize=8,
                textcoords="offset points",
                ha="center",
            )
    ax.set_title("A backlog drained: `keel worker` against raw LangGraph")
    save(fig, "drain-ratio", "drain_ratio.png", "ms per run draining a backlog, Keel and raw")


def _footprint(plt: Any, res: CaseResult, backends: list[str], save: Save) -> None:
    found = {b: res.data.get(f"{b}.footprint") for b in backends}
    if not any(found.values()):
        return
    from bench.plots import _bars

    inflight, waiting = res.data.get("footprint_sizes", (0, 0))
    labels = {
        "idle": "idle",
        "inflight": f"{inflight} runs in flight",
        "after_waits": f"after driving {waiting:,} runs to their wait",
        "fresh_waiting": f"fresh worker, {waiting:,} runs waiting",
    }
    series: dict[str, list[Summary | None]] = {
        label: [
            Summary(f[key] / 2**20, f[key] / 2**20, f[key] / 2**20, 1) if f else None
            for f in found.values()
        ]
        for key, label in labels.items()
    }
    fig, ax = plt.subplots(figsize=(7, 4))
    _bars(ax, backends, series, "worker RSS (MiB)")
    low = min(f["idle"] for f in found.values() if f) / 2**20
    # RSS differences of a few MiB on ~130 MiB: start the axis near the idle level.
    ax.set_ylim(bottom=max(0.0, low - 10))
    ax.set_title("Worker footprint")
    save(fig, "memory", "footprint.png", "worker RSS idle, with runs in flight, with runs waiting")
