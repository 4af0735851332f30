"""`keel dev`, and the `--config langgraph.json` of `keel serve` and `keel worker`.

`keel dev` is `langgraph dev` made durable: one process migrates the project's database (SQLite
under `.keel/` beside the config unless told otherwise), serves the HTTP API and executes runs
with in-process workers on the App's own event loop, where the API's submissions are handed to
them in the commit that admits them (keel.runtime.handoff). A request from this machine needs no
token there, and the startup lines say so: `keel serve` never opens that door. See
docs/projects.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from keel.cli.guard import BAD_USAGE, fail, say, warn
from keel.cli.render import redact
from keel.runtime.app import App
from keel.runtime.loading import load_app
from keel.runtime.project import CONFIG_NAME, KEEL_KEY, load_project, project_of
from keel.runtime.worker import DEFAULT_CONCURRENCY, Worker, new_worker_id

log = logging.getLogger("keel.dev")

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        show_default=False,
        help="A LangGraph CLI config (langgraph.json) whose graphs to serve, instead of APP.",
    ),
]
ProjectDbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        show_default=False,
        help="With --config: the database URL (env: KEEL_DATABASE_URL; default: "
        "sqlite:///<config folder>/.keel/keel.db).",
    ),
]
CorsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--cors-origin",
        metavar="ORIGIN",
        show_default=False,
        help="A browser origin whose pages may call the API (repeatable; `*` for any; "
        "env: KEEL_CORS_ORIGINS, comma separated). Default: same origin only.",
    ),
]
DEV_CORS_ORIGINS = ("https://smith.langchain.com", "http://localhost:3000")
"""The origins `keel dev` lets call it when none is given: LangGraph Studio, and agent-chat-ui's
development server."""
PROJECT_HINT = "with --db URL, or start `keel dev` on the project once"
"""What to do when a project's database is not there yet (`check_database`'s hint)."""


def chosen_app(app: str | None, config: Path | None, db: str | None) -> App:
    """The App of `keel serve`/`keel worker`: APP's (`module:attribute`), or the one serving
    the project at `--config` on `--db`; exactly one of the two."""
    if app is not None and config is not None:
        fail("give APP or --config, not both", BAD_USAGE)
    if app is None and config is None:
        fail("give APP (MODULE:ATTRIBUTE of a keel.App) or --config langgraph.json", BAD_USAGE)
    if config is None:
        assert app is not None
        if db is not None:
            fail("--db goes with --config: APP's App names its own database", BAD_USAGE)
        return load_app(app)
    return load_project(config, url=db)


def dev(
    config: Annotated[
        Path, typer.Option("--config", help="The project's LangGraph CLI config.")
    ] = Path(CONFIG_NAME),
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 2024,
    workers: Annotated[int, typer.Option(min=1, help="Workers in this process.")] = 1,
    concurrency: Annotated[
        int, typer.Option(min=1, help="Runs each worker executes at once.")
    ] = 10,
    db: ProjectDbOption = None,
    grace: Annotated[
        float,
        typer.Option(
            help="Seconds running runs get to finish at shutdown; the rest resume "
            "at the next start."
        ),
    ] = 5.0,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--cors-origin",
            metavar="ORIGIN",
            show_default=False,
            help="A browser origin whose pages may call the API (repeatable; `*` for any; "
            "env: KEEL_CORS_ORIGINS). Default: Studio (https://smith.langchain.com) and "
            "agent-chat-ui (http://localhost:3000).",
        ),
    ] = None,
) -> None:
    """Serve a langgraph.json project and execute its runs, in this one process: durable.

    The LangGraph API at the root, Keel's under /v1, workers in-process, the database migrated
    (SQLite under .keel/ beside the config by default). Requests from this machine need no
    token: for development only (tokens in $KEEL_API_TOKENS still work, and other machines
    need one).
    """
    keel_app = load_project(config, url=db)
    try:
        applied = keel_app.migrate()
        # The first worker's id: it holds the graphs' shapes as that worker will.
        worker_id = new_worker_id()
        changed = _changed_graphs(keel_app, worker_id)
    except BaseException:
        keel_app.close()
        raise
    if changed:
        keel_app.close()
        fail(_changed_line(changed), BAD_USAGE)
    project = project_of(keel_app)
    assert project is not None
    graphs = ", ".join(entry.graph_id for entry in project.graphs)
    where = redact(keel_app.url)
    plural = "s" if workers > 1 else ""

    if applied:
        say(f"keel dev: migrated {where} to schema version {int(applied[-1][:4])}")

    def started() -> None:
        say(
            f"keel dev: http://{_url_host(host)}:{port} serves {graphs} from {project.path}; "
            f"{workers} worker{plural} in this process ({concurrency} runs at once each) "
            f"on {where}; API docs at /docs, console at /ui"
        )
        if project.auth is not None:
            # The project's own auth judges the Agent Server routes, loopback or not.
            say(f"keel dev: the Agent Server routes authenticate with {project.auth['path']}")
        warn(
            "NO TOKEN NEEDED from this machine: every request from a loopback address acts "
            "with all scopes"
            + (" on Keel's own API (/v1), the console and /metrics" if project.auth else "")
            + ". For development only: never put keel dev behind a proxy or on a "
            "shared host (use `keel serve` with $KEEL_API_TOKENS)"
        )
        if not _loopback_host(host):
            warn(f"listening on {host}: requests from other machines still need a token")

    serve_with_workers(
        keel_app,
        host=host,
        port=port,
        workers=workers,
        concurrency=concurrency,
        grace=grace,
        open_loopback=True,
        started=started,
        first_worker_id=worker_id,
        cors_origins=cors_origin or dev_cors_origins(),
    )


def dev_cors_origins() -> list[str]:
    """`keel dev`'s CORS origins without --cors-origin: $KEEL_CORS_ORIGINS's when set, else
    Studio's and agent-chat-ui's (`DEV_CORS_ORIGINS`)."""
    from keel.service.api import cors_origins_from  # FastAPI only when serving

    return cors_origins_from(None) or list(DEV_CORS_ORIGINS)


def serve_with_workers(
    keel_app: App,
    *,
    host: str,
    port: int,
    workers: int = 0,
    concurrency: int = DEFAULT_CONCURRENCY,
    grace: float = 5.0,
    open_loopback: bool = False,
    header_timeout: str | None = None,
    body_timeout: str | None = None,
    started: Callable[[], None] | None = None,
    first_worker_id: str | None = None,
    cors_origins: list[str] | None = None,
) -> None:
    """Serve `keel_app`'s HTTP API on uvicorn with `workers` Workers on the App's own loop,
    until SIGINT/SIGTERM; then the workers drain (`grace`) and the App closes.

    A worker that stops by itself (its database refused it, a clock too far off) stops the
    server: a `keel dev` that answers but executes nothing would look alive and be stuck.
    """
    import uvicorn

    from keel.service.api import create_app
    from keel.service.read_timeouts import protocol_with, read_timeouts

    api = create_app(keel_app, open_loopback=open_loopback, cors_origins=cors_origins)
    server = uvicorn.Server(
        uvicorn.Config(
            api,
            host=host,
            port=port,
            log_level=logging.getLevelName(logging.getLogger().level).lower(),
            ws="none",
            http=protocol_with(*read_timeouts(header_timeout, body_timeout)),
            # uvicorn's records go through Keel's handler (keel.core.logs).
            log_config=None,
        )
    )

    def give_up() -> None:
        server.should_exit = True

    crew = _Crew(keel_app, workers, concurrency, grace, on_failure=give_up, first=first_worker_id)
    inner = api.router.lifespan_context

    async def announce() -> None:
        # Said once the socket is bound, so that the lines mean "listening", not "about to".
        while not server.started:  # noqa: ASYNC110 - uvicorn's flag, no event to wait on
            await asyncio.sleep(0.02)
        if started is not None:
            started()

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        # uvicorn re-raises the SIGTERM/SIGINT it caught once it has drained, so nothing after
        # `server.run()` runs on a signal: the lifespan's exit stops the workers and closes.
        try:
            async with inner(app) as state:
                crew.start()
                announcing = asyncio.create_task(announce())
                try:
                    yield state
                finally:
                    announcing.cancel()
                    await crew.stop()
        finally:
            # close() blocks on the App's own loop; keep uvicorn's loop free meanwhile.
            await asyncio.to_thread(keel_app.close)

    api.router.lifespan_context = lifespan
    try:
        server.run()
    finally:
        keel_app.close()
    if crew.failed:
        raise typer.Exit(1)


class _Crew:
    """Workers of this process, each a task on the App's loop (where its runs' nodes run)."""

    def __init__(
        self,
        keel_app: App,
        count: int,
        concurrency: int,
        grace: float,
        *,
        on_failure: Callable[[], None],
        first: str | None = None,
    ) -> None:
        self.keel_app = keel_app
        self.count = count
        self.concurrency = concurrency
        self.grace = grace
        self.on_failure = on_failure
        self.first = first
        self.failed = False
        self._stopping = False
        self._running: list[tuple[Worker, concurrent.futures.Future[Any]]] = []

    def start(self) -> None:
        runtime = self.keel_app.aio.runtime
        for number in range(self.count):
            worker_id = self.first if number == 0 else None
            worker = Worker(
                runtime, concurrency=self.concurrency, grace=self.grace, worker_id=worker_id
            )
            future = asyncio.run_coroutine_threadsafe(worker.run(), runtime.portal.loop)
            future.add_done_callback(self._ended)
            self._running.append((worker, future))

    def _ended(self, future: concurrent.futures.Future[Any]) -> None:
        if self._stopping:
            return
        error = None if future.cancelled() else future.exception()
        log.error(
            "a worker stopped while the server runs (%s): stopping the server",
            f"{type(error).__name__}: {error}" if error else "it ended",
            exc_info=error,
        )
        self.failed = True
        self.on_failure()

    async def stop(self) -> None:
        """Drain every worker: no new claims, running runs get `grace`, the rest give their
        leases back (they resume at the next start, from their last checkpoint)."""
        self._stopping = True
        if not self._running:
            return
        loop = self.keel_app.aio.runtime.portal.loop
        for worker, _ in self._running:
            loop.call_soon_threadsafe(worker.stop)
        ended = await asyncio.gather(
            *(asyncio.wrap_future(future) for _, future in self._running), return_exceptions=True
        )
        for (worker, _), outcome in zip(self._running, ended, strict=True):
            log.info("worker %s stopped: %s", worker.worker_id, outcome)


def _changed_graphs(keel_app: App, worker_id: str) -> dict[str, str]:
    """`workflow@version` -> what differs, for each graph whose structure is not the one its
    version was first served with on this database (what the workers would refuse)."""
    runtime = keel_app.aio.runtime

    async def look() -> dict[str, str]:
        await runtime.open()
        return await runtime.hold_shapes(worker_id)

    return runtime.portal.call(look())


def _changed_line(changed: dict[str, str]) -> str:
    """Editing a graph between two `keel dev`s is the usual case: say what to do about it in
    the project's own terms, before serving a graph whose runs no worker would execute."""
    said, bumps = [], {}
    for key, why in sorted(changed.items()):
        name, _, version = key.rpartition("@")
        said.append(f"graph {name!r} changed since version {version} was first served ({why})")
        bumps[name] = str(int(version) + 1) if version.isdigit() else f"{version}.1"
    section = json.dumps({KEEL_KEY: {"versions": bumps}})[1:-1]
    return (
        f"{'; '.join(said)}: no worker would execute its runs. Give it a new version in "
        f"{CONFIG_NAME} ({section}) and move unfinished runs with `keel runs upgrade RUN --to "
        "VERSION`, or start afresh without the database (.keel/ beside the config)"
    )


def _loopback_host(host: str) -> bool:
    # Imported here: the service (FastAPI and its models) is a third of the CLI's start-up, and
    # every command but `serve` and `dev` does without it.
    from keel.service.auth import is_loopback

    return host == "localhost" or is_loopback(host)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
