"""The README's threads example is code that runs: executed as written, on a fresh SQLite file,
its turns executed by the in-process worker it starts, printing what its `# ->` comments say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

import keel

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Conversations: threads"


def threads_block() -> str:
    text = (ROOT / "README.md").read_text()
    assert SECTION in text, f"README.md has no {SECTION!r} section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return block


def promised_output(block: str) -> list[str]:
    """What the block says it prints: each `# -> text` comment, in order."""
    return [m.strip() for m in re.findall(r"#\s*->\s*(.*)$", block, flags=re.M)]


def test_the_readme_threads_example_runs_and_prints_what_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = threads_block()
    promised = promised_output(block)
    assert promised == ["interrupted", "6 echo: yes"]
    monkeypatch.chdir(tmp_path)  # keel.App()'s default database: .keel/keel.db, here
    for name in ("KEEL_DATABASE_URL", "KEEL_ARTIFACTS_DIR", "KEEL_LEASE_TTL"):
        monkeypatch.delenv(name, raising=False)
    namespace: dict[str, object] = {"__name__": "readme_threads"}
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(block, "README.md", "exec", dont_inherit=True), namespace)
    finally:
        app = namespace.get("app")
        if isinstance(app, keel.App):
            app.close()
    assert printed.getvalue().splitlines() == promised

    # What the example left in its database, read by another App: one thread, four executions
    # of three runs (the last run waited, then went on with the answer), nothing unfinished.
    database = tmp_path / ".keel" / "keel.db"
    assert database.is_file()
    with keel.App(f"sqlite:///{database}") as reader:
        reader.workflow("chat")(namespace["chat"])  # state is read through the graph
        thread = reader.get_thread("user-42")
        assert (thread["workflow"], thread["status"], thread["runs"]) == ("chat", "idle", 3)
        runs = reader.thread_runs("user-42")
        assert [(r["thread_seq"], r["status"]) for r in runs] == [
            (1, "completed"),
            (2, "completed"),
            (3, "completed"),
        ]
        [wait] = reader.get_run(runs[2]["run_id"]).waits
        assert (wait["kind"], wait["status"]) == ("interrupt", "decided")
        contents = [m.content for m in reader.get_state("user-42").values["messages"]]
        assert contents == [
            "hi",
            "echo: hi",
            "how are you?",
            "echo: how are you?",
            "delete my account",
            "echo: yes",
        ]
