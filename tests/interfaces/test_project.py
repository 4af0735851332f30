"""langgraph.json projects: `load_project`, `keel serve|worker --config` and `keel dev`.

A project is written to a temp folder as `langgraph new` would make one (a langgraph.json and an
agent.py holding a builder, a compiled graph and factories), loaded in this process and run by
a drained worker on SQLite; then `keel dev` runs it as a real subprocess on a free port: it
answers, executes a run submitted through the Python API, and finishes, after a SIGKILL and a
restart, a run that was mid-flight without running its finished node again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from keel.cli.commands import cli
from keel.runtime.project import ProjectError, load_project, project_of, read_project
from keel.service import create_app
from keel.service.auth import is_loopback
from tests.support.apps.service import LiveServer
from tests.support.checks import wait_until
from tests.support.service_client import READER, TOKENS, bearer, free_port
from tests.support.workers import drain

AGENT = '''
"""A project's graphs: a builder, a compiled graph, and factories of each kind."""
import os
import time
from pathlib import Path
from typing import TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint
from langgraph.graph import END, START, StateGraph

HERE = Path(__file__).parent
STEPS = HERE / "steps.log"
GATE = HERE / "gate"
GREETING = os.environ.get("PROJECT_GREETING")  # read at import: the env section comes first
MEMORY = InMemorySaver()


class State(TypedDict, total=False):
    n: int
    greeting: str


def note(step):
    with STEPS.open("a") as f:
        f.write(step + "\\n")


def add(state: State) -> State:
    note("add")
    return {"n": state["n"] + 1}


def double(state: State) -> State:
    note("double")
    return {"n": state["n"] * 2}


def hold(state: State) -> State:
    note("hold")
    while not GATE.exists():  # mid-flight until the test opens the gate
        time.sleep(0.05)
    return {"n": state["n"] + 100}


def greet(state: State) -> State:
    return {"greeting": os.environ["PROJECT_GREETING"]}


def chain(*nodes):
    builder = StateGraph(State)
    previous = START
    for node in nodes:
        builder.add_node(node.__name__, node)
        builder.add_edge(previous, node.__name__)
        previous = node.__name__
    builder.add_edge(previous, END)
    return builder


builder = chain(add, double)
graph = chain(add, double).compile(checkpointer=MEMORY)  # Keel swaps in its own saver
slow = chain(add, hold, double)
greeter = chain(greet)


def make_graph(config):
    assert "configurable" in config
    return chain(double, add)


async def make_compiled():
    return chain(add).compile()


def not_a_factory(a, b):
    return builder


def makes_nothing():
    return 42


def broken_factory():
    raise ValueError("no model configured")


@entrypoint()
def functional(state: dict) -> dict:
    return state


NOT_A_GRAPH = 7
'''

GRAPHS = {
    "built": "./agent.py:builder",
    "compiled": "./agent.py:graph",
    "made": {"path": "./agent.py:make_graph", "description": "double, then add"},
    "made-async": "agent:make_compiled",
    "slow": "./agent.py:slow",
    "greeter": "./agent.py:greeter",
}


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What loading a project changes in this process (environment, sys.path, sys.modules)
    is undone after each test."""
    path, modules = list(sys.path), set(sys.modules)
    monkeypatch.delenv("PROJECT_GREETING", raising=False)
    monkeypatch.delenv("KEEL_DATABASE_URL", raising=False)
    monkeypatch.delenv("KEEL_ARTIFACTS_DIR", raising=False)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        del sys.modules[name]
    os.environ.pop("PROJECT_GREETING", None)
    os.environ.pop("PROJECT_OTHER", None)


def write_project(root: Path, config: dict[str, Any] | None = None, agent: str = AGENT) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "agent.py").write_text(agent)
    settings = {"dependencies": ["."], "graphs": GRAPHS, "env": {"PROJECT_GREETING": "hello"}}
    (root / "langgraph.json").write_text(json.dumps(config if config is not None else settings))
    return root


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path / "project")


def steps(root: Path) -> list[str]:
    path = root / "steps.log"
    return path.read_text().split() if path.exists() else []


# -- load_project in this process ---------------------------------------------------------------


def test_every_kind_of_graph_is_registered_and_runs_on_keel(project: Path) -> None:
    app = load_project(project / "langgraph.json")
    try:
        # The database and the artifacts live beside the config, not in the current folder.
        assert app.url == f"sqlite:///{project}/.keel/keel.db"
        app.migrate()
        assert (project / ".keel" / "keel.db").is_file()
        assert sorted(w.key for w in app.aio.runtime.workflows.all()) == sorted(
            f"{graph_id}@1" for graph_id in GRAPHS
        )
        runs = {
            graph_id: app.submit(graph_id, {"n": 3}, thread_id=f"t-{graph_id}").run_id
            for graph_id in ("built", "compiled", "made", "made-async")
        }
        greeted = app.submit("greeter", {}).run_id
        stats = drain(app)
        assert stats.finished == 5, stats
        outputs = {g: json.loads(app.get_run(r).run["output"])["n"] for g, r in runs.items()}
        assert outputs == {"built": 8, "compiled": 8, "made": 7, "made-async": 4}
        assert json.loads(app.get_run(greeted).run["output"]) == {"greeting": "hello"}
        # The compiled graph's own checkpointer never saw the run: Keel's saver has it.
        agent = sys.modules["agent"]
        assert not agent.MEMORY.storage
        assert app.get_state("t-compiled").values == {"n": 8}
        found = project_of(app)
        assert found is not None and found.path == project / "langgraph.json"
        made = next(e for e in found.graphs if e.graph_id == "made")
        assert (made.description, made.version) == ("double, then add", "1")
        assert found.notes and "dependencies" in found.notes[0]
        assert found.warnings == ()
    finally:
        app.close()


def test_a_project_runs_on_the_database_it_is_given(project: Path, db_url: str) -> None:
    app = load_project(project, url=db_url)  # SQLite and PostgreSQL, already migrated
    try:
        assert app.url == db_url
        run_id = app.submit("compiled", {"n": 5}, thread_id="t-1").run_id
        drain(app)
        assert json.loads(app.get_run(run_id).run["output"]) == {"n": 12}
        assert app.get_history("t-1")[0].values == {"n": 12}
    finally:
        app.close()


def test_a_compiled_graph_moves_to_another_version(project: Path) -> None:
    config = {"graphs": {"compiled": "./agent.py:graph"}, "keel": {"versions": {"compiled": "3"}}}
    write_project(project, config)
    app = load_project(project, url=f"sqlite:///{project}/other.db")
    try:
        app.migrate()
        assert [w.key for w in app.aio.runtime.workflows.all()] == ["compiled@3"]
        app.workflow("compiled", "4")(lambda: sys.modules["agent"].graph)
        run_id = app.submit("compiled", {"n": 1}, version="3").run_id
        # A compiled graph has no compile(): the upgrade builds it as the executor does.
        assert app.upgrade_run(run_id, to="4")["workflow_version"] == "4"
        drain(app)
        assert app.get_run(run_id).run["status"] == "completed"
    finally:
        app.close()


def test_env_file_fills_what_the_environment_does_not_set(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / ".env").write_text(
        textwrap.dedent(
            """\
            # the project's secrets
            export PROJECT_GREETING="hi there"
            PROJECT_OTHER = 'kept' # a comment
            KEEL_DATABASE_URL=sqlite:///{root}/from-env.db
            """
        ).format(root=project)
    )
    config = {"graphs": {"greeter": "./agent.py:greeter"}, "env": ".env", "python_version": "3.11"}
    write_project(project, {**config, "checkpointer": {}, "grpahs": {}})
    loaded = read_project(project)
    assert dict(loaded.env) == {
        "PROJECT_GREETING": "hi there",
        "PROJECT_OTHER": "kept",
        "KEEL_DATABASE_URL": f"sqlite:///{project}/from-env.db",
    }
    assert any("`checkpointer` is ignored" in w for w in loaded.warnings)
    assert any("unknown key `grpahs`" in w for w in loaded.warnings)
    assert not any("python_version" in w for w in loaded.warnings)  # a Docker image's concern
    monkeypatch.setenv("PROJECT_OTHER", "from the shell")
    app = load_project(project)
    try:
        assert app.url == f"sqlite:///{project}/from-env.db"  # the env file may name the database
        assert os.environ["PROJECT_GREETING"] == "hi there"
        assert os.environ["PROJECT_OTHER"] == "from the shell"  # the shell wins
    finally:
        app.close()


def test_a_file_inside_a_package_keeps_its_relative_imports(tmp_path: Path) -> None:
    package = tmp_path / "project" / "src" / "keel_test_agent"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nodes.py").write_text(
        "def add(state):\n    return {'n': state['n'] + 1}\n",
    )
    (package / "graph.py").write_text(
        textwrap.dedent(
            """\
            from typing import TypedDict
            from langgraph.graph import START, StateGraph
            from .nodes import add

            class State(TypedDict):
                n: int

            graph = StateGraph(State)
            graph.add_node("add", add)
            graph.add_edge(START, "add")
            """
        )
    )
    root = tmp_path / "project"
    (root / "langgraph.json").write_text(
        json.dumps({"graphs": {"agent": "./src/keel_test_agent/graph.py:graph"}})
    )
    app = load_project(root)
    try:
        app.migrate()
        run_id = app.submit("agent", {"n": 1}).run_id
        drain(app)
        assert json.loads(app.get_run(run_id).run["output"]) == {"n": 2}
        assert sys.modules["keel_test_agent.graph"].__file__ == str(package / "graph.py")
    finally:
        app.close()


BROKEN_AGENT = "import os\n\nGRAPH = None\nraise RuntimeError('the model key is missing')\n"


@pytest.mark.parametrize(
    ("config", "agent", "expected"),
    [
        (None, None, "no project config at"),
        ("{not json", None, "is not valid JSON: Expecting property name"),
        ({"dependencies": ["."]}, AGENT, "`graphs` must map each graph id"),
        ({"graphs": {"g": "./agent.py"}}, AGENT, "expected ./path.py:attribute or module:attr"),
        ({"graphs": {"g": "./missing.py:graph"}}, AGENT, "no file"),
        ({"graphs": {"g": "no_such_module_x:graph"}}, AGENT, "No module named 'no_such_module_x'"),
        ({"graphs": {"g": "./agent.py:GRAPH"}}, BROKEN_AGENT, "the model key is missing (at "),
        ({"graphs": {"g": "./agent.py:nope"}}, AGENT, "./agent.py has no attribute 'nope'"),
        ({"graphs": {"g": "./agent.py:NOT_A_GRAPH"}}, AGENT, "is a int, not a graph"),
        ({"graphs": {"g": "./agent.py:State"}}, AGENT, "is a class, not a graph"),
        (
            {"graphs": {"g": "./agent.py:broken_factory"}},
            AGENT,
            "calling ./agent.py:broken_factory as a graph factory failed: ValueError: no model",
        ),
        ({"graphs": {"g": "./agent.py:makes_nothing"}}, AGENT, "returned a int, not a StateGraph"),
        ({"graphs": {"g": "./agent.py:not_a_factory"}}, AGENT, "takes more than one argument"),
        ({"graphs": {"g": "./agent.py:functional"}}, AGENT, "without a StateGraph builder"),
        ({"graphs": {"g": "./agent.py:graph"}, "env": ".env"}, AGENT, "which does not exist"),
        (
            {"graphs": {"g": "./agent.py:graph"}, "keel": {"versions": {"h": "2"}}},
            AGENT,
            "`keel.versions` names no graph h",
        ),
        ({"graphs": {"g": "./agent.py:graph"}, "auth": {}}, AGENT, '`auth` needs a "path"'),
    ],
)
def test_what_is_wrong_with_a_project_is_said(
    tmp_path: Path, config: dict[str, Any] | str | None, agent: str | None, expected: str
) -> None:
    root = tmp_path / "project"
    root.mkdir()
    if agent is not None:
        (root / "agent.py").write_text(agent)
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (root / "langgraph.json").write_text(text)
    with pytest.raises(ProjectError) as caught:
        load_project(root / "langgraph.json").close()
    assert expected in str(caught.value)
    # At the command line: one red line, exit 2 (bad usage), before any database is touched.
    result = CliRunner().invoke(cli, ["worker", "--config", str(root / "langgraph.json")])
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.stderr.split()), result.stderr


def test_keel_dev_says_how_to_version_a_graph_whose_structure_changed(project: Path) -> None:
    app = load_project(project)
    try:
        app.migrate()
        app.submit("built", {"n": 1})
        drain(app)  # its worker held built@1 to this structure
    finally:
        app.close()
    edited = AGENT.replace("builder = chain(add, double)", "builder = chain(add, double, greet)")
    (project / "agent.py").write_text(edited)
    del sys.modules["agent"]  # as a new process would, import the edited file
    result = CliRunner().invoke(cli, ["dev", "--config", str(project / "langgraph.json")])
    assert result.exit_code == 2, result.output
    said = " ".join(result.stderr.split())
    assert "graph 'built' changed since version 1 was first served (node 'greet' added" in said
    assert '("keel": {"versions": {"built": "2"}})' in said
    assert "keel dev: http" not in result.stdout  # refused before serving anything


def test_serve_and_worker_take_app_or_config_not_both(project: Path) -> None:
    config = str(project / "langgraph.json")
    both = CliRunner().invoke(cli, ["worker", "tests.support.apps.cli:app", "--config", config])
    neither = CliRunner().invoke(cli, ["serve"])
    db_with_app = CliRunner().invoke(cli, ["worker", "tests.support.apps.cli:app", "--db", "x"])
    assert [r.exit_code for r in (both, neither, db_with_app)] == [2, 2, 2]
    assert "not both" in both.stderr
    assert "give APP" in neither.stderr
    assert "--db goes with --config" in db_with_app.stderr


def test_open_loopback_lets_in_only_tokenless_requests_from_this_machine(project: Path) -> None:
    assert [is_loopback(a) for a in ("127.0.0.1", "127.8.0.1", "::1", "::ffff:127.0.0.1")] == [
        True
    ] * 4
    assert [is_loopback(a) for a in ("10.0.0.1", "::ffff:10.0.0.1", "testclient", "")] == [
        False
    ] * 4
    app = load_project(project, url=f"sqlite:///{project}/open.db")
    try:
        app.migrate()
        with LiveServer(create_app(app, tokens={READER: TOKENS[READER]}, open_loopback=True)) as s:
            submitted = httpx.post(
                f"{s.url}/v1/runs", json={"workflow": "built", "job_id": "j-1", "input": {"n": 1}}
            )
            assert submitted.status_code == 201, submitted.text
            run_id = submitted.json()["run_id"]
            cancelled = httpx.post(f"{s.url}/v1/runs/{run_id}/cancel")
            assert cancelled.status_code == 200, cancelled.text
            # A token sent is judged as always: unknown is refused, a missing scope forbidden.
            assert httpx.get(f"{s.url}/v1/runs", headers=bearer("x" * 43)).status_code == 401
            denied = httpx.post(f"{s.url}/v1/runs/{run_id}/cancel", headers=bearer(READER))
            assert denied.status_code == 403
        assert app.get_run(run_id).run["status"] == "cancelled"
        assert "dev:loopback" in json.dumps(app.get_run(run_id).timeline, default=str)
        with LiveServer(create_app(app, tokens={READER: TOKENS[READER]})) as closed:
            assert httpx.get(f"{closed.url}/v1/runs").status_code == 401
    finally:
        app.close()


def test_open_loopback_does_not_let_in_pages_of_other_sites(project: Path) -> None:
    """A web page on another site makes the browser send a POST with no body to 127.0.0.1 (a
    CORS "simple request": no preflight). It must not act as this machine, nor may a page
    whose own name was rebound to 127.0.0.1; the origins let in (Studio's) and the server's
    own loopback origin still may, and tools that send no Origin (curl, the SDKs) too."""
    app = load_project(project, url=f"sqlite:///{project}/pages.db")
    studio = "https://smith.langchain.com"
    try:
        app.migrate()
        api = create_app(app, tokens={}, open_loopback=True, cors_origins=[studio])
        with LiveServer(api) as s:
            port = s.url.rsplit(":", 1)[1]

            def submit(job: str) -> str:
                answer = httpx.post(
                    f"{s.url}/v1/runs", json={"workflow": "built", "job_id": job, "input": {}}
                )
                assert answer.status_code == 201, answer.text
                return str(answer.json()["run_id"])

            def cancel(run_id: str, headers: dict[str, str]) -> int:
                return httpx.post(f"{s.url}/v1/runs/{run_id}/cancel", headers=headers).status_code

            page = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
            refused = [
                {**page, "Origin": "https://evil.example"},
                {**page, "Origin": "null"},
                page,  # no Origin, yet a page of another site sent it
                {"Origin": f"http://evil.example:{port}", "Host": f"evil.example:{port}"},
            ]
            target = submit("j-target")
            assert [cancel(target, h) for h in refused] == [401] * len(refused)
            assert app.get_run(target).run["status"] == "queued"
            # A rebound page's own reads carry no Origin: its name gives it away.
            rebound = {"Host": f"evil.example:{port}", "Sec-Fetch-Site": "same-origin"}
            for headers in (rebound, {"Host": f"evil.example:{port}"}):
                assert httpx.get(f"{s.url}/v1/runs/{target}", headers=headers).status_code == 401
            own = {"Host": f"0.0.0.0:{port}", "Origin": f"http://0.0.0.0:{port}"}
            assert httpx.get(f"{s.url}/v1/runs/{target}", headers=own).status_code == 200
            let_in = [
                {"Origin": studio, "Sec-Fetch-Site": "cross-site"},
                {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"},
                {},
            ]
            for n, headers in enumerate(let_in):
                run_id = submit(f"j-{n}")
                assert cancel(run_id, headers) == 200, headers
                assert app.get_run(run_id).run["status"] == "cancelled"
    finally:
        app.close()


# -- the commands, as real processes -----------------------------------------------------------


def get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None


def command_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEEL_", "PROJECT_"))}
    # A killed process's lease lapses in 2 s, so the restarted one takes its run over quickly.
    return {**env, "KEEL_LEASE_TTL": "2", "NO_COLOR": "1", "COLUMNS": "300"}


class Command:
    """A `keel` process with its output in files (a pipe nobody reads would block it)."""

    def __init__(self, folder: Path, name: str, *args: str) -> None:
        self.out, self.err = folder / f"{name}.out", folder / f"{name}.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "keel", *args, "--log-level", "warning"],
                cwd=folder,
                env=command_env(),
                stdout=out,
                stderr=err,
                text=True,
            )

    def answering(self, port: int) -> None:
        def up() -> bool:
            assert self.process.poll() is None, self.err.read_text()
            try:
                return get(port, "/healthz") == (200, {"status": "ok"})
            except OSError:
                return False

        wait_until(up, 60, f"{self.out.stem} to answer on port {port}")

    def stop(self, sig: int = signal.SIGTERM) -> tuple[str, str]:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        self.process.wait(timeout=60)
        return self.out.read_text(), self.err.read_text()


def test_serve_and_worker_run_a_project_and_serve_asks_for_tokens(project: Path) -> None:
    db = f"sqlite:///{project}/served.db"
    app = load_project(project, url=db)
    port = free_port()
    args = ("--config", str(project / "langgraph.json"), "--db", db)
    server = None
    try:
        app.migrate()
        server = Command(project.parent, "serve", "serve", *args, "--port", str(port))
        server.answering(port)
        # `keel serve` never opens the door `keel dev` opens: no token, no answer.
        assert get(port, "/v1/runs?limit=1")[0] == 401
        run_id = app.submit("made", {"n": 5}).run_id
        worker = subprocess.run(
            [sys.executable, "-m", "keel", "worker", *args, "--stop-when-idle"],
            cwd=project.parent,
            env=command_env(),
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert worker.returncode == 0, worker.stderr
        assert json.loads(app.get_run(run_id).run["output"]) == {"n": 11}
    finally:
        _, err = server.stop() if server is not None else ("", "")
        app.close()
    assert "no API tokens" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_keel_dev_serves_executes_and_resumes_a_run_after_sigkill(project: Path) -> None:
    port = free_port()
    # No --config: langgraph.json in the current folder, as `langgraph dev` reads it.
    first = Command(project, "dev-1", "dev", "--port", str(port))
    app = None
    try:
        first.answering(port)
        status, ok = get(port, "/ok")
        if status != 404:  # the Agent Server's routes, once mounted
            assert (status, ok) == (200, {"ok": True})
        # No token from this machine: Keel's own API answers.
        assert get(port, "/v1/runs?limit=1")[0] == 200
        # The Python API on the same database (SQLite under .keel/ beside the config).
        app = load_project(project)
        assert app.url == f"sqlite:///{project}/.keel/keel.db"
        done = app.submit("built", {"n": 3}).run_id
        finished = wait_until(
            lambda: app.get_run(done).run["status"] == "completed", 60, "dev's worker to run it"
        )
        assert finished and json.loads(app.get_run(done).run["output"]) == {"n": 8}

        crashing = app.submit("slow", {"n": 1}).run_id
        wait_until(lambda: "hold" in steps(project), 60, "the run to reach its held node")
        first.stop(signal.SIGKILL)
        assert first.process.returncode == -signal.SIGKILL
        assert app.get_run(crashing).run["status"] == "running"  # mid-flight when killed
        assert steps(project)[-2:] == ["add", "hold"]
        (project / "gate").touch()

        port = free_port()
        second = Command(project, "dev-2", "dev", "--config", "langgraph.json", "--port", str(port))
        try:
            second.answering(port)
            wait_until(
                lambda: app.get_run(crashing).run["status"] == "completed",
                60,
                "the restarted keel dev to finish the run",
            )
        finally:
            out, err = second.stop()
        assert json.loads(app.get_run(crashing).run["output"]) == {"n": 204}
        # `add` committed before the kill and did not run again; `hold` had not committed.
        assert steps(project) == ["add", "double", "add", "hold", "hold", "double"]
        assert second.process.returncode in (0, -signal.SIGTERM), err
        assert "Traceback" not in err
        assert f"http://127.0.0.1:{port} serves built, compiled, made" in out
        assert "NO TOKEN NEEDED from this machine" in err
    finally:
        first.stop(signal.SIGKILL)
        if app is not None:
            app.close()
