"""What the tests share, so that no test module imports another one.

- `providers`: the outside world as a recording fake (what a provider received, by key).
- `graphs`: small workflows and the effects they perform.
- `workers`: what a worker does, one move at a time, in this process (drain, claim, execute,
  take a lease over, sweep).
- `checks`: waiting for a condition, and what a timeline must show.
- `in_doubt`: a run whose effect was left pending by a worker that lost its lease.
- `deciders`: the entry point of decider processes (multiprocessing, spawned).
- `crash`: the harness of the crash tests (worker processes killed at fault points).
- `service_client`, `slack_fake`: a client of the HTTP service, a recording Slack stand-in.
- `apps/`: the Keel apps that worker, CLI and server subprocesses import by module path
  (`tests.support.apps.mailer:app`, ...).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root: the working directory of subprocesses that import `tests.*`."""
