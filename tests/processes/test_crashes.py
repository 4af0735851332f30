"""Crash tests: real worker processes SIGKILLed at Keel's fault points, on both backends.

Each test counts what the outside world saw (messages the SMTP sink accepted) and checks the
run ended as promised: completed, with its decision and termination reason, and with no
timeline event written by a killed worker's lease after another worker took the run over.
"""

from __future__ import annotations

import pytest

from tests.support.apps.mailer import REVISIONS, message_id_for
from tests.support.crash import KILLED, Chaos, Worker, assert_fenced, message_ids

pytestmark = pytest.mark.slow

APPROVED = ("completed", "approved", "approved")


def to_waiting(chaos: Chaos, workflow: str = "mailer", ticket: str = "T-1") -> str:
    """Submit a mailer run and let a clean worker take it to its approval."""
    run_id = chaos.submit(workflow, ticket)
    chaos.prepare()
    details = chaos.details(run_id)
    assert details.status == "waiting", chaos.report(run_id)
    assert [(w["kind"], w["status"]) for w in details.waits] == [("approval", "pending")]
    return run_id


def approve(chaos: Chaos, run_id: str) -> None:
    result = chaos.app.approve(run_id, by="alice")
    assert result.recorded, chaos.report(run_id)


def assert_sent_once(
    chaos: Chaos,
    run_id: str,
    *,
    ledger: str,
    killed: list[Worker],
    takeover: bool = True,
    ticket: str = "T-1",
    resolved_by_hand: bool = False,
) -> None:
    """The run completed approved, and the sink accepted exactly one message for it."""
    details = chaos.details(run_id)
    report = chaos.report(run_id)
    assert (details.status, details.decision, details.termination_reason) == APPROVED, report
    assert [e["status"] for e in details.effects] == [ledger], report
    key = details.effects[0]["idempotency_key"]
    mails = chaos.mails_for(details)
    assert message_ids(mails) == [message_id_for(key)], report
    assert [m.subject for m in mails] == [f"Re: ticket {ticket}"], report
    assert chaos.sink.count(subject=f"Re: ticket {ticket}") == 1, report
    if resolved_by_hand:
        # The person said "performed" without the provider's answer: there is no result.
        assert details.output["message_id"] == "", report
        assert details.effects[0]["result"] in (None, "null"), report
    else:
        assert details.output["message_id"] == message_id_for(key), report
    assert details.output["log"] == ["prepared", "decision:approved", "sent", "done"], report
    assert_fenced(details, killed, takeover=takeover)


# -- around the effect -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("point", "ledger"),
    [
        # Nothing reached the provider: the restarted worker sends it.
        ("effect.before_reserve:send_email", "sent"),
        # The provider accepted it, the ledger still says pending: the reconciler finds it.
        ("effect.after_perform:send_email", "confirmed"),
        # Recorded as sent, the step not checkpointed: the replay is served from the ledger.
        ("effect.after_record:send_email", "sent"),
    ],
)
def test_killed_around_the_effect_sends_once(chaos: Chaos, point: str, ledger: str) -> None:
    run_id = to_waiting(chaos)
    approve(chaos, run_id)
    killed = chaos.crash(point)
    assert chaos.details(run_id).status == "running"
    chaos.drain()
    assert_sent_once(chaos, run_id, ledger=ledger, killed=[killed])
    assert len(chaos.sink.messages) == 1


def test_in_doubt_without_reconciler_waits_for_a_person(chaos: Chaos) -> None:
    run_id = to_waiting(chaos, "mailer-unreconciled")
    approve(chaos, run_id)
    killed = chaos.crash("effect.after_perform:send_email")
    assert len(chaos.sink.messages) == 1
    chaos.drain()

    # Keel cannot know whether the message left: it must neither resend nor guess.
    details = chaos.details(run_id)
    report = chaos.report(run_id)
    assert details.status == "waiting", report
    assert [e["status"] for e in details.effects] == ["in_doubt"], report
    pending = [w for w in details.waits if w["status"] == "pending"]
    assert [w["kind"] for w in pending] == ["effect"], report
    assert len(chaos.sink.messages) == 1, report
    assert_fenced(details, [killed], takeover=True)

    result = chaos.app.resolve_effect(run_id, performed=True, by="ops")
    assert result.recorded and result.wait["kind"] == "effect", report
    chaos.drain()
    assert_sent_once(chaos, run_id, ledger="confirmed", killed=[killed], resolved_by_hand=True)
    assert len(chaos.sink.messages) == 1


# -- around the graph's own bookkeeping --------------------------------------------------------


def test_killed_before_first_checkpoint_starts_from_admitted_input(chaos: Chaos) -> None:
    run_id = chaos.submit("mailer", "T-1")
    killed = chaos.crash("run.before_first_checkpoint")
    assert chaos.details(run_id).status == "running"
    chaos.drain()
    details = chaos.details(run_id)
    assert details.status == "waiting", chaos.report(run_id)
    report = chaos.report(run_id)
    assert [e["kind"] for e in details.timeline if killed.owns(e["worker_id"])] == [
        "lease.claimed"
    ], report
    # The first step of the graph ran in the restarted worker, fed with the admitted input.
    first_step = next(e for e in details.timeline if e["kind"] == "step")
    assert first_step["data"] == {"node": "__start__", "writes": ["ticket", "to"]}, report
    assert not killed.owns(first_step["worker_id"]), report
    assert not [e for e in details.timeline if e["kind"] == "status.failed"], report
    approve(chaos, run_id)
    chaos.drain()
    assert_sent_once(chaos, run_id, ledger="sent", killed=[killed])


def test_killed_after_interrupt_registers_the_wait_on_restart(chaos: Chaos) -> None:
    run_id = chaos.submit("mailer", "T-1")
    killed = chaos.crash("wait.after_interrupt")
    details = chaos.details(run_id)
    assert (details.status, details.waits) == ("running", []), chaos.report(run_id)
    chaos.drain()
    details = chaos.details(run_id)
    assert details.status == "waiting", chaos.report(run_id)
    assert [(w["kind"], w["status"]) for w in details.waits] == [("approval", "pending")]
    approve(chaos, run_id)
    chaos.drain()
    assert_sent_once(chaos, run_id, ledger="sent", killed=[killed])
    assert len(chaos.details(run_id).waits) == 1


@pytest.mark.parametrize(
    ("phase", "occurrence"),
    [
        ("start", 1),  # the input checkpoint: nothing is checkpointed yet
        ("start", 4),  # the approval's interrupt (START's checkpoint goes with draft's step)
        ("resume", 3),  # the step that sent the email (the ledger has it as sent)
        ("resume", 6),  # the final checkpoint, before the run completes
    ],
)
def test_killed_inside_checkpoint_write(chaos: Chaos, phase: str, occurrence: int) -> None:
    fault = f"checkpoint.before_write@{occurrence}"
    if phase == "start":
        run_id = chaos.submit("mailer", "T-1")
        killed = chaos.crash(fault)
        chaos.drain()
        assert chaos.details(run_id).status == "waiting", chaos.report(run_id)
        approve(chaos, run_id)
    else:
        run_id = to_waiting(chaos)
        approve(chaos, run_id)
        killed = chaos.crash(fault)
    chaos.drain()
    assert_sent_once(chaos, run_id, ledger="sent", killed=[killed])


# -- while waiting for a person ----------------------------------------------------------------


def test_killed_while_waiting_for_approval(chaos: Chaos) -> None:
    run_id = chaos.submit("mailer", "T-1")
    idle = chaos.spawn(stop_when_idle=False)
    chaos.wait_for(run_id, "waiting")
    chaos.kill(idle)
    assert idle.owns(chaos.details(run_id).timeline[1]["worker_id"]), chaos.report(run_id)
    approve(chaos, run_id)
    chaos.drain()
    # A waiting run holds no lease: nobody had to take it over.
    assert_sent_once(chaos, run_id, ledger="sent", killed=[idle], takeover=False)


def test_killed_after_decision_recorded(chaos: Chaos) -> None:
    run_id = to_waiting(chaos)
    code = (
        "from tests.support.apps.mailer import app\n"
        f"app.approve({run_id!r}, by='alice', channel='cli')\n"
        "print('survived the fault point')\n"
    )
    decider = chaos.python(code, faults="decision.after_record")
    assert decider.proc.returncode == KILLED, decider.output()
    details = chaos.details(run_id)
    report = chaos.report(run_id)
    assert (details.status, details.decision) == ("queued", "approved"), report
    assert [(w["status"], w["decided_by"]) for w in details.waits] == [("decided", "alice")]
    # The decision persisted: a second one (a retried click) changes nothing.
    again = chaos.app.reject(run_id, by="bob")
    assert not again.recorded and again.wait["decided_by"] == "alice", report
    chaos.drain()
    assert_sent_once(chaos, run_id, ledger="sent", killed=[decider], takeover=False)


# -- a run handed to this process's worker in the commit that queued it -----------------------


def beside_a_worker(action: str) -> str:
    """A snippet: a worker idle on the App's event loop, then `action` from that loop, which
    commits with the worker's claim (keel.runtime.handoff) and is killed right after."""
    return (
        "import asyncio, time\n"
        "from keel.runtime.worker import Worker\n"
        "from tests.support.apps.mailer import app\n"
        "worker = Worker(app.aio.runtime, concurrency=1, poll_interval=0.05)\n"
        "asyncio.run_coroutine_threadsafe(worker.run(), app.aio.runtime.portal.loop)\n"
        "deadline = time.monotonic() + 20\n"
        "while not app.aio.runtime._takers and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "time.sleep(0.5)  # its first looks are over: it is idle, its slot offered\n"
        f"{action}\n"
        "time.sleep(10)\n"
        "print('survived the fault point')\n"
    )


def assert_held_by(chaos: Chaos, run_id: str, killed: Worker) -> None:
    """The dead process's claim committed: the run is running under its lease."""
    details = chaos.details(run_id)
    assert details.status == "running", chaos.report(run_id)
    claims = [e for e in details.timeline if e["kind"] == "lease.claimed"]
    assert killed.owns(claims[-1]["worker_id"]), chaos.report(run_id)


def test_killed_after_a_submit_handed_its_run_to_the_process_worker(chaos: Chaos) -> None:
    submit = (
        "app.submit('mailer', job_id='ticket-t-1', "
        "input={'ticket': 'T-1', 'to': 'customer-t-1@example.com'})"
    )
    submitter = chaos.python(beside_a_worker(submit), faults="handoff.after_commit")
    assert submitter.proc.returncode == KILLED, submitter.output()
    [run] = chaos.app.list_runs()
    run_id = str(run["run_id"])
    assert_held_by(chaos, run_id, submitter)
    assert not chaos.sink.messages
    chaos.drain()  # waits out the dead lease, takes the run over, runs it to its approval
    assert chaos.details(run_id).status == "waiting", chaos.report(run_id)
    approve(chaos, run_id)
    chaos.drain()
    assert_sent_once(chaos, run_id, ledger="sent", killed=[submitter])


def test_killed_after_a_decision_handed_its_run_to_the_process_worker(chaos: Chaos) -> None:
    run_id = to_waiting(chaos)
    approve_it = f"app.approve({run_id!r}, by='alice', channel='cli')"
    decider = chaos.python(beside_a_worker(approve_it), faults="handoff.after_commit")
    assert decider.proc.returncode == KILLED, decider.output()
    assert_held_by(chaos, run_id, decider)
    details = chaos.details(run_id)
    assert details.decision == "approved", chaos.report(run_id)
    assert not chaos.sink.messages
    chaos.drain()
    assert_sent_once(chaos, run_id, ledger="sent", killed=[decider])


# -- loops and several runs ----------------------------------------------------------------------


def test_revision_loop_sends_each_revision_once(chaos: Chaos) -> None:
    run_id = chaos.submit("revisions", "T-7")
    first = chaos.crash("effect.after_record:send_email@1")
    assert len(chaos.sink.messages) == 1
    # The restart replays revision 1 from the ledger, so its next perform is revision 2.
    second = chaos.crash("effect.after_perform:send_email@1")
    assert len(chaos.sink.messages) == 2
    chaos.drain()

    details = chaos.details(run_id)
    report = chaos.report(run_id)
    assert (details.status, details.decision, details.termination_reason) == (
        "completed",
        "not_decided",
        "completed",
    ), report
    keys = [e["idempotency_key"] for e in details.effects]
    assert len(set(keys)) == REVISIONS, report
    assert sorted(e["status"] for e in details.effects) == ["confirmed", "sent"], report
    sent = message_ids(chaos.sink.messages)
    assert sorted(sent) == sorted(message_id_for(k) for k in keys), report
    assert details.output["revision"] == REVISIONS, report
    assert sorted(details.output["message_ids"]) == sorted(sent), report
    assert_fenced(details, [first, second], takeover=True)
    takeovers = [e for e in details.timeline if e["kind"] == "lease.takeover"]
    assert len(takeovers) == 2, report


@pytest.mark.parametrize(
    "point", ["effect.after_perform:send_email@1", "effect.after_record:send_email@2"]
)
def test_two_runs_in_one_killed_worker_each_send_once(chaos: Chaos, point: str) -> None:
    tickets = ("T-1", "T-2")
    run_ids = [chaos.submit("mailer", t) for t in tickets]
    chaos.prepare()
    for run_id in run_ids:
        assert chaos.details(run_id).status == "waiting", chaos.report(run_id)
        approve(chaos, run_id)
    killed = chaos.crash(point, concurrency=2)
    chaos.drain()
    for run_id, ticket in zip(run_ids, tickets, strict=True):
        details = chaos.details(run_id)
        ledger = details.effects[0]["status"] if details.effects else "missing"
        assert ledger in ("sent", "confirmed"), chaos.report(run_id)
        mine = [e["kind"] for e in details.timeline if killed.owns(e["worker_id"])]
        assert "lease.claimed" in mine, chaos.report(run_id)  # both runs were in that worker
        # A run the worker completed before it died needed no takeover; any other did.
        takeover = "status.completed" not in mine
        assert_sent_once(
            chaos, run_id, ledger=ledger, killed=[killed], takeover=takeover, ticket=ticket
        )
    assert len(chaos.sink.messages) == len(tickets)


def test_killed_after_a_runs_end_claimed_the_next_run_of_a_backlog(chaos: Chaos) -> None:
    """A worker draining a backlog commits a run's end with the claim of the next run, then
    dies before starting it: the first run stays completed, the second is held by the dead
    worker's lease until a clean worker takes it over, and every run completes once."""
    ids = [
        str(chaos.app.submit("report", job_id=f"report-{i}", input={"log": []})["run_id"])
        for i in range(3)
    ]
    killed = chaos.crash("handoff.after_commit@1", concurrency=1)
    first, second, third = (chaos.details(r) for r in ids)
    assert first.status == "completed", chaos.report(ids[0])
    assert second.status == "running", chaos.report(ids[1])
    [claim] = [e for e in second.timeline if e["kind"] == "lease.claimed"]
    assert killed.owns(claim["worker_id"]), chaos.report(ids[1])
    assert third.status == "queued", chaos.report(ids[2])
    chaos.drain()
    for run_id in ids:
        details = chaos.details(run_id)
        assert details.status == "completed", chaos.report(run_id)
        ends = [e for e in details.timeline if e["kind"] == "status.completed"]
        assert len(ends) == 1, chaos.report(run_id)
    assert_fenced(chaos.details(ids[1]), [killed], takeover=True)
