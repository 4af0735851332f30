"""A person deciding a wait: in the harness's own process, or with
`python -m keel.chaos.decide RUN WAIT DECISION` in a process of its own, so the harness can kill
it right after the decision is recorded (decision.after_record)."""

from __future__ import annotations

import sys

import keel

DECISIONS = ("approved", "rejected", "performed", "not_performed")


def decide(app: keel.App, run_id: str, wait_id: str, decision: str) -> None:
    """Answer an approval (approved, rejected) or an in-doubt effect (performed,
    not_performed) as the harness's person, `keel-chaos`."""
    if decision in ("performed", "not_performed"):
        app.resolve_effect(
            run_id, performed=decision == "performed", wait_id=wait_id, by="keel-chaos"
        )
    elif decision == "approved":
        app.approve(run_id, wait_id=wait_id, by="keel-chaos", channel="chaos")
    elif decision == "rejected":
        app.reject(run_id, wait_id=wait_id, by="keel-chaos", channel="chaos")
    else:
        raise ValueError(f"decision is one of {', '.join(DECISIONS)}, not {decision!r}")


def main(argv: list[str]) -> int:
    run_id, wait_id, decision = argv
    with keel.App() as app:
        decide(app, run_id, wait_id, decision)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
