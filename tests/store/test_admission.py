"""Admission: a submitted run is durable before anything runs it, and never duplicated."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Required, TypedDict

import pydantic
import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.core.errors import (
    InputTooLarge,
    InvalidId,
    InvalidInput,
    JobExists,
    UnknownWorkflow,
    UsageError,
)
from tests.support.checks import event_kinds
from tests.support.graphs import echo_graph
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


def echo_app(make_app: AppFactory, **kwargs: Any) -> keel.App:
    app = make_app(**kwargs)
    app.workflow("echo")(echo_graph)
    return app


def test_duplicate_submit_does_not_create_second_run(make_app: AppFactory) -> None:
    app = echo_app(make_app)
    first = app.submit("echo", job_id="ticket-4711", input={"text": "hi", "n": [1, 2]})
    events = app.get_run(first["run_id"]).timeline
    # Same input, keys in another order: the same canonical input.
    again = app.submit("echo", job_id="ticket-4711", input={"n": [1, 2], "text": "hi"})
    assert again["run_id"] == first["run_id"]
    assert again["attempt"] == 1
    assert len(app.list_runs(job_id="ticket-4711")) == 1
    assert app.get_run(first["run_id"]).timeline == events
    assert [e["kind"] for e in events] == ["admitted"]


def test_duplicate_submit_after_completion_returns_the_finished_run(make_app: AppFactory) -> None:
    app = echo_app(make_app)
    run = app.submit("echo", job_id="t-1", input={"text": "hi"})
    drain(app)
    again = app.submit("echo", job_id="t-1", input={"text": "hi"})
    assert (again["run_id"], again["status"]) == (run["run_id"], "completed")
    assert app.get_run(run["run_id"]).output == {"text": "hi", "out": "HI"}
    assert event_kinds(app, run["run_id"]).count("admitted") == 1


def test_run_id_is_job_id_plus_16_hex(make_app: AppFactory) -> None:
    app = echo_app(make_app)
    run = app.submit("echo", job_id="ticket-4711", input={"text": "hi"})
    assert re.fullmatch(r"ticket-4711-[0-9a-f]{16}", run["run_id"])
    assert (run["job_id"], run["status"], run["decision"]) == (
        "ticket-4711",
        "queued",
        "not_decided",
    )


def test_rerun_creates_numbered_attempts_instead_of_reusing_the_run(make_app: AppFactory) -> None:
    app = echo_app(make_app)
    first = app.submit("echo", job_id="job-1", input={"text": "x"})
    second = app.submit("echo", job_id="job-1", input={"text": "x"}, rerun=True)
    third = app.submit("echo", job_id="job-1", input={"text": "x"}, rerun=True)
    assert second["run_id"] == f"{first['run_id']}-a2"
    assert third["run_id"] == f"{first['run_id']}-a3"
    assert [second["attempt"], third["attempt"]] == [2, 3]
    # Without rerun, the latest submission is still the first attempt's run.
    assert app.submit("echo", job_id="job-1", input={"text": "x"})["run_id"] == first["run_id"]
    assert len(app.list_runs(job_id="job-1")) == 3
    drain(app)
    assert {r["status"] for r in app.list_runs(job_id="job-1")} == {"completed"}


def test_forty_racing_reruns_each_get_their_own_new_attempt(make_app: AppFactory) -> None:
    apps = [echo_app(make_app) for _ in range(4)]
    first = apps[0].submit("echo", job_id="job-1", input={"text": "x"})
    barrier = threading.Barrier(40)

    def rerun(n: int) -> keel.Submission:
        barrier.wait()
        return apps[n % 4].submit("echo", job_id="job-1", input={"text": "x"}, rerun=True)

    with ThreadPoolExecutor(40) as pool:
        got = list(pool.map(rerun, range(40)))
    assert all(s.created for s in got), "every rerun call admitted a run of its own"
    assert len({s.run_id for s in got}) == 40, "no caller got another caller's attempt"
    assert sorted(s["attempt"] for s in got) == list(range(2, 42))
    assert len(apps[0].list_runs(job_id="job-1", limit=100)) == 41
    assert first.run_id not in {s.run_id for s in got}


def test_a_job_id_is_an_idempotency_key_by_default(make_app: AppFactory) -> None:
    """A webhook retried with another timestamp in its payload is the same job: the run it
    admitted the first time, not a second run (and a second email)."""
    app = echo_app(make_app)
    first = app.submit("echo", job_id="hook-1", input={"text": "x", "n": [1765000000]})
    retried = app.submit("echo", job_id="hook-1", input={"text": "x", "n": [1765000005]})
    assert (retried.run_id, retried.created) == (first.run_id, False)
    assert retried.other_runs == [first.run_id]
    assert len(app.list_runs(job_id="hook-1")) == 1


@pytest.mark.parametrize("if_exists", ["reuse", "error"])
def test_one_job_submitted_at_once_with_different_input_is_one_run(
    make_app: AppFactory, if_exists: str
) -> None:
    """A webhook and its retry (another timestamp in the payload) arriving at once on several
    servers: the job is admitted once, whichever wins; each other caller gets that run
    (`reuse`) or `JobExists` (`error`), never a second run and a second charge."""
    apps = [echo_app(make_app) for _ in range(4)]
    for job in range(10):
        barrier = threading.Barrier(4)

        def submit(n: int, job: int = job, barrier: threading.Barrier = barrier) -> str:
            barrier.wait()
            try:
                sent = apps[n].submit(
                    "echo", job_id=f"evt-{job}", input={"text": f"at {n}"}, if_exists=if_exists
                )
            except JobExists as exc:
                return f"exists {exc.runs}"
            return sent.run_id

        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(submit, range(4)))
        (run,) = apps[0].list_runs(job_id=f"evt-{job}")
        if if_exists == "reuse":
            assert got == [run["run_id"]] * 4
        else:
            assert got.count(run["run_id"]) == 1
            assert [g for g in got if g != run["run_id"]] == [f"exists {[run['run_id']]}"] * 3


def test_other_input_for_a_job_is_admitted_and_told_or_reused_or_refused(
    make_app: AppFactory,
) -> None:
    app = echo_app(make_app)
    first = app.submit("echo", job_id="job-1", input={"text": "x"})
    assert first.other_runs == []
    with pytest.raises(JobExists, match="job job-1 already has a run with other input") as no:
        app.submit("echo", job_id="job-1", input={"text": "y"}, if_exists="error")
    assert no.value.runs == [first.run_id]
    # Python's own spelling, in Python.
    assert "if_exists='new'" in str(no.value) and "--if-exists" not in str(no.value)
    assert len(app.list_runs(job_id="job-1")) == 1
    reused = app.submit("echo", job_id="job-1", input={"text": "y"}, if_exists="reuse")
    assert (reused.run_id, reused.created, reused.other_runs) == (
        first.run_id,
        False,
        [first.run_id],
    )
    second = app.submit("echo", job_id="job-1", input={"text": "y"}, if_exists="new")
    assert second.created and second.other_runs == [first.run_id]
    # The same input again is that run, whatever the policy: nothing new to refuse.
    again = app.submit("echo", job_id="job-1", input={"text": "y"}, if_exists="error")
    assert (again.run_id, again.created) == (second.run_id, False)
    with pytest.raises(UsageError, match="if_exists must be one of"):
        app.submit("echo", job_id="job-1", input={"text": "z"}, if_exists="maybe")
    assert len(app.list_runs(job_id="job-1")) == 2


def test_different_input_is_a_different_run(make_app: AppFactory) -> None:
    app = echo_app(make_app)
    a = app.submit("echo", job_id="job-1", input={"text": "x"})
    b = app.submit("echo", job_id="job-1", input={"text": "y"}, if_exists="new")
    assert a["run_id"] != b["run_id"]
    assert a["run_id"].startswith("job-1-") and b["run_id"].startswith("job-1-")
    assert len(app.list_runs(job_id="job-1")) == 2


def test_new_workflow_version_is_a_different_run(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("echo", version="1")(echo_graph)
    app.workflow("echo", version="2")(echo_graph)
    v1 = app.submit("echo", job_id="job-1", input={}, version="1")
    # The latest registered version; another version's run is "other input" for the job.
    v2 = app.submit("echo", job_id="job-1", input={}, if_exists="new")
    assert v1["run_id"] != v2["run_id"]
    assert (v1["workflow_version"], v2["workflow_version"]) == ("1", "2")


def test_same_job_in_another_workflow_is_a_different_run(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    app.workflow("shout")(echo_graph)
    assert (
        app.submit("echo", job_id="j", input={})["run_id"]
        != app.submit("shout", job_id="j", input={})["run_id"]
    )


def test_oversized_input_is_refused_and_nothing_is_written(make_app: AppFactory) -> None:
    app = echo_app(make_app, max_input_bytes=1000)
    with pytest.raises(InputTooLarge, match="the limit is 1000"):
        app.submit("echo", job_id="big", input={"text": "x" * 1000})
    assert app.list_runs() == []
    # Just under the limit is fine: the limit is on the canonical JSON's bytes.
    app.submit("echo", job_id="big", input={"text": "é" * 490})
    assert len(app.list_runs()) == 1


@pytest.mark.parametrize(
    "bad",
    [{"xs": {object(), object()}}, {"score": float("nan")}, {"f": float("inf")}, {1: 2, "a": 3}],
)
def test_non_json_input_is_refused_and_nothing_is_written(make_app: AppFactory, bad: Any) -> None:
    app = echo_app(make_app)
    # NaN and infinities are refused before they are encoded (keel.core.codec.check_storable).
    with pytest.raises(InvalidInput, match=r"canonical JSON|JSON cannot carry"):
        app.submit("echo", job_id="bad", input=bad)
    assert app.list_runs() == []


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("hello", "input: expected an object (EchoState), got str"),
        ([1, 2], "input: expected an object (EchoState), got list"),
        ({"text": 5}, "input.text: Input should be a valid string"),
        ({"txet": "hi"}, "input.txet: not a field of EchoState (its fields: n, out, text)"),
        (
            {"text": "hi", "n": ["a"]},
            "input.n.0: Input should be a valid integer, unable to parse string as an integer",
        ),
    ],
)
def test_input_the_graph_cannot_take_is_refused_at_submit_by_field(
    make_app: AppFactory, bad: Any, says: str
) -> None:
    app = echo_app(make_app)
    with pytest.raises(InvalidInput) as refused:
        app.submit("echo", job_id="bad", input=bad)
    assert refused.value.errors == [says]
    assert says in str(refused.value)
    assert app.list_runs() == []


class Ticket(pydantic.BaseModel):
    to: str
    priority: int = 1


def ticket_graph() -> StateGraph:
    g = StateGraph(Ticket)
    g.add_node("n", lambda state: {"priority": state.priority})
    g.add_edge(START, "n")
    g.add_edge("n", END)
    return g


def test_a_pydantic_input_schema_is_validated_as_langgraph_would(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("ticket")(ticket_graph)
    with pytest.raises(InvalidInput) as refused:
        app.submit("ticket", job_id="t-1", input={"priority": "high"})
    assert refused.value.errors == [
        "input.to: Field required",
        "input.priority: Input should be a valid integer, unable to parse string as an integer",
    ]
    assert app.list_runs() == []
    run = app.submit("ticket", job_id="t-1", input={"to": "ana@example.com"})
    drain(app)
    assert app.get_run(run.run_id).status == "completed"


class Letter(TypedDict, total=False):
    to: Required[str]
    draft: Required[str]
    approved: bool


class LetterInput(TypedDict):
    to: str


def letter_graph(input_schema: Any = None) -> Callable[[], StateGraph]:
    def build() -> StateGraph:
        g = StateGraph(Letter, input_schema=input_schema)
        g.add_node("n", lambda state: {"approved": True})
        g.add_edge(START, "n")
        g.add_edge("n", END)
        return g

    return build


def test_required_fields_of_a_partial_state_are_refused_when_missing(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow("letter")(letter_graph())
    with pytest.raises(InvalidInput) as refused:
        app.submit("letter", job_id="l-1", input={"to": "ana@example.com"})
    assert refused.value.errors == ["input.draft: missing (a required field of Letter)"]
    assert app.list_runs() == []
    # A `Required[str]` field is a string too: the qualifier hid its type from the check.
    with pytest.raises(InvalidInput) as refused:
        app.submit("letter", job_id="l-1", input={"to": 5, "draft": {"nested": [1]}})
    assert sorted(e.split(":")[0] for e in refused.value.errors) == ["input.draft", "input.to"]
    assert all("valid string" in e for e in refused.value.errors)
    assert app.list_runs() == []
    app.submit("letter", job_id="l-1", input={"to": "ana@example.com", "draft": "Hi"})
    assert len(app.list_runs()) == 1


def test_a_declared_input_schema_requires_its_required_keys_and_only_those(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow("letter")(letter_graph(LetterInput))
    with pytest.raises(InvalidInput) as refused:
        app.submit("letter", job_id="l-2", input={})
    assert refused.value.errors == ["input.to: missing (a required field of LetterInput)"]
    app.submit("letter", job_id="l-2", input={"to": "ana@example.com"})  # draft: not an input
    assert len(app.list_runs()) == 1


def test_registration_builds_the_graph_once_and_submit_checks_input_without_rebuilding(
    make_app: AppFactory,
) -> None:
    builds = []

    def counted() -> StateGraph:
        builds.append(1)
        return echo_graph()

    app = make_app()
    app.workflow("counted")(counted)
    assert len(builds) == 1  # compiled at registration (InvalidWorkflow there if it cannot)
    with pytest.raises(InvalidInput):
        app.submit("counted", job_id="c-0", input="not an object")
    for i in range(3):
        app.submit("counted", job_id=f"c-{i}", input={})
    assert len(builds) == 1  # the input schema came from that build


def test_unknown_workflow_is_refused_naming_what_is_registered(make_app: AppFactory) -> None:
    app = echo_app(make_app)
    with pytest.raises(UnknownWorkflow, match=r"'nope'.*echo@1"):
        app.submit("nope", job_id="j", input={})
    with pytest.raises(UnknownWorkflow, match="echo@9"):
        app.submit("echo", job_id="j", input={}, version="9")
    assert app.list_runs() == []


@pytest.mark.parametrize("job", ["", "Ticket 1", "../etc/passwd", "ticket\n", "x" * 101])
def test_invalid_job_id_is_refused_and_nothing_is_written(make_app: AppFactory, job: str) -> None:
    app = echo_app(make_app)
    with pytest.raises(InvalidId):
        app.submit("echo", job_id=job, input={})
    assert app.list_runs() == []


def test_admitted_run_is_durable_before_any_worker_runs(make_app: AppFactory) -> None:
    submitter = echo_app(make_app)
    run = submitter.submit("echo", job_id="ticket-1", input={"text": "hi"})
    submitter.close()  # nothing of the submitter's process is left to keep it alive

    observer = make_app()  # another App: another connection, nothing cached
    details = observer.get_run(run["run_id"])
    assert details.status == "queued"
    assert details.run["started_at"] is None and details.run["lease_owner"] is None
    assert [e["kind"] for e in details.timeline] == ["admitted"]
    assert details.timeline[0]["data"]["job_id"] == "ticket-1"
    assert observer.list_runs(status="queued")[0]["run_id"] == run["run_id"]

    # And that durable row is what a worker (in yet another App) executes.
    worker = echo_app(make_app)
    drain(worker)
    assert observer.get_run(run["run_id"]).output == {"text": "hi", "out": "HI"}
