"""Artifacts written from inside runs: each run its own folder, whole files, listed back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import keel
from tests.support.graphs import echo_graph
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


def report(state: dict[str, Any]) -> dict[str, Any]:
    folder = keel.artifacts()
    folder.write_text("newsletter.md", f"# {state['text']}\n")
    folder.write_json("report.json", {"title": state["text"]})
    return {"out": str(folder.folder)}


def test_each_run_writes_whole_artifacts_in_its_own_folder(
    make_app: AppFactory, tmp_path: Path
) -> None:
    app = make_app()
    app.workflow("report")(lambda: echo_graph(report))  # type: ignore[arg-type]
    ids = [
        app.submit("report", job_id=f"nl-{n}", input={"text": title})["run_id"]
        for n, title in enumerate(["AI Signals", "Databases"])
    ]
    drain(app)
    root = (tmp_path / "artifacts").resolve()
    folders = []
    for run, title in zip(ids, ["AI Signals", "Databases"], strict=True):
        details = app.get_run(run)
        assert details.status == "completed"
        folder = Path(details.output["out"])
        folders.append(folder)
        assert folder == root / run
        assert sorted(a.name for a in details.artifacts) == ["newsletter.md", "report.json"]
        assert (folder / "newsletter.md").read_text() == f"# {title}\n"
        assert sorted(p.name for p in folder.iterdir()) == ["newsletter.md", "report.json"]
    assert folders[0] != folders[1]
    assert {p.parent for p in root.rglob("*") if p.is_file()} == set(folders)


def test_artifacts_from_a_replayed_node_overwrite_whole(make_app: AppFactory) -> None:
    """A node re-run after an approval rewrites its artifact; the file is the last whole one."""

    def draft(state: dict[str, Any]) -> dict[str, Any]:
        keel.artifacts().write_text("draft.md", "x" * 100_000)
        decision = keel.approval("editor")
        return {"out": decision.decision}

    app = make_app()
    app.workflow("draft")(lambda: echo_graph(draft))  # type: ignore[arg-type]
    run = app.submit("draft", job_id="d-1", input={})["run_id"]
    drain(app)
    app.approve(run, by="ed")
    drain(app)
    details = app.get_run(run)
    assert details.output["out"] == "approved"
    [artifact] = details.artifacts
    assert (artifact.name, artifact.size) == ("draft.md", 100_000)
    assert sorted(p.name for p in artifact.path.parent.iterdir()) == ["draft.md"]
