"""`keel demo`: the support-ticket example, crashed on purpose, told step by step.

Everything is real and local: a fresh SQLite database, an SMTP server on 127.0.0.1, worker
subprocesses that kill themselves with SIGKILL at Keel's fault points. The demo counts the
emails the SMTP server received (the outside world), not what Keel believes it sent, and exits
non-zero if any check did not hold.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

import keel
from keel.core.codec import loads
from keel.core.store.base import Row
from keel.testing.smtp import ReceivedMail, SmtpSink

APP_SPEC = "keel.demo.support_ticket:app"
LEASE_TTL = 2
WORKER_TIMEOUT = 60.0
MANAGER = "manager@demo"

TICKETS = (
    {
        "ticket_id": "4711",
        "customer": "ana@example.com",
        "subject": "Refund for my Nimbus Hub",
        "body": "Hi, I sent my Nimbus Hub back last week (order 88213) because it kept dropping "
        "off the Wi-Fi. When will I get my money back? Thanks, Ana",
    },
    {
        "ticket_id": "4712",
        "customer": "bo@example.org",
        "subject": "Charged twice this month",
        "body": "My card was charged twice for the Nimbus Cloud subscription in August. "
        "Please fix this asap.",
    },
)


@dataclass(frozen=True)
class WorkerExit:
    returncode: int | None
    seconds: float
    log: Path

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def describe(self) -> str:
        if self.returncode is None:
            return f"did not finish within {WORKER_TIMEOUT:.0f} s (stopped by the demo)"
        if self.killed:
            how = "[bold red]killed by SIGKILL[/] (exit signal -9)"
        else:
            how = f"exited with code {self.returncode}"
        return f"{how} after {self.seconds:.1f} s"


@dataclass(frozen=True)
class Outcome:
    ticket: str
    run_id: str
    emails: int
    status: str
    decision: str
    reason: str | None


def _short_worker(worker_id: str | None) -> str:
    return "-".join(str(worker_id).rsplit("-", 2)[-2:]) if worker_id else "-"


def _compact(data: Any, width: int = 100) -> str:
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False) if data else ""
    return text if len(text) <= width else text[: width - 1] + "…"


class Demo:
    def __init__(self, workdir: Path, console: Console) -> None:
        self.workdir = workdir.resolve()
        self.out = console
        self.url = f"sqlite:///{self.workdir / 'keel.db'}"
        self.artifacts = self.workdir / "artifacts"
        self.spool = self.workdir / "spool"
        self.logs = self.workdir / "logs"
        self.checks: list[tuple[str, bool]] = []
        self.outcomes: list[Outcome] = []
        self._steps = 0
        self._workers = 0
        self.app: keel.App
        self.sink: SmtpSink
        self._sink_messages: list[ReceivedMail] = []

    # -- telling ------------------------------------------------------------------------------

    def step(self, title: str, why: str) -> None:
        self._steps += 1
        self.out.print()
        self.out.rule(f"[bold cyan]Step {self._steps}. {title}", align="left")
        self.out.print(Text(why, style="italic"))

    def say(self, text: str) -> None:
        self.out.print(f"  {text}")

    def check(self, label: str, ok: bool) -> bool:
        self.checks.append((label, ok))
        mark = "[bold green]✓[/]" if ok else "[bold red]✗ FAILED:[/]"
        self.out.print(f"  {mark} {escape(label)}")
        return ok

    # -- doing --------------------------------------------------------------------------------

    def prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name in ("keel.db", "keel.db-wal", "keel.db-shm"):
            (self.workdir / name).unlink(missing_ok=True)
        for folder in (self.artifacts, self.spool, self.logs):
            shutil.rmtree(folder, ignore_errors=True)
        self.logs.mkdir()

    def worker(self, faults: str | None = None) -> WorkerExit:
        """One `python -m keel worker ... --stop-when-idle` subprocess, run to its end."""
        self._workers += 1
        env = {k: v for k, v in os.environ.items() if k not in ("KEEL_FAULTS", "KEEL_APP")}
        env.pop("SUPPORT_MAIL_DIR", None)
        env.update(
            KEEL_DATABASE_URL=self.url,
            KEEL_ARTIFACTS_DIR=str(self.artifacts),
            KEEL_LEASE_TTL=str(LEASE_TTL),
            SUPPORT_SMTP_URL=self.sink.url,
            SUPPORT_MAIL_SPOOL=str(self.spool),
            PYTHONUNBUFFERED="1",
        )
        if faults:
            env["KEEL_FAULTS"] = faults
        cmd = [sys.executable, "-m", "keel", "worker", APP_SPEC, "--stop-when-idle"]
        shown = " ".join(["python -m keel worker", APP_SPEC, "--stop-when-idle"])
        prefix = f"KEEL_FAULTS={faults} " if faults else ""
        self.say(f"[dim]$ {prefix}{shown}[/]")
        log = self.logs / f"worker-{self._workers}.log"
        started = time.monotonic()
        with log.open("wb") as fh:
            proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
            try:
                code: int | None = proc.wait(WORKER_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = None
        result = WorkerExit(code, time.monotonic() - started, log)
        self.say(f"worker pid {proc.pid} {result.describe()}")
        return result

    def emails(self, ticket: str) -> int:
        return self.sink.count(x_support_ticket=ticket)

    def submit(self, ticket: dict[str, str]) -> str:
        from keel.demo.support_ticket import ticket_job_id

        row = self.app.submit(
            "support-ticket", job_id=ticket_job_id(ticket["ticket_id"]), input=ticket
        )
        return str(row["run_id"])

    # -- showing ------------------------------------------------------------------------------

    def show_log(self, exit_: WorkerExit, lines: int = 15) -> None:
        tail = exit_.log.read_text(errors="replace").splitlines()[-lines:]
        self.out.print(
            Panel(Text("\n".join(tail) or "(no output)"), title=str(exit_.log), expand=False)
        )

    def show_effects(self, effects: list[Row]) -> None:
        table = Table(title="effect ledger", title_justify="left", show_lines=False)
        table.add_column("idempotency key", overflow="fold")
        for col in ("effect", "node", "status", "attempts"):
            table.add_column(col)
        for e in effects:
            table.add_row(
                Text(e["idempotency_key"]),
                Text(e["name"]),
                Text(e["node"]),
                Text(e["status"], style="bold"),
                str(e["attempts"]),
            )
        self.out.print(table)

    def show_timeline(self, timeline: list[Row]) -> None:
        table = Table(title="timeline", title_justify="left", expand=True)
        for col in ("t", "kind", "worker", "token"):
            table.add_column(col, no_wrap=True)
        # One line per event: the data column gives way (…) on a narrow terminal.
        table.add_column("data", no_wrap=True, overflow="ellipsis", ratio=1)
        start = float(timeline[0]["at"]) if timeline else 0.0
        for ev in timeline:
            table.add_row(
                f"+{float(ev['at']) - start:.2f}s",
                ev["kind"],
                _short_worker(ev.get("worker_id")),
                "" if ev.get("lease_token") is None else str(ev["lease_token"]),
                Text(_compact(ev.get("data"))),
            )
        self.out.print(table)

    def show_payload(self, wait: Row) -> None:
        payload = loads(wait["payload"])
        draft = payload["draft"]
        meta = Table.grid(padding=(0, 2))
        # Ticket text is data, not rich markup: "[ticket 4711]" must print as written.
        rows = {
            "to": payload["to"],
            "subject": draft["subject"],
            "category / urgency": f"{payload['category']} / {payload['urgency']}",
            "help articles": ", ".join(payload["sources"]) or "-",
            "drafted by": draft["drafted_by"],
            "deadline": f"24 h, then: {wait['on_timeout']}",
        }
        for label, value in rows.items():
            meta.add_row(label, Text(str(value)))
        self.out.print(Panel(meta, title=f"approval '{wait['name']}' is waiting", expand=False))
        self.out.print(Panel(Text(draft["body"].rstrip()), title="draft reply", expand=False))

    # -- the story ----------------------------------------------------------------------------

    def run(self) -> None:
        from keel.demo.support_ticket import register

        self.step(
            "A fresh database",
            "Keel keeps all a run needs to survive a crash in one database: the admitted run, "
            "its lease, LangGraph's checkpoints, the effect ledger, waits and the timeline. The "
            "demo uses a new SQLite file; PostgreSQL works the same way for many machines.",
        )
        self.prepare()
        self.app = register(keel.App(self.url, artifacts_dir=self.artifacts))
        try:
            applied = self.app.migrate()
            self.say(f"database [bold]{escape(str(self.workdir / 'keel.db'))}[/]")
            self.say(f"migrations applied: {', '.join(applied) or 'none'}")
            self.step(
                "A real mail server",
                "The outside world is a real SMTP server on 127.0.0.1. Every check below counts "
                "the emails it received, not what Keel believes it sent.",
            )
            with SmtpSink(spool=self.spool) as self.sink:
                self.say(f"SMTP server listening at [bold]{self.sink.url}[/]")
                try:
                    self.first_ticket()
                    self.second_ticket()
                finally:
                    self._sink_messages = self.sink.messages
        finally:
            self.app.close()

    def to_approval(self, ticket: dict[str, str], *, verbose: bool) -> str:
        run_id = self.submit(ticket)
        again = self.submit(ticket)
        self.say(f"job id  [bold]{self.app.get_run(run_id).run['job_id']}[/]")
        self.say(f"run id  [bold]{run_id}[/]")
        if verbose:
            self.say(f"submitted again -> run id {again}")
        self.check("submitting the same ticket again returned the same run", again == run_id)
        if verbose:
            self.step(
                "A worker runs the graph up to the manager's approval",
                "A worker process claims the run under a lease and runs analyze -> retrieve -> "
                "draft. At keel.approval() the run pauses and Keel records a wait with a 24 h "
                "deadline. Waiting holds no worker: the process has nothing left to do and exits.",
            )
        exit_ = self.worker()
        if not self.check("the worker exited normally", exit_.returncode == 0):
            self.show_log(exit_)
        details = self.app.get_run(run_id)
        self.say(f"run status: [bold yellow]{details.status}[/]")
        self.check("the run is waiting for the manager", details.status == "waiting")
        pending = [w for w in details.waits if w["status"] == "pending"]
        if verbose and pending:
            self.show_payload(pending[0])
        self.check("no email was sent before the decision", self.emails(ticket["ticket_id"]) == 0)
        return run_id

    def approve(self, run_id: str, *, verbose: bool) -> None:
        first = self.app.approve(run_id, by=MANAGER, comment="Looks good, send it.")
        self.say(f"approve(by={MANAGER!r}) -> recorded={first.recorded}")
        self.check("the manager's approval was recorded", first.recorded)
        if verbose:
            second = self.app.approve(run_id, by="second-approver@demo")
            self.say(
                f"approve(by='second-approver@demo') -> recorded={second.recorded}, "
                f"decided by {second.wait['decided_by']}"
            )
            self.check(
                "a second approval changed nothing (first decision wins)",
                not second.recorded and second.wait["decided_by"] == MANAGER,
            )

    def crash(self, run_id: str, ticket: str, point: str, ledger_status: str) -> int:
        """Run a worker armed to SIGKILL itself at `point`; return the run's lease token."""
        exit_ = self.worker(faults=f"{point}:send_email@1")
        if not self.check("the worker was killed by SIGKILL (-9)", exit_.killed):
            self.show_log(exit_)
        details = self.app.get_run(run_id)
        self.show_effects(details.effects)
        self.check(
            f"the ledger row is `{ledger_status}`",
            [e["status"] for e in details.effects] == [ledger_status],
        )
        self.check(
            f"the SMTP server has received 1 email for ticket {ticket}", self.emails(ticket) == 1
        )
        self.check(
            f"the run is still `running` (its lease: {details.run['lease_owner']})",
            details.status == "running",
        )
        return int(details.run["lease_token"])

    def recover(self, run_id: str, ticket: str, token: int, ledger_status: str) -> None:
        exit_ = self.worker()
        if not self.check("the new worker exited normally", exit_.returncode == 0):
            self.show_log(exit_)
        details = self.app.get_run(run_id)
        self.say(f"run status: [bold green]{details.status}[/]")
        self.check(
            f"the run took over with a higher fencing token ({details.run['lease_token']} > "
            f"{token})",
            int(details.run["lease_token"]) > token,
        )
        self.check(
            "the run completed, approved",
            (details.status, details.decision, details.termination_reason)
            == ("completed", "approved", "approved"),
        )
        self.check(
            f"the ledger row is `{ledger_status}`",
            [e["status"] for e in details.effects] == [ledger_status],
        )
        received = self.emails(ticket)
        self.check(
            f"the SMTP server received exactly 1 email for ticket {ticket} (got {received})",
            received == 1,
        )
        keys = [
            str(m.message["X-Keel-Idempotency-Key"])
            for m in self.sink.messages
            if m.message["X-Support-Ticket"] == ticket
        ]
        self.check(
            "that email carries the ledger's idempotency key",
            keys == [e["idempotency_key"] for e in details.effects],
        )
        self.outcomes.append(
            Outcome(
                ticket,
                run_id,
                received,
                details.status,
                details.decision,
                details.termination_reason,
            )
        )

    def first_ticket(self) -> None:
        ticket = TICKETS[0]
        tid = ticket["ticket_id"]
        self.step(
            f"Submit ticket {tid}",
            "Submitting admits the run durably before any step runs. Admission is idempotent: "
            "a retried request or a double click gets the same run back, never a second one.",
        )
        self.out.print(Panel(Text(json.dumps(ticket, indent=2)), title="input", expand=False))
        run_id = self.to_approval(ticket, verbose=True)
        self.step(
            "The manager approves",
            "A decision is one conditional update: the first wins, later ones (a double click, "
            "a webhook retry, a second approver) get the recorded decision back.",
        )
        self.approve(run_id, verbose=True)
        self.step(
            "Crash right after the email left",
            "This worker is armed with KEEL_FAULTS=effect.after_record:send_email@1: it "
            "SIGKILLs itself after the SMTP server accepted the email and the ledger recorded "
            "it as sent, but before LangGraph checkpointed the send_reply step. A restart "
            "re-runs send_reply from its start, which without the ledger means a second email.",
        )
        token = self.crash(run_id, tid, "effect.after_record", "sent")
        self.step(
            "A fresh worker takes over",
            f"The dead worker's lease expires after KEEL_LEASE_TTL={LEASE_TTL}s. A new worker "
            "claims the run with a higher fencing token and resumes from the last checkpoint, "
            "so send_reply runs again; the ledger already holds its key as sent, so "
            "send_email returns the stored result instead of sending.",
        )
        self.recover(run_id, tid, token, "sent")
        details = self.app.get_run(run_id)
        self.show_timeline(details.timeline)
        self.show_effects(details.effects)
        table = Table(title="artifacts", title_justify="left")
        table.add_column("file")
        table.add_column("bytes", justify="right")
        for art in details.artifacts:
            table.add_row(art.name, str(art.size))
        self.out.print(table)
        self.say(f"[dim]in {escape(str(self.artifacts / run_id))}[/]")
        names = {a.name for a in details.artifacts}
        self.check("the sent email is kept as the artifact reply.eml", "reply.eml" in names)

    def second_ticket(self) -> None:
        ticket = TICKETS[1]
        tid = ticket["ticket_id"]
        self.step(
            f"Ticket {tid}: crash before the ledger knew",
            "Same path, harder crash: this worker dies after the SMTP server accepted the email "
            "but before the ledger recorded it, so the key stays `pending`. Did the email "
            "leave? Keel does not guess. A call may still be on the wire, so the next owner "
            "first waits out the call's deadline (send_email's 10 s timeout and a margin); "
            "then it asks the effect's reconciler, lookup_sent_email, which looks the "
            "Message-ID (derived from the key) up at the provider.",
        )
        self.say(escape(f"ticket {tid} from {ticket['customer']}: {ticket['subject']!r}"))
        run_id = self.to_approval(ticket, verbose=False)
        self.approve(run_id, verbose=False)
        token = self.crash(run_id, tid, "effect.after_perform", "pending")
        self.say("[italic]A fresh worker resumes the run and reconciles the pending key:[/]")
        self.recover(run_id, tid, token, "confirmed")
        kinds = [e["kind"] for e in self.app.get_run(run_id).timeline]
        self.check(
            "the timeline shows the key confirmed by the reconciler, not sent again",
            "effect.confirmed" in kinds and kinds.count("effect.sent") == 0,
        )
        self.check(
            "the new owner waited for the dead call's deadline before asking the provider",
            kinds.index("effect.awaiting_deadline") < kinds.index("effect.confirmed")
            if "effect.awaiting_deadline" in kinds
            else False,
        )

    def summary(self) -> bool:
        self.out.print()
        self.out.rule("[bold cyan]Summary", align="left")
        table = Table()
        for col in ("ticket", "emails received", "status", "decision", "termination reason"):
            table.add_column(col)
        for o in self.outcomes:
            table.add_row(o.ticket, str(o.emails), o.status, o.decision, o.reason or "-")
        self.out.print(table)
        if self._sink_messages:
            mails = Table(title="what the SMTP server received", title_justify="left")
            for col in ("ticket", "to", "Message-ID (derived from the idempotency key)"):
                mails.add_column(col, overflow="fold")
            for m in self._sink_messages:
                cells = (str(m.message["X-Support-Ticket"]), ", ".join(m.rcpt_tos), m.message_id)
                mails.add_row(*map(Text, cells))
            self.out.print(mails)
        failed = [label for label, ok in self.checks if not ok]
        if failed or not self.checks:
            self.out.print(f"[bold red]{len(failed)} of {len(self.checks)} checks failed:[/]")
            for label in failed:
                self.out.print(f"  [red]✗ {escape(label)}[/]")
            self.out.print(f"worker logs: {self.logs}")
            return False
        self.out.print(
            f"[bold green]All {len(self.checks)} checks held.[/] Two workers were killed with "
            "SIGKILL mid-send; each ticket's email was delivered exactly once."
        )
        self.out.print(f"[dim]database {self.url}, worker logs {self.logs}[/]")
        return True


def run_demo(workdir: Path = Path(".keel/demo"), *, console: Console | None = None) -> int:
    """Run the demo in `workdir` (its old database is deleted); 0 if every check held."""
    out = console or Console()
    demo = Demo(Path(workdir), out)
    started = time.monotonic()
    out.print(
        Panel(
            "A support ticket is analyzed, answered from the help center, approved by a manager "
            "and emailed to the customer, while worker processes are killed mid-send.\n"
            "Offline: no network, no API key, no LLM (the reply is drafted by Keel's offline "
            "drafter).",
            title="[bold]Keel demo: crash-safe support-ticket agent",
            expand=False,
        )
    )
    try:
        demo.run()
    except Exception as exc:
        demo.checks.append((f"the demo ran to its end ({type(exc).__name__}: {exc})", False))
        out.print(f"[bold red]The demo stopped early:[/] {escape(f'{type(exc).__name__}: {exc}')}")
    ok = demo.summary()
    out.print(f"[dim]finished in {time.monotonic() - started:.1f} s[/]")
    return 0 if ok else 1
