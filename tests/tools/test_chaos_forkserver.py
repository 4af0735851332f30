"""The fork server's children write to their cell's log, and a hung one says where it hangs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from keel.chaos.forkserver import SUPPORTED, ForkServer

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not SUPPORTED, reason="the fork server is Linux-only")


def test_a_forked_child_past_its_timeout_leaves_its_output_and_stacks_in_its_log(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    server = ForkServer("tests.support.apps.unsafe:app", ROOT, env)
    log = tmp_path / "cell-1.log"
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            server.run(["tests.support.hang"], env, 3.0, log)
        # The server is still usable: the next child runs and its output is appended.
        status, _ = server.run(["json.tool", "--help"], env, 30.0, log)
        # A child that dies of an uncaught exception says so, as an interpreter would.
        crashed, _ = server.run(["tests.support.crash_on_start"], env, 30.0, log)
    finally:
        server.close()
    assert status == 0
    assert crashed == 1
    text = log.read_text()
    assert "== pid " in text and "tests.support.hang" in text
    assert "waiting" in text  # the child's own stdout, no longer /dev/null
    assert "Current thread" in text  # every thread's stack (faulthandler)
    # ...and every asyncio task's, naming the coroutine that waits.
    assert "asyncio task(s)" in text
    assert "wait_for_a_reply_that_never_comes" in text
    assert "usage:" in text  # the second child's output, after the first's
    assert "RuntimeError: crashed on purpose" in text and "Traceback" in text
