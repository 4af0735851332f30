"""Keel is typed for its users: a project that installs the wheel gets keel's types, and a
wrong argument to an effect is a type error (the decorator keeps the function's signature)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

USER_CODE = textwrap.dedent(
    """
    from typing import Any

    import keel


    @keel.effect("send_email")
    def send_email(to: str, body: str, *, idempotency_key: str = keel.KEY) -> dict[str, Any]:
        return {"to": to}


    @keel.effect("charge")
    async def charge(cents: int, *, idempotency_key: str = keel.KEY) -> int:
        return cents


    def send(state: dict[str, Any]) -> dict[str, Any]:
        sent: dict[str, Any] = send_email("ana@example.com", "hi")
        return sent


    async def pay(state: dict[str, Any]) -> int:
        return await charge(100)


    def wrong(state: dict[str, Any]) -> None:
        send_email("no")
        send_email(42, "body")
        keel.App().submit("w", job_id="j", input={}).run_id.upper()
    """
)


def run(*cmd: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=180
    )


def test_mypy_on_a_user_project_with_the_installed_wheel(tmp_path: Path) -> None:
    # Built from a copy: a build in the checkout rewrites keel.egg-info and leaves build/
    # there, beside the other test processes that read the package's metadata from it.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "keel", source / "keel", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    built = run(
        sys.executable, "-m", "pip", "wheel", "--no-deps",
        "--disable-pip-version-check", "-q", "-w", wheels, source, cwd=tmp_path,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("keel-*.whl")
    env = tmp_path / "env"
    venv.create(env, with_pip=True)
    installed = run(
        env / "bin" / "python", "-m", "pip", "install", "--no-deps", "-q",
        "--disable-pip-version-check", wheel, cwd=tmp_path,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    project = tmp_path / "project"
    project.mkdir()
    (project / "agent.py").write_text(USER_CODE)
    # The user's mypy, not the repository's configuration: outside the checkout.
    checked = run(
        sys.executable, "-m", "mypy", "--no-incremental", "--python-executable",
        env / "bin" / "python", "--strict", "agent.py", cwd=project,
    )  # fmt: skip
    report = checked.stdout
    assert "Cannot find implementation or library stub" not in report, report
    errors = [line for line in report.splitlines() if ": error:" in line]
    lines = {int(line.split(":")[1]) for line in errors}
    wrong = USER_CODE.splitlines()
    expected = {
        n for n, text in enumerate(wrong, start=1) if 'send_email("no")' in text or "(42," in text
    }
    assert lines == expected, report
