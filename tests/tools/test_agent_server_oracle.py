"""`langgraph dev` as the oracle for the Agent Server protocol's JSON shapes.

The same requests, through the same `langgraph_sdk` client, go to `langgraph dev` (langgraph-api's
in-memory server) and to `keel dev`, both serving one tiny langgraph.json project; every answer
is reduced to its shape (key sets and value types; ids, timestamps and other strings are just
"str") and the two are compared: assistants, threads, runs, every stream mode, an interrupt
resumed by `Command`, and the store.

The oracle is not a dependency of Keel (langgraph-api is Elastic License 2.0, and the test
installs nothing): it runs only where a `langgraph` CLI with `[inmem]` is found at
$KEEL_LANGGRAPH_DEV, /tmp/lgdev/bin/langgraph or on PATH, and is SKIPPED elsewhere (CI's clean
machine included) with that reason. Differences Keel keeps on purpose are listed in `KNOWN`
with why; anything else fails the test with the paths that differ.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.servers import Server, langgraph_cli
from bench.servers import _clean_env as clean_env

CLI = langgraph_cli()
pytestmark = pytest.mark.skipif(
    CLI is None,
    reason="the oracle `langgraph dev` is not installed: set $KEEL_LANGGRAPH_DEV to a `langgraph` "
    'CLI installed with `pip install "langgraph-cli[inmem]"` (in its own venv) to run it',
)

GRAPHS = '''"""The oracle's graphs: `talk` streams a reply and custom data; `ask` then asks."""

import operator
from typing import Annotated, TypedDict

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph, add_messages
from langgraph.types import interrupt


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    log: Annotated[list[str], operator.add]
    answer: str


def model(state: State) -> State:
    get_stream_writer()({"progress": 1})
    llm = GenericFakeChatModel(messages=iter([AIMessage("hello there")]))
    return {"messages": [llm.invoke(state["messages"])], "log": ["model"]}


def ask(state: State) -> State:
    return {"answer": interrupt({"question": "go on?"}), "log": ["ask"]}


def build(with_question: bool):
    g = StateGraph(State)
    g.add_node("model", model)
    g.add_edge(START, "model")
    if with_question:
        g.add_node("ask", ask)
        g.add_edge("model", "ask")
        g.add_edge("ask", END)
    else:
        g.add_edge("model", END)
    return g.compile()


talk = build(False)
ask_graph = build(True)
'''
CONFIG = {
    "dependencies": ["."],
    "graphs": {"talk": "./graphs.py:talk", "ask": "./graphs.py:ask_graph"},
}
HI: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}
MODES: list[Any] = [
    "values",
    "updates",
    "messages-tuple",
    "custom",
    "debug",
    "tasks",
    "checkpoints",
    "events",
]

# A part of a differing path -> why Keel differs there (docs/agent-server.md, "Where Keel differs").
KNOWN: dict[str, str] = {
    "assistants.schemas.input_schema": "the oracle answers null for a graph without an "
    "input schema of its own; Keel gives the state's schema, which is the graph's input",
    "assistants.schemas.output_schema": "the same, for the output",
    "threads.create.interrupts": "Keel's thread always has `interrupts` and `error`",
    "threads.create.error": "the same",
    ".config.configurable: missing": "the oracle adds an empty `configurable` to a thread's "
    "config after its first run; Keel's stays `{}`",
    "kwargs.checkpoint_id: only in Keel": "the run's `checkpoint_id` option, shown as given",
    ".metadata.owner: missing": "the oracle copies a thread's metadata into its runs' and "
    "checkpoints' metadata; Keel stamps only graph_id and assistant_id",
    ".metadata.run_id: missing": "the oracle stamps run_id and thread_id into checkpoint "
    "metadata; Keel's checkpoint metadata carries keel_run_id",
    ".metadata.thread_id: missing": "the same",
    "[1].run_id: missing": "the same, in a messages-tuple event's metadata",
    ".configurable.run_id: missing": "the oracle's checkpoint configs carry run_id; Keel's "
    "(read from the saver) carry what LangGraph's saver keeps",
}
# Keys of open maps (metadata, configurable) that name a server's own internals: not protocol.
INTERNAL = ("langgraph_", "__", "keel_", "created_by", "user_id", "run_attempt")


def project(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "graphs.py").write_text(GRAPHS)
    (folder / "langgraph.json").write_text(json.dumps(CONFIG))
    return folder


def start_langgraph_dev(folder: Path) -> Server:
    assert CLI is not None
    server = Server("langgraph dev", project(folder))
    args = [str(CLI), "dev", "--port", str(server.port), "--no-browser", "--no-reload"]
    server.spawn("langgraph-dev", args, clean_env())
    return server


def start_keel_dev(folder: Path) -> Server:
    import sys

    server = Server("keel dev", project(folder))
    args = [sys.executable, "-m", "keel", "dev", "--port", str(server.port)]
    server.spawn("keel-dev", [*args, "--log-level", "warning"], clean_env())
    return server


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Every server's answers to the same requests, by request name."""
    root = tmp_path_factory.mktemp("oracle")
    found: dict[str, dict[str, Any]] = {}
    for name, start in (("oracle", start_langgraph_dev), ("keel", start_keel_dev)):
        server = start(root / name)
        try:
            server.wait_ready()
            found[name] = converse(server)
        finally:
            server.stop()
    yield found


def events(parts: Iterator[Any]) -> list[tuple[str, Any]]:
    """A stream's events; Keel's last one, `end`, is a documented difference (the oracle's
    stream just closes) and is checked to be last, then left out."""
    got = [(p.event, p.data) for p in parts]
    assert "end" not in [name for name, _ in got[:-1]], got
    return [(name, data) for name, data in got if name != "end"]


def converse(server: Server) -> dict[str, Any]:
    """The requests, in order; the answers by name."""
    from langgraph_sdk import get_sync_client

    client = get_sync_client(url=server.url, api_key=server.api_key)
    out: dict[str, Any] = {}
    out["assistants.search"] = client.assistants.search(graph_id="talk")
    aid = out["assistants.search"][0]["assistant_id"]
    out["assistants.get"] = client.assistants.get(aid)
    out["assistants.schemas"] = client.assistants.get_schemas(aid)
    out["assistants.graph"] = client.assistants.get_graph(aid)

    thread = client.threads.create(metadata={"owner": "oracle"})
    tid = thread["thread_id"]
    out["threads.create"] = thread
    run = client.runs.create(tid, "talk", input=HI)
    out["runs.create"] = run
    out["runs.join"] = client.runs.join(tid, run["run_id"])
    out["runs.get"] = client.runs.get(tid, run["run_id"])
    out["runs.list"] = client.runs.list(tid)
    out["runs.wait"] = client.runs.wait(tid, "talk", input=HI)
    out["threads.get"] = client.threads.get(tid)
    out["threads.search"] = client.threads.search(metadata={"owner": "oracle"})
    out["threads.state"] = client.threads.get_state(tid)
    out["threads.history"] = client.threads.get_history(tid, limit=3)

    streamed = events(
        client.runs.stream(
            client.threads.create()["thread_id"], "talk", input=HI, stream_mode=MODES
        )
    )
    out["stream.names"] = sorted({name for name, _ in streamed})
    out["events.order"] = [data["event"] for name, data in streamed if name == "events"]
    for name in out["stream.names"]:
        out[f"stream.{name}"] = [data for n, data in streamed if n == name][:1]

    asked = client.threads.create()["thread_id"]
    out["interrupt.stream"] = events(
        client.runs.stream(asked, "ask", input=HI, stream_mode=["updates"])
    )
    out["interrupt.state"] = client.threads.get_state(asked)
    out["interrupt.resume"] = client.runs.wait(asked, "ask", command={"resume": "yes"})
    out["interrupt.after"] = client.threads.get_state(asked)

    client.store.put_item(["oracle", "a"], "k", {"v": 1})
    out["store.get"] = client.store.get_item(["oracle", "a"], "k")
    out["store.search"] = client.store.search_items(["oracle"])
    out["store.namespaces"] = client.store.list_namespaces(prefix=["oracle"])
    return out


# -- shapes -------------------------------------------------------------------------------------


def shape(value: Any) -> Any:
    """Key sets and value types: ids, timestamps and other strings are all just "str"."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        # A list's shape is that of its items (those of one kind are one shape).
        kinds: list[Any] = []
        for item in value:
            if (s := shape(item)) not in kinds:
                kinds.append(s)
        return kinds
    if value is None:
        return "null"
    return type(value).__name__


def differences(oracle: Any, keel: Any, path: str = "") -> Iterator[str]:
    if isinstance(oracle, dict) and isinstance(keel, dict):
        for key in sorted(oracle.keys() | keel.keys()):
            where = f"{path}.{key}"
            if str(key).startswith(INTERNAL) and (key not in oracle or key not in keel):
                continue
            if key not in keel:
                yield f"{where}: missing in Keel (oracle: {oracle[key]})"
            elif key not in oracle:
                yield f"{where}: only in Keel ({keel[key]})"
            else:
                yield from differences(oracle[key], keel[key], where)
    elif isinstance(oracle, list) and isinstance(keel, list):
        if len(oracle) == len(keel):
            for i, (a, b) in enumerate(zip(oracle, keel, strict=True)):
                yield from differences(a, b, f"{path}[{i}]")
        elif oracle != keel:
            yield f"{path}: oracle {oracle}, Keel {keel}"
    elif oracle != keel:
        yield f"{path}: oracle {oracle}, Keel {keel}"


def unexplained(found: dict[str, dict[str, Any]], request: str) -> list[str]:
    oracle, keel = found["oracle"][request], found["keel"][request]
    return [
        d
        for d in differences(shape(oracle), shape(keel), request)
        if not any(part in d for part in KNOWN)
    ]


REQUESTS = [
    "assistants.search",
    "assistants.get",
    "assistants.schemas",
    "assistants.graph",
    "threads.create",
    "threads.get",
    "threads.search",
    "threads.state",
    "threads.history",
    "runs.create",
    "runs.join",
    "runs.get",
    "runs.list",
    "runs.wait",
    "interrupt.stream",
    "interrupt.state",
    "interrupt.resume",
    "interrupt.after",
    "store.get",
    "store.search",
    "store.namespaces",
]


@pytest.mark.parametrize("request_name", REQUESTS)
def test_answers_have_the_oracles_shape(
    answers: dict[str, dict[str, Any]], request_name: str
) -> None:
    assert unexplained(answers, request_name) == []


def test_a_stream_of_every_mode_sends_the_oracles_events_in_its_shapes(
    answers: dict[str, dict[str, Any]],
) -> None:
    assert answers["keel"]["stream.names"] == answers["oracle"]["stream.names"]
    # `events`: the same callback events, in the same order.
    assert answers["keel"]["events.order"] == answers["oracle"]["events.order"]
    assert "on_chat_model_stream" in answers["oracle"]["events.order"]
    problems = [
        d
        for name in answers["oracle"]["stream.names"]
        for d in unexplained(answers, f"stream.{name}")
    ]
    assert problems == []
