"""A process of the thread deletion race (tests/processes/test_thread_delete_race.py):
`python -m tests.support.thread_racer submit|delete`.

It builds an App of tests.support.thread_graphs on $KEEL_DATABASE_URL, opens it (its pool's
connections up), prints `ready`, then reads one JSON command a line from stdin,
`{"thread": ..., "at": epoch seconds, "runs": n}`, sleeps until `at` and, as a `submit`ter,
submits n turns of `chat` on the thread one after the other (`enqueue`: each is admitted,
the thread made again if it is gone) and prints `{"runs": [their run ids]}`; as the `delete`r,
deletes the thread and prints `{"deleted": "deleted" | "busy" | "missing"}`. Any other error
is printed as `{"error": ...}`, for the test to fail on.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import keel
from keel.core.errors import ThreadBusy, ThreadNotFound
from tests.support.thread_graphs import register


def submit(app: keel.App, thread: str, runs: int) -> dict[str, Any]:
    admitted = [
        app.submit(
            "chat",
            {"messages": [{"type": "human", "content": f"turn {n}"}]},
            thread_id=thread,
            multitask_strategy="enqueue",
        ).run_id
        for n in range(runs)
    ]
    return {"runs": admitted}


def delete(app: keel.App, thread: str, runs: int) -> dict[str, Any]:
    try:
        app.delete_thread(thread)
    except ThreadBusy:
        return {"deleted": "busy"}
    except ThreadNotFound:
        return {"deleted": "missing"}
    return {"deleted": "deleted"}


def main() -> None:
    act = {"submit": submit, "delete": delete}[sys.argv[1]]
    app = register(keel.App())
    app.list_runs(limit=1)  # connected: the race is the transactions', not the connections'
    print("ready", flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        time.sleep(max(0.0, command["at"] - time.time()))
        try:
            said = act(app, command["thread"], command.get("runs", 0))
        except Exception as exc:
            said = {"error": repr(exc)}
        print(json.dumps(said), flush=True)


if __name__ == "__main__":
    main()
