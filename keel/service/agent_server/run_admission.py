"""Admitting an Agent Server run: the request `body` (`RunIn`) made a Keel run, durably.

`admit` is what every run-creating route of runs.py shares (on a thread or stateless, in the
background, waited for, streamed): the auth handler's `create_run` check, the assistant's config
and context merged under the run's, the thread's metadata in each checkpoint's, and
`App.submit`. The protocol's options a Keel run has no field for (the stream modes asked, which
`join_stream` streams by default) are kept in the config Keel stores with the run, under
`keel_kwargs`, and shown in the run's `kwargs`.
"""

from __future__ import annotations

from typing import Any

from keel.core.errors import ThreadNotFound
from keel.core.store.base import Row
from keel.core.threads import new_id
from keel.runtime.app import App
from keel.service.agent_server import stream
from keel.service.agent_server.assistant_book import resolve_for_run
from keel.service.agent_server.authz import Gate, matches
from keel.service.agent_server.run_bodies import KWARGS, RunIn, names, paused_statically
from keel.service.agent_server.shapes import run_metadata_of, thread_shape
from keel.service.auth import Principal
from keel.service.errors import Refused


def admit(
    keel_app: App, auth: Gate, body: RunIn, thread_id: str | None, principal: Principal
) -> tuple[Row, str, list[str]]:
    """Admit the run `body` asks for (on a new thread when `thread_id` is None); the
    run's row, its thread, and the stream modes asked."""
    assistant = resolve_for_run(keel_app, body.assistant_id)
    graph, version = assistant.graph, assistant.version
    asked: dict[str, Any] = {
        "thread_id": thread_id,
        "assistant_id": body.assistant_id,
        "metadata": dict(body.metadata or {}),
        "multitask_strategy": body.multitask_strategy or "enqueue",
        "if_not_exists": body.if_not_exists or "reject",
        "kwargs": body.model_dump(exclude={"assistant_id", "metadata"}),
    }
    filters = auth.check_sync(principal, "threads", "create_run", asked)
    run_metadata = {**assistant.metadata, **(asked.get("metadata") or {})}
    try:
        modes = stream.parse_modes(body.stream_mode, ["values"])
    except ValueError as exc:
        raise Refused(422, "invalid_request", str(exc)) from None
    if body.after_seconds is not None and not body.after_seconds >= 0:
        raise Refused(422, "invalid_request", "after_seconds cannot be negative")
    stamp = {"graph_id": graph, "assistant_id": assistant.assistant_id}
    thread = None
    stateless = thread_id is None
    if thread_id is None:
        thread_id = new_id()
    else:
        try:
            thread = keel_app.get_thread(thread_id)
        except ThreadNotFound:
            if body.if_not_exists != "create":
                raise
        shown = None if thread is None else thread_shape(thread)["metadata"]
        if shown is not None and filters and not matches(shown, filters):
            raise ThreadNotFound(f"no thread {thread_id!r}")
    config = assistant.run_config(dict(body.config or {}))
    given = dict(config.get("configurable") or {})
    # Where the run reads and writes is the thread's, not the caller's to set: a
    # checkpoint there would be where every execution of the run started over from.
    fork = given.pop("checkpoint_id", None)
    for key in ("thread_id", "checkpoint_ns", "checkpoint_map"):
        given.pop(key, None)
    config["configurable"] = {**given, **stamp}
    # As the Agent Server: the thread's metadata (an owner...) in each checkpoint's too.
    thread_meta = {} if thread is None else run_metadata_of(thread)
    config["metadata"] = {
        **thread_meta,
        **(config.get("metadata") or {}),
        **run_metadata,
        **stamp,
    }
    config[KWARGS] = {
        "stream_mode": modes,
        "subgraphs": bool(body.stream_subgraphs),
        "temporary": stateless,
        "durability": body.durability or "sync",
        **({"webhook": body.webhook} if body.webhook else {}),
        "interrupt_before": names(body.interrupt_before),
        "interrupt_after": names(body.interrupt_after),
    }
    checkpoint_id = (
        body.checkpoint_id or (body.checkpoint or {}).get("checkpoint_id") or fork or None
    )
    command = body.command
    # Without input or command, a static pause goes on, as in LangGraph.
    if command is None and body.input is None and thread is not None:
        command = {"resume": None} if paused_statically(keel_app, thread) else None
    row = keel_app.submit(
        graph,
        body.input,
        thread_id=thread_id,
        command=command,
        config=config,
        context=assistant.run_context(body.context),
        checkpoint_id=checkpoint_id,
        multitask_strategy=body.multitask_strategy or "enqueue",
        # LangGraph's view: a run paused on interrupt() has returned, so new input ends it
        # (the strategy then weighs the thread's other runs) rather than waiting behind it.
        end_paused=True,
        # A thread this run makes has the run's metadata (an owner an auth handler put).
        metadata={**run_metadata, **stamp},
        # The thread found above must still be there when the run is admitted: deleted
        # meanwhile, it is not made again (404, as `if_not_exists` "reject" says).
        if_not_exists="create" if thread is None else "reject",
        # Every run's thread says which graph and assistant ran last, as LangGraph
        # Platform's does: merged in the admission's own commit.
        merge_metadata=stamp,
        version=version,
        # Admitted now, claimed once the database's clock reaches it (keel.core.timers).
        after=body.after_seconds or None,
        # Told when the run ends, with this protocol's run as the body (docs/webhooks.md).
        webhook=body.webhook or None,
        webhook_format="agent_server",
    )
    return dict(row), thread_id, modes
