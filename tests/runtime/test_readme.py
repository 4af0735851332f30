"""The README's quickstart is code that runs: its Python blocks, executed as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def quickstart_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readme_quickstart_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = quickstart_blocks()
    assert len(blocks) == 2, "the app, then its use from Python"
    monkeypatch.chdir(tmp_path)  # keel.App()'s default database: .keel/keel.db, here
    for name in ("KEEL_DATABASE_URL", "KEEL_ARTIFACTS_DIR", "KEEL_LEASE_TTL"):
        monkeypatch.delenv(name, raising=False)
    namespace: dict[str, object] = {"__name__": "quickstart"}
    try:
        for block in blocks:
            exec(compile(block, "README.md", "exec"), namespace)  # the asserts are the README's
    finally:
        app = namespace.get("app")
        if app is not None:
            app.close()  # type: ignore[attr-defined]
    assert (tmp_path / ".keel" / "keel.db").is_file()
