"""PNG plots for docs/benchmarks/ (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import plots_curves
from bench.common import CaseResult, Summary

BACKENDS = ("sqlite", "postgres")


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(ax: Any, groups: list[str], series: dict[str, list[Summary | None]], ylabel: str) -> None:
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs, ys, lo, hi = [], [], [], []
        for g, s in enumerate(values):
            if s is None or s.n == 0:
                continue
            xs.append(g + (i - (len(series) - 1) / 2) * width)
            ys.append(s.median)
            lo.append(s.median - s.lo)
            hi.append(s.hi - s.median)
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=label)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def draw(results: dict[str, CaseResult], folder: Path) -> dict[str, list[tuple[str, str]]]:
    plt = _plt()
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, list[tuple[str, str]]] = {}

    def save(fig: Any, case: str, name: str, caption: str) -> None:
        fig.tight_layout()
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        out.setdefault(case, []).append((name, caption))

    backends = [
        b for b in BACKENDS if any(k.startswith(b) for r in results.values() for k in r.data)
    ]

    if step := results.get("step"):
        fig, ax = plt.subplots(figsize=(7, 4))
        names = {"none": "no checkpointer", "raw": "raw LangGraph (sync)", "keel": "Keel"}
        _bars(
            ax,
            backends,
            {label: [step.data.get(f"{b}.{k}") for b in backends] for k, label in names.items()},
            "ms per 5-step run (median, min-max)",
        )
        ax.set_title("Per run: 5-node chain")
        save(fig, "step", "per_step.png", "ms per 5-node run, by backend")

    if shape := results.get("shape"):
        keys = {"chain5": "5-node chain", "chain20": "20-node chain", "fanout4": "4-way fan-out"}
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        _bars(
            left,
            list(keys.values()),
            {
                f"{b} {label}": [(shape.data.get(f"{b}.{k}") or {}).get(who) for k in keys]
                for b in backends
                for who, label in (("raw", "raw"), ("keel", "Keel"))
            },
            "ms per run (median, min-max)",
        )
        left.set_title("Time per run by shape")
        counted = {
            "SQLite durable commits": ("sqlite", "durable"),
            "PG round trips": ("postgres", "round_trips"),
        }
        series: dict[str, list[Summary | None]] = {}
        for label, (b, name) in counted.items():
            for who, who_label in (("raw", "raw"), ("keel", "Keel")):
                values = [shape.figures.get(f"{b}.{k}_{who}_{name}") for k in keys]
                if any(v is not None for v in values):
                    series[f"{label}, {who_label}"] = [
                        None if v is None else Summary(v, v, v, 1) for v in values
                    ]
        _bars(right, list(keys.values()), series, "per run (counted)")
        right.set_title("Database traffic per run by shape")
        save(fig, "shape", "shape.png", "time and database traffic per run by graph shape")

    if approval := results.get("approval"):
        fig, ax = plt.subplots(figsize=(6, 4))
        names = {"raw": "raw interrupt/resume", "keel": "Keel approval"}
        _bars(
            ax,
            backends,
            {
                label: [approval.data.get(f"{b}.{k}") for b in backends]
                for k, label in names.items()
            },
            "ms per approval cycle",
        )
        ax.set_title("Approval cycle")
        save(fig, "approval", "approval.png", "ms per approval cycle")

    if takeover := results.get("takeover"):
        fig, ax = plt.subplots(figsize=(6, 4))
        data = [(b, takeover.data[b]) for b in backends if takeover.data.get(b)]
        if data:
            ax.boxplot([d for _, d in data], tick_labels=[b for b, _ in data])
            ttl = takeover.figures.get("ttl")
            if ttl:
                ax.axhline(ttl, color="red", linestyle="--", label=f"lease TTL {ttl:g} s")
                ax.axhline(ttl + 0.5, color="orange", linestyle=":", label="TTL + 0.5 s")
                ax.legend(fontsize=8)
            ax.set_ylabel("s from SIGKILL to lease.takeover")
            ax.set_title("Takeover latency")
            ax.grid(axis="y", alpha=0.3)
            save(fig, "takeover", "takeover.png", "takeover latency after SIGKILL")
        else:
            plt.close(fig)

    if state := results.get("state"):
        fig, ax = plt.subplots(figsize=(7, 4))
        for b in backends:
            sizes = sorted(int(k.split(".")[1]) for k in state.data if k.startswith(b + "."))
            for who, style in (("raw", "--"), ("keel", "-")):
                ys = [state.data[f"{b}.{s}"][who].median for s in sizes]
                ax.plot(sizes, ys, style, marker="o", color=plots_curves.COLOURS[b],
                        label=f"{b} {'Keel' if who == 'keel' else 'raw'}")  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("state size (bytes)")
        ax.set_ylabel("ms per step (median)")
        ax.set_title("Per-step cost as the state grows")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        save(fig, "state", "state.png", "ms per step by state size")

    if memory := results.get("memory"):
        fig, ax = plt.subplots(figsize=(7, 4))
        for b in backends:
            # Samples before the first completed run show the interpreter still starting.
            samples = [s for s in memory.data.get(b) or [] if s[0] > 0]
            if samples:
                ax.plot([s[0] for s in samples], [s[1] / 2**20 for s in samples], label=b)
        ax.set_xlabel("runs completed")
        ax.set_ylabel("worker RSS (MiB)")
        ax.set_title("Worker memory over runs")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        save(fig, "memory", "memory.png", "worker RSS over completed runs")

    # Issue 34's curves (fan-out width, drain by workers, drain ratio, worker footprint).
    plots_curves.draw(plt, results, backends, save)

    if thread := results.get("thread"):
        from bench.case_thread import plot

        fig, ax = plt.subplots(figsize=(7, 4))
        plot(ax, thread)
        save(fig, "thread", "thread.png", "ms per step along one long thread")

    return out
