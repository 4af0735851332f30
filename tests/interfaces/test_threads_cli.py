"""`keel threads ...` on both backends: conversations driven from the command line.

The commands run in this process through typer's CliRunner on the test's database; runs are
executed by a real Worker here (`drain`), or by a real `keel worker` subprocess where the CLI
itself waits for one (update-state). Racing answers come from two `python -m keel` processes.
The oracle for what the commands print is the Python API on the same database.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import keel
from keel.cli.commands import cli
from keel.cli.guard import login
from keel.cli.threads import Strategy
from keel.core.threads import STRATEGIES
from keel.runtime.snapshot_json import state_json
from keel.testing import spawn_worker
from tests.support.thread_graphs import register, texts
from tests.support.workers import drain

REPO = Path(__file__).resolve().parents[2]
APP = "tests.support.thread_graphs:fresh_app"  # a new App on $KEEL_DATABASE_URL at each use
AppFactory = Callable[..., keel.App]


@pytest.fixture
def env(db_url: str, tmp_path: Path) -> dict[str, str]:
    """The environment of the commands: this test's database and artifacts, nothing inherited."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    base.update(
        KEEL_DATABASE_URL=db_url,
        KEEL_ARTIFACTS_DIR=str(tmp_path / "artifacts"),
        COLUMNS="200",
        NO_COLOR="1",
    )
    return base


@pytest.fixture
def app(make_app: AppFactory) -> keel.App:
    """The test's App with the thread workflows: it drains runs and reads what the CLI did."""
    return register(make_app())


def invoke(env: dict[str, str], *args: str) -> Result:
    """Run the CLI in this process with the test's KEEL_* variables (and no others)."""
    overrides: dict[str, str | None] = {k: None for k in os.environ if k.startswith("KEEL_")}
    overrides.update({k: v for k, v in env.items() if k.startswith("KEEL_") or k == "COLUMNS"})
    result = CliRunner().invoke(cli, list(args), env=overrides)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a bug, not a handled error
    return result


def ok(env: dict[str, str], *args: str) -> Result:
    result = invoke(env, *args)
    assert result.exit_code == 0, (args, result.output)
    return result


def as_json(env: dict[str, str], *args: str) -> Any:
    return json.loads(ok(env, *args, "--json").stdout)


LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
"""The start of a log record as Keel's text format writes it."""


def refused(env: dict[str, str], code: int, *args: str) -> str:
    """The one red line a refused command prints (no traceback), with its exit code."""
    result = invoke(env, *args)
    assert result.exit_code == code, (args, result.output)
    # Log records are not the command's own output: in this one test process, other threads
    # (a server of an earlier test) may log while it runs.
    lines = [line for line in result.stderr.strip().splitlines() if not LOG_RECORD.match(line)]
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
    return lines[0]


def turn(text: str) -> str:
    return json.dumps({"messages": [["user", text]]})


# -- a conversation ---------------------------------------------------------------------------


def test_a_conversation_is_created_found_continued_forked_and_read_back(
    env: dict[str, str], app: keel.App
) -> None:
    made = ok(
        env,
        "threads",
        "create",
        "chat",
        "--id",
        "t-1",
        "--metadata",
        '{"user": "ann", "tier": 2}',
        "--app",
        APP,
    )
    assert made.stdout.strip() == "created thread t-1 (chat@1)"
    other = as_json(env, "threads", "create", "chat", "--metadata", '{"user": "bob"}', "--app", APP)
    assert (other["status"], other["metadata"], other["runs"]) == ("idle", {"user": "bob"}, 0)
    assert app.get_thread(other["thread_id"])["metadata"] == {"user": "bob"}

    def found(*filters: str) -> list[str]:
        return [t["thread_id"] for t in as_json(env, "threads", "list", *filters)]

    assert found("--metadata", "user=ann") == ["t-1"]
    assert found("--metadata", "tier=2") == ["t-1"]  # the number 2, as stored
    assert found("--metadata", "tier=2", "--metadata", "user=bob") == []
    assert found("--metadata", '{"user": "bob"}') == [other["thread_id"]]
    assert sorted(found("--workflow", "chat", "--status", "idle")) == sorted(
        ["t-1", other["thread_id"]]
    )
    assert found("--status", "busy") == [] and found("--workflow", "ask") == []
    assert len(found("--limit", "1")) == 1
    assert found("--limit", "1", "--offset", "2") == []
    table = ok(env, "threads", "list", "--db", env["KEEL_DATABASE_URL"]).stdout
    assert "t-1" in table and '{"user": "ann", "tier": 2}' in table and "chat@1" in table
    assert "no threads match" in ok(env, "threads", "list", "--workflow", "ask").stdout

    first = ok(env, "threads", "submit", "t-1", "chat", "--input", turn("hi"), "--app", APP)
    first_id = first.stdout.split()[2]
    assert first.stdout.startswith(f"admitted run {first_id} on thread t-1 (turn 1, chat@1)")
    second = as_json(
        env, "threads", "submit", "t-1", "chat", "--input", turn("again"), "--app", APP
    )
    assert (second["thread_seq"], second["created"], second["status"]) == (2, True, "queued")
    assert [r["run_id"] for r in app.thread_runs("t-1")] == [first_id, second["run_id"]]
    drain(app)

    shown = as_json(env, "threads", "show", "t-1")
    assert (shown["thread"]["status"], shown["thread"]["runs"]) == ("idle", 2)
    assert [(r["thread_seq"], r["status"], r["multitask_strategy"]) for r in shown["runs"]] == [
        (1, "completed", "enqueue"),
        (2, "completed", "enqueue"),
    ]
    assert shown["runs"][1]["input"] == {"messages": [["user", "again"]]}
    assert shown["waiting"] == []
    text = ok(env, "threads", "show", "t-1").stdout
    for expected in ("t-1", "chat@1", "idle", first_id, second["run_id"], "completed", "input"):
        assert expected in text

    state = as_json_plain(env, "threads", "state", "t-1", "--app", APP)
    assert state == state_json(app.get_state("t-1"))
    assert texts(state["values"]) == ["hi", "echo: hi", "again", "echo: again"]
    assert (state["next"], state["values"]["turns"]) == ([], 2)

    history = app.get_history("t-1")
    ids = [h.config["configurable"]["checkpoint_id"] for h in history]
    table = ok(env, "threads", "history", "t-1", "--app", APP).stdout
    for h, checkpoint in zip(history, ids, strict=True):
        assert checkpoint in table
        assert h.metadata["keel_run_id"] in table
    assert "input" in table and "loop" in table and "reply" in table
    assert as_json(env, "threads", "history", "t-1", "--app", APP) == [
        state_json(h) for h in history
    ]
    newest_two = as_json(env, "threads", "history", "t-1", "--limit", "2", "--app", APP)
    assert [h["checkpoint_id"] for h in newest_two] == ids[:2]
    older = as_json(env, "threads", "history", "t-1", "--before", ids[1], "--app", APP)
    assert [h["checkpoint_id"] for h in older] == ids[2:]

    # Fork after the first turn: the thread goes on from there, both branches in its history.
    after_one = next(h for h in history if h.values.get("turns") == 1 and not h.next)
    fork_at = after_one.config["configurable"]["checkpoint_id"]
    past = as_json_plain(env, "threads", "state", "t-1", "--checkpoint", fork_at, "--app", APP)
    assert texts(past["values"]) == ["hi", "echo: hi"]
    ok(
        env,
        "threads",
        "submit",
        "t-1",
        "chat",
        "--input",
        turn("other"),
        "--checkpoint",
        fork_at,
        "--app",
        APP,
    )
    drain(app)
    assert texts(app.get_state("t-1").values) == ["hi", "echo: hi", "other", "echo: other"]
    assert "input, fork" in ok(env, "threads", "show", "t-1").stdout

    copied = ok(env, "threads", "copy", "t-1", "--to", "t-copy")
    assert copied.stdout.strip() == "copied thread t-1 to t-copy: its checkpoints, not its runs"
    assert texts(app.get_state("t-copy").values) == texts(app.get_state("t-1").values)
    assert as_json(env, "threads", "show", "t-copy")["runs"] == []
    anonymous = as_json(env, "threads", "copy", "t-1")
    assert anonymous["thread_id"] not in ("t-1", "t-copy")
    assert anonymous["metadata"] == {"user": "ann", "tier": 2}

    deleted = ok(env, "threads", "delete", "t-1")
    assert (
        deleted.stdout.strip()
        == "deleted thread t-1 and its checkpoints; its 3 run(s) stay on record until pruned"
    )
    assert refused(env, 1, "threads", "show", "t-1") == "error: no thread 't-1'"
    assert app.get_run(first_id).status == "completed"  # its runs stay
    assert texts(app.get_state("t-copy").values)[-1] == "echo: other"


def as_json_plain(env: dict[str, str], *args: str) -> Any:
    """Output of a command that prints JSON without being asked (`threads state`)."""
    return json.loads(ok(env, *args).stdout)


# -- interrupts -------------------------------------------------------------------------------


def test_an_interrupt_is_shown_and_answered_once_with_any_json_value(
    env: dict[str, str], app: keel.App
) -> None:
    submitted = as_json(
        env, "threads", "submit", "t-ask", "ask", "--input", '{"question": "color?"}', "--app", APP
    )
    run_id = submitted["run_id"]
    drain(app)
    [wait] = [w for w in app.get_run(run_id).waits if w["status"] == "pending"]

    shown = as_json(env, "threads", "show", "t-ask")
    assert shown["thread"]["status"] == "interrupted"
    [waiting] = shown["waiting"]
    assert (waiting["wait_id"], waiting["kind"], waiting["run_id"]) == (
        wait["wait_id"],
        "interrupt",
        run_id,
    )
    assert waiting["payload"] == {"question": "color?"}
    text = ok(env, "threads", "show", "t-ask").stdout
    assert f"run {run_id} waits on interrupt (wait {wait['wait_id']}" in text
    assert '{"question": "color?"}' in text
    assert "answer with `keel threads resume t-ask VALUE`" in text

    # Not JSON: refused before anything is recorded, with how to write a string.
    line = refused(env, 2, "threads", "resume", "t-ask", "teal")
    assert "VALUE is not valid JSON" in line and "'\"teal\"'" in line
    assert [w["status"] for w in app.get_run(run_id).waits] == ["pending"]

    value = '{"color": "teal", "shades": [1, 2]}'
    won = ok(
        env,
        "threads",
        "resume",
        "t-ask",
        value,
        "--by",
        "alice",
        "--action-id",
        "click-1",
        "--comment",
        "as agreed",
    )
    assert won.stdout.startswith(f"recorded: resumed by alice on wait {wait['wait_id']} of run")
    line = refused(env, 1, "threads", "resume", "t-ask", '"red"', "--by", "bob")
    assert "not resumed: already answered by alice via cli" in line
    assert '{"color": "teal", "shades": [1, 2]}' in line and "the first answer wins" in line
    repeat = ok(env, "threads", "resume", "t-ask", value, "--by", "alice", "--action-id", "click-1")
    assert "this call changed nothing" in repeat.stdout
    decided = app.get_run(run_id).waits[0]
    assert (decided["decided_by"], decided["channel"], decided["action_id"]) == (
        "alice",
        "cli",
        "click-1",
    )
    recorded = json.loads(decided["value"])
    assert (recorded["comment"], recorded["principal"]) == ("as agreed", f"login:{login()}")

    drain(app)
    values = as_json_plain(env, "threads", "state", "t-ask", "--app", APP)["values"]
    assert values["answer"] == {"color": "teal", "shades": [1, 2]}  # the value itself
    assert values["log"] == ["asked color?", "done"]
    line = refused(env, 1, "threads", "resume", "t-ask", '"late"')
    assert "has no run waiting for input" in line


def test_an_approval_on_a_thread_is_not_answered_by_a_plain_resume(
    env: dict[str, str], app: keel.App
) -> None:
    run_id = app.submit("review", {"question": "refund?"}, thread_id="t-rev").run_id
    drain(app)
    text = ok(env, "threads", "show", "t-rev").stdout
    assert "waits on approval manager" in text and '{"q": "refund?"}' in text
    assert f"answer with `keel approve {run_id}` or `keel reject {run_id}`" in text
    line = refused(env, 2, "threads", "resume", "t-rev", "true")
    assert "use `keel approve RUN` or `keel reject RUN`" in line
    assert [w["status"] for w in app.get_run(run_id).waits] == ["pending"]


def keel_bg(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "keel", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_racing_answers_from_two_processes_record_one_and_the_loser_exits_1(
    env: dict[str, str], app: keel.App
) -> None:
    run_id = app.submit("ask", {"question": "ship?"}, thread_id="t-race").run_id
    drain(app)
    racers = {
        who: keel_bg(env, "threads", "resume", "t-race", json.dumps(who), "--by", who)
        for who in ("alice", "bob")
    }
    outputs = {who: proc.communicate(timeout=90) for who, proc in racers.items()}
    codes = {who: proc.returncode for who, proc in racers.items()}
    winners = [who for who, code in codes.items() if code == 0]
    assert len(winners) == 1, outputs
    [winner] = winners
    [loser] = set(racers) - {winner}
    assert codes[loser] == 1, outputs
    assert outputs[winner][0].startswith(f"recorded: resumed by {winner}")
    err = outputs[loser][1].strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: not resumed: already answered by {winner} via cli")
    assert f'with "{winner}"' in err

    drain(app)
    assert app.get_state("t-race").values["answer"] == winner
    assert app.get_run(run_id).status == "completed"


# -- strategies -------------------------------------------------------------------------------


def test_strategies_and_idempotent_submissions_from_the_cli(
    env: dict[str, str], app: keel.App
) -> None:
    assert {s.value for s in Strategy} == set(STRATEGIES)
    ask = ("threads", "submit", "t-s", "ask", "--app", APP)
    first = as_json(env, *ask, "--input", '{"question": "a"}', "--job-id", "ticket-1")
    again = as_json(env, *ask, "--input", '{"question": "a"}', "--job-id", "ticket-1")
    assert (again["run_id"], again["created"]) == (first["run_id"], False)
    said = ok(env, *ask, "--input", '{"question": "a"}', "--job-id", "ticket-1").stdout
    assert said.startswith(f"already admitted: run {first['run_id']} on thread t-s")

    line = refused(env, 1, *ask, "--input", '{"question": "b"}', "--strategy", "reject")
    assert line == (
        f"error: thread t-s is busy: run {first['run_id']} is unfinished; submit with --strategy "
        "enqueue (run after it), interrupt or rollback (stop it), or wait for it"
    )
    assert len(app.thread_runs("t-s")) == 1  # nothing admitted
    line = refused(env, 1, "threads", "delete", "t-s")
    assert f"unfinished run ({first['run_id']}): cancel it first" in line
    drain(app)  # the first run waits on its interrupt

    second = ok(env, *ask, "--input", '{"question": "b"}', "--strategy", "interrupt").stdout
    assert "unfinished runs before it are stopped (interrupt)" in second
    drain(app)
    third = ok(env, *ask, "--input", '{"question": "c"}', "--strategy", "rollback").stdout
    assert "stopped (rollback)" in third
    drain(app)
    runs = as_json(env, "threads", "show", "t-s")["runs"]
    assert [(r["status"], r["termination_reason"], r["multitask_strategy"]) for r in runs] == [
        ("cancelled", "interrupted", "enqueue"),
        ("cancelled", "rolled_back", "interrupt"),
        ("waiting", None, "rollback"),
    ]
    text = ok(env, "threads", "show", "t-s").stdout
    assert "interrupted" in text and "rolled_back" in text and "rollback" in text

    # A Command starts a run at a node, with an update.
    command = '{"update": {"question": "q", "answer": 1}, "goto": "done"}'
    ok(env, "threads", "submit", "t-c", "ask", "--command", command, "--app", APP)
    drain(app)
    assert app.get_state("t-c").values == {"question": "q", "answer": 1, "log": ["done"]}
    assert "command" in ok(env, "threads", "show", "t-c").stdout


# -- errors -----------------------------------------------------------------------------------

BAD = [
    # (command line, exit code, words of the error)
    (("submit", "t-x", "chat", "--input", "{bad"), 2, "--input is not valid JSON"),
    (("submit", "t-x", "chat"), 2, "--input JSON or --input-file PATH"),
    (("submit", "t-x", "chat", "--command", '{"resume": 1}'), 2, "keel threads resume"),
    (("submit", "t-x", "chat", "--command", "[1]"), 2, "--command must be a JSON object"),
    (("submit", "t-x", "nosuch", "--input", "{}"), 2, "nosuch"),
    (("submit", "bad id", "chat", "--input", "{}"), 2, "thread_id 'bad id' may only contain"),
    (("submit", "t-x", "chat", "--input", "{}", "--metadata", "x"), 2, "--metadata is not valid"),
    (("create", "chat", "--metadata", "[1]"), 2, "--metadata must be a JSON object, not list"),
    (("create", "chat", "--id", "bad id"), 2, "thread_id 'bad id' may only contain"),
    (("list", "--metadata", "novalue"), 2, "give KEY=VALUE or a JSON object"),
    (("update-state", "t-x", "{bad"), 2, "VALUES is not valid JSON"),
    (("resume", "t-x", "{bad"), 2, "VALUE is not valid JSON"),
    (("show", "t-x"), 1, "no thread 't-x'"),
    (("state", "t-x"), 1, "no thread 't-x'"),
    (("history", "t-x"), 1, "no thread 't-x'"),
    (("resume", "t-x", "1"), 1, "no thread 't-x'"),
    (("update-state", "t-x", "{}"), 1, "no thread 't-x'"),
    (("copy", "t-x"), 1, "no thread 't-x'"),
    (("delete", "t-x"), 1, "no thread 't-x'"),
]


def test_bad_input_and_unknown_threads_are_refused_and_nothing_is_written(
    env: dict[str, str], app: keel.App
) -> None:
    for args, code, words in BAD:
        line = refused(env, code, "threads", *args, "--app", APP)
        assert words in line, (args, line)
    for needs_app in (("state", "t-x"), ("history", "t-x"), ("create", "chat")):
        line = refused(env, 2, "threads", *needs_app)
        assert f"keel threads {needs_app[0]} needs --app MODULE:ATTRIBUTE" in line
    usage = invoke(env, "threads", "submit", "t-x", "chat", "--input", "{}", "--strategy", "nope")
    assert usage.exit_code == 2 and "nope" in usage.stderr
    assert app.search_threads() == []
    assert app.list_runs() == []


# -- state updates ----------------------------------------------------------------------------


def test_update_state_is_written_by_a_worker_and_says_when_none_runs_it(
    env: dict[str, str], app: keel.App, db_url: str, tmp_path: Path
) -> None:
    app.submit("chat", {"messages": [("user", "hi")]}, thread_id="t-u")
    asking = app.submit("ask", {"question": "?"}, thread_id="t-ask").run_id
    drain(app)
    ahead = app.submit("chat", {"messages": [("user", "first")]}, thread_id="t-q").run_id

    update = ("threads", "update-state", "t-u", '{"turns": 10}', "--as-node", "reply", "--app", APP)
    line = refused(env, 1, *update, "--timeout", "0.2")
    [queued] = [r for r in app.thread_runs("t-u") if r["status"] == "queued"]
    assert line == (
        f"error: the state update (run {queued['run_id']}) is still queued after 0.2 s: a worker "
        "executes it (`keel worker APP`); it stays queued until one does"
    )
    behind = ("threads", "update-state", "t-q", '{"turns": 3}', "--timeout", "0.2", "--app", APP)
    line = refused(env, 1, *behind)
    assert (
        f"is queued behind run {ahead} (queued) on thread t-q: it runs once that run ends" in line
    )

    worker = spawn_worker(APP, database_url=db_url, cwd=REPO, log=tmp_path / "worker.log")
    try:
        written = ok(env, *update)  # the same update again, now with a worker
        runs = app.thread_runs("t-u")
        assert [r["status"] for r in runs] == ["completed"] * 3  # the queued update ran first
        checkpoint = app.get_state("t-u").config["configurable"]["checkpoint_id"]
        assert written.stdout.strip() == (
            f"updated thread t-u: checkpoint {checkpoint} (run {runs[-1]['run_id']}, as node reply)"
        )
        assert app.get_state("t-u").values["turns"] == 21  # 1 + 10 + 10
        table = ok(env, "threads", "history", "t-u", "--limit", "1", "--app", APP).stdout
        assert checkpoint in table and "update" in table and runs[-1]["run_id"] in table
        scripted = as_json(env, "threads", "update-state", "t-u", '{"turns": 1}', "--app", APP)
        assert scripted["status"] == "completed"
        assert (
            scripted["checkpoint_id"]
            == (app.get_state("t-u").config["configurable"]["checkpoint_id"])
        )

        # On an interrupted thread the update answers the interrupt (as in LangGraph): the
        # waiting run ends interrupted, and a run without input goes on from the update.
        answer = ("threads", "update-state", "t-ask", '{"answer": "set"}', "--as-node", "ask")
        ok(env, *answer, "--app", APP)
        first = app.get_run(asking)
        assert (first.status, first.termination_reason) == ("cancelled", "interrupted")
        went_on = as_json(env, "threads", "submit", "t-ask", "ask", "--input", "null", "--app", APP)
        assert app.wait(went_on["run_id"], timeout=60)["status"] == "completed"
        assert app.get_state("t-ask").values == {"question": "?", "answer": "set", "log": ["done"]}
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
