"""A submitter process for the admission kill tests: `python -m tests.support.submitter`.

It builds an App of the fleet app's workflows on $KEEL_DATABASE_URL, opens it (its pool's
connections up), prints `ready`, then reads one JSON command a line from stdin,
`{"job": ..., "input": ..., "at": epoch seconds}`: it sleeps until `at` (every submitter of a
trial is released at the same instant), submits `ticket` with that job id and input (the
default `if_exists="reuse"`), and prints `{"run_id": ..., "created": ...}`.
"""

from __future__ import annotations

import json
import sys
import time

import keel
from tests.support.apps import fleet


def main() -> None:
    app = keel.App()
    app.aio.runtime.adopt(fleet.app.aio.runtime.workflows)
    app.list_runs(limit=1)  # connected: the race is the admission's, not the connection's
    print("ready", flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        time.sleep(max(0.0, command["at"] - time.time()))
        sent = app.submit("ticket", job_id=command["job"], input=command["input"])
        print(json.dumps({"run_id": sent.run_id, "created": sent.created}), flush=True)


if __name__ == "__main__":
    main()
