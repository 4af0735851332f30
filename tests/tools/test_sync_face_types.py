"""The App's operations are declared once, from their async twins (`sync_of`, in
keel.runtime.facade): a type checker sees each with its twin's parameters and a plain, not
awaitable, return; a wrong argument to the sync face is a type error as it is to the async one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

USER_CODE = textwrap.dedent(
    """
    from typing import assert_type

    import keel
    from keel.core.decisions import DecisionResult
    from keel.runtime.summary import RunSummary


    def sync_face(app: keel.App) -> None:
        assert_type(app.submit("w", job_id="j", input={}), keel.Submission)
        assert_type(app.get_run("r"), keel.RunDetails)
        assert_type(app.approve("r", by="ana"), DecisionResult)
        assert_type(app.summary("r"), RunSummary)
        assert_type(app.run_status("r"), str)


    async def async_face(app: keel.App) -> None:
        assert_type(await app.aio.submit("w", job_id="j", input={}), keel.Submission)


    def wrong(app: keel.App) -> None:
        app.submit("w", job_id=3, input={})
        app.get_run()
        app.cancel("r", who="ana")
    """
)


def test_the_sync_face_has_the_async_twins_types(tmp_path: Path) -> None:
    (tmp_path / "faces.py").write_text(USER_CODE)
    checked = subprocess.run(
        [
            sys.executable, "-m", "mypy", "--python-executable", sys.executable,
            "--cache-dir", str(tmp_path / "cache"), "--follow-imports=silent",
            "--strict", "faces.py",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    report = checked.stdout
    errors = [line for line in report.splitlines() if ": error:" in line]
    lines = {int(line.split(":")[1]) for line in errors}
    source = USER_CODE.splitlines()
    wrong = source.index("def wrong(app: keel.App) -> None:") + 1
    assert lines == {wrong + 1, wrong + 2, wrong + 3}, report
