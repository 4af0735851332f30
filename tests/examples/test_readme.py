"""The README's quickstart is code that runs: its Python blocks, executed as written."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
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
            exec(
                compile(block, "README.md", "exec", dont_inherit=True), namespace
            )  # the asserts are the README's
    finally:
        app = namespace.get("app")
        if app is not None:
            app.close()  # type: ignore[attr-defined]
    assert (tmp_path / ".keel" / "keel.db").is_file()


def shell_commands() -> list[str]:
    """The quickstart's shell block, one command a line (continuations joined, comments cut)."""
    section = (ROOT / "README.md").read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    joined = block.replace("\\\n", " ")
    lines = [line.split("   #", 1)[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_the_readme_shell_quickstart_runs_as_printed(tmp_path: Path) -> None:
    """`myagent.py` is the README's first block; each command runs as printed, the run id it
    names (`ticket-4711-1c0f...`) being the one `keel submit` said."""
    (tmp_path / "myagent.py").write_text(quickstart_blocks()[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    run_id = ""
    outputs = []
    for command in shell_commands():
        argv = shlex.split(command.replace("ticket-4711-1c0f...", run_id))
        assert argv[0] == "keel", command
        done = subprocess.run(
            [sys.executable, "-m", "keel", *argv[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        said = done.stdout + done.stderr
        assert done.returncode == 0, f"{command}\n{said}"
        outputs.append(said)
        if argv[1] == "submit":
            found = re.search(r"admitted run (\S+)", said)
            assert found, said
            run_id = found.group(1)
    assert [c.split()[1] for c in shell_commands()] == [
        "migrate", "submit", "worker", "approvals", "approve", "worker", "runs",
    ]  # fmt: skip
    assert "manager" in outputs[3]  # the approval was listed
    shown = " ".join(outputs[-1].split())
    assert "completed" in shown and "approved" in shown
    assert "send_email" in shown and "sent" in shown  # the effect, once, in the ledger
