"""An App's lifetime in a user's script: what happens when the script simply ends."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_script_that_never_closes_its_app_ends_quietly(db_url: str) -> None:
    script = textwrap.dedent(
        f"""
        import keel
        app = keel.App({db_url!r}, artifacts_dir="/dev/null/none")
        print(app.list_runs())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert "destroyed but it is pending" not in done.stderr
    assert done.stderr.strip() == ""
