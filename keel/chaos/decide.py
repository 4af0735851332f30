"""`python -m keel.chaos.decide RUN WAIT DECISION`: a person deciding, in a process of its own
so the harness can kill it right after the decision is recorded (decision.after_record)."""

from __future__ import annotations

import sys

import keel


def main(argv: list[str]) -> int:
    run_id, wait_id, decision = argv
    with keel.App() as app:
        if decision in ("performed", "not_performed"):
            app.resolve_effect(
                run_id, performed=decision == "performed", wait_id=wait_id, by="keel-chaos"
            )
        elif decision == "approved":
            app.approve(run_id, wait_id=wait_id, by="keel-chaos", channel="chaos")
        else:
            app.reject(run_id, wait_id=wait_id, by="keel-chaos", channel="chaos")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
