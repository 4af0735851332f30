"""What production does to effects, with real worker processes: a worker frozen (SIGSTOP) right
before the provider call or an artifact's rename wakes after another worker took the run over;
a node that puts the clock in an effect's arguments is replayed after a SIGKILL.

Each test counts what the outside world saw: the messages the SMTP sink accepted, the bytes of
the artifact on disk.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from keel import RunNotFound
from tests.support.checks import wait_until
from tests.support.crash import KILLED, Chaos, Worker, assert_fenced

pytestmark = pytest.mark.slow


def frozen(worker: Worker) -> bool:
    """Whether the process stopped itself (SIGSTOP at its fault point): state T in /proc."""
    try:
        stat = Path(f"/proc/{worker.pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] in ("T", "t")


def freeze_at(chaos: Chaos, point: str) -> Worker:
    if chaos.db_url.startswith("postgresql"):
        # A process frozen in the middle of a transaction (its heartbeat, say) keeps its row
        # locks, and claims skip locked rows: without a server-side bound no one could take
        # the run over until it wakes. That bound is the deployment's to set (docs/workers.md).
        with psycopg.connect(chaos.db_url, autocommit=True) as conn:
            name = conn.execute("SELECT current_database()").fetchone()
            assert name is not None
            conn.execute(
                f"ALTER DATABASE \"{name[0]}\" SET idle_in_transaction_session_timeout = '3s'"
            )
    zombie = chaos.spawn(f"{point}!stop")
    wait_until(lambda: frozen(zombie), timeout=40, what=f"the worker to freeze at {point}")
    return zombie


def wake(zombie: Worker) -> None:
    """SIGCONT, then let it find out it lost the run and stop (it is idle by then)."""
    os.kill(zombie.pid, signal.SIGCONT)
    assert zombie.wait() == 0, zombie.output()
    assert "lease" in zombie.output().lower(), zombie.output()


@pytest.mark.parametrize("workflow", ["mailer", "mailer-idempotent"])
def test_worker_frozen_before_the_provider_call_sends_nothing_when_it_wakes(
    chaos: Chaos, workflow: str
) -> None:
    run_id = chaos.submit(workflow, "T-1")
    chaos.prepare()
    assert chaos.app.approve(run_id, by="alice").recorded
    zombie = freeze_at(chaos, "effect.before_call:send_email")
    try:
        chaos.drain()  # waits out the frozen worker's lease, reconciles or retries, sends
    finally:
        wake(zombie)
    details = chaos.details(run_id)
    report = chaos.report(run_id)
    assert details.status == "completed", report
    assert chaos.sink.count(subject="Re: ticket T-1") == 1, report  # the new owner's, only
    assert len(chaos.mails_for(details)) == 1, report
    assert_fenced(chaos.details(run_id), [zombie], takeover=True)


@pytest.mark.parametrize("backend", ["sqlite"])  # the connector fails a statement: SQLite's
@pytest.mark.parametrize("workflow", ["mailer", "mailer-unreconciled"])
def test_an_answer_heard_before_the_database_went_away_is_recorded_not_waited_out(
    chaos: Chaos, workflow: str
) -> None:
    """The provider answered, then the ledger's record of it failed (the database went away).
    The run comes back to the same worker, which records the answer it heard: it neither waits
    out the call's deadline nor asks the provider (with no reconciler, a person would have had
    to), and the email is sent once."""
    run_id = chaos.submit(workflow, "A-1")
    chaos.prepare()
    assert chaos.app.approve(run_id, by="alice").recorded
    worker = chaos.spawn("effect.after_perform:send_email!fail-next-statement")
    wait_until(lambda: frozen(worker), timeout=40, what="the worker to reach its record")
    os.kill(worker.pid, signal.SIGCONT)  # its next statement, the record, fails
    assert worker.wait() == 0, worker.output()
    details = chaos.wait_for(run_id, "completed")
    report = chaos.report(run_id)
    kinds = [e["kind"] for e in details.timeline]
    assert "attempt.interrupted" in kinds, report  # the record did fail
    assert "effect.awaiting_deadline" not in kinds, report
    assert [e["status"] for e in details.effects] == ["sent"], report  # not reconciled
    assert len(chaos.mails_for(details)) == 1, report
    assert chaos.sink.count(subject="Re: ticket A-1") == 1, report


def test_parallel_tool_calls_killed_between_their_emails_send_each_once(chaos: Chaos) -> None:
    """ToolNode runs an AI message's three tool calls on threads: the worker dies after the
    first email is recorded, and the next owner runs the tool calls again in whatever order.
    Each recipient gets one email (before tool-call keys, most such runs failed as changed and
    some emailed a recipient twice)."""
    tickets = [f"P-{i}" for i in range(3)]
    run_ids = [
        str(chaos.app.submit("agent", job_id=f"agent-{t.lower()}", input={"ticket": t})["run_id"])
        for t in tickets
    ]
    chaos.crash("effect.after_record:send_email@1")
    chaos.drain()
    for ticket, run_id in zip(tickets, run_ids, strict=True):
        details = chaos.details(run_id)
        report = chaos.report(run_id)
        assert (details.status, details.run["error"]) == ("completed", None), report
        to = Counter(str(m.message["To"]) for m in chaos.mails_for(details))
        assert to == Counter(f"{ticket}-{n}" for n in range(3)), report
    assert chaos.sink.count() == 9


def test_worker_frozen_before_an_artifact_rename_leaves_the_next_owners_file_alone(
    chaos: Chaos,
) -> None:
    run_id = chaos.submit("report", "R-1")
    zombie = freeze_at(chaos, "artifact.before_rename:report.txt")
    try:
        rescuer = chaos.drain()
        folder = chaos.tmp_path / "artifacts" / run_id
        published = (folder / "report.txt").read_bytes()
        assert published == f"written by process {rescuer.pid}\n".encode()
        inode = (folder / "report.txt").stat().st_ino
    finally:
        wake(zombie)
    assert (folder / "report.txt").read_bytes() == published
    assert (folder / "report.txt").stat().st_ino == inode  # not replaced, even by equal bytes
    assert sorted(p.name for p in folder.iterdir()) == ["report.txt"]  # its temp file is gone
    assert chaos.details(run_id).status == "completed"


def test_a_replay_with_a_new_timestamp_in_the_body_is_refused_not_sent_again(
    chaos: Chaos,
) -> None:
    run_id = chaos.submit("stamped", "S-1")
    chaos.crash("effect.after_record:send_email")  # sent and recorded, the step not saved
    chaos.drain()
    details = chaos.details(run_id)
    report = chaos.report(run_id)
    assert (details.status, details.termination_reason) == ("failed", "execution_error"), report
    error = details.run["error"]
    assert error.startswith("NondeterminismError: node 'send' called effect 'send_email'"), error
    assert "changed: body" in error, error
    assert chaos.sink.count(subject="Re: ticket S-1") == 1, report
    assert [e["status"] for e in details.effects] == ["sent"], report


def test_with_key_naming_the_recipient_and_subject_the_replay_completes_with_one_send(
    chaos: Chaos,
) -> None:
    run_id = chaos.submit("stamped-keyed", "S-2")
    chaos.crash("effect.after_record:send_email")
    chaos.drain()
    details = chaos.details(run_id)
    report = chaos.report(run_id)
    assert details.status == "completed", report
    assert chaos.sink.count(subject="Re: ticket S-2") == 1, report
    [mail] = chaos.mails_for(details)
    assert details.output["message_id"] == mail.message_id.strip(), report


def test_a_prune_killed_between_its_commit_and_the_folder_removal_leaves_no_orphan(
    chaos: Chaos,
) -> None:
    run_id = chaos.submit("report", "R-1")
    chaos.prepare()
    folder = chaos.tmp_path / "artifacts" / run_id
    assert (folder / "report.txt").is_file()
    assert chaos.details(run_id).status == "completed"
    time.sleep(1.1)  # finished more than the 1 s the prune below asks for
    code = (
        "from tests.support.apps.mailer import app\n"
        "app.prune(older_than='1s')\n"
        "print('survived the fault point')\n"
    )
    pruner = chaos.python(code, faults="prune.after_commit")
    assert pruner.proc.returncode == KILLED, pruner.output()
    # The batch's rows are gone, the folder outlived the process that meant to remove it.
    with pytest.raises(RunNotFound):
        chaos.details(run_id)
    assert (folder / "report.txt").is_file()
    # The next prune has no run left to delete and still finds the folder, from the record the
    # dead prune's batch committed with the rows.
    report = chaos.app.prune(older_than="1s")
    assert (report.runs, report.folders) == (0, 1)
    assert not folder.exists()
    assert chaos.app.prune(older_than="1s").folders == 0
