"""Keel's HTTP API: admit and inspect runs, download artifacts, decide approvals.

Keel's own API is versioned under `/v1` (`API_PREFIX`); the root serves the LangGraph Agent
Server protocol (keel.service.agent_server, docs/agent-server.md), beside `/healthz`, `/readyz`,
`/metrics`, `/slack/actions`, the console at `/ui` and the OpenAPI pages.

Keel's async core lives on the App's own event loop (keel.core.portal), not on uvicorn's. So every
endpoint that touches Keel is a plain `def`: FastAPI runs it in its threadpool, and it calls the
App's blocking facade, which hands the work to the App's loop. A decision only records itself
and wakes a worker; no graph ever runs inside a request.

(No `from __future__ import annotations` here: FastAPI must resolve the per-router dependency
aliases, which are local names, from real annotation objects.)
"""

import logging
import os
from collections.abc import Iterable, Mapping
from importlib import metadata
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, FastAPI, Path, Query, Request, Response
from fastapi.responses import FileResponse
from starlette.middleware.cors import CORSMiddleware

import keel
from keel.core.lifecycle import Status
from keel.runtime.summary import to_dict
from keel.service import models as m
from keel.service.agent_server import agent_server_router
from keel.service.approvals_api import approvals_router
from keel.service.auth import Authenticator, FailureLimit, Principal, load_tokens, no_tokens
from keel.service.console import install_console
from keel.service.docs import install_docs
from keel.service.effects_api import effects_router
from keel.service.errors import (
    API_PREFIX,
    BodyLimit,
    NoNul,
    install,
)
from keel.service.events import events_router
from keel.service.files import artifact_file, download
from keel.service.health import health_router
from keel.service.hooks import hooks_router
from keel.service.metrics import CONTENT_TYPE_LATEST, metrics_for
from keel.service.replay import replay_router
from keel.service.responses import MAX_PAGE, NOT_FOUND, paging, run_url
from keel.service.schedules_api import schedules_router
from keel.service.threads_api import threads_router
from keel.service.tracing import instrument

log = logging.getLogger("keel.service")
SLACK_SECRET_ENV = "KEEL_SLACK_SIGNING_SECRET"
CORS_ENV = "KEEL_CORS_ORIGINS"

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": m.Problem, "description": "No token, or an unknown one."},
    403: {"model": m.Problem, "description": "The token lacks the endpoint's scope."},
    413: {"model": m.Problem, "description": "The request body is over the size limit."},
    422: {"model": m.Problem, "description": "The body or a parameter is invalid."},
    429: {
        "model": m.Problem,
        "description": "Too many failed authentications from this address "
        "(`too_many_failures`): retry after `Retry-After` seconds.",
    },
}
NOT_UPGRADABLE: dict[int | str, dict[str, Any]] = {
    **NOT_FOUND,
    409: {
        "model": m.Problem,
        "description": "The run finished (`run_finished`), or its checkpoint does not fit "
        "that version (`version_mismatch`); a running run is 400.",
    },
}


def create_app(
    keel_app: keel.App,
    *,
    tokens: Mapping[str, Iterable[str]] | None = None,
    max_body_bytes: int = 65536,
    slack_signing_secret: str | None = None,
    failure_limit: FailureLimit | None = None,
    open_loopback: bool = False,
    cors_origins: Iterable[str] | None = None,
) -> FastAPI:
    """The FastAPI app serving `keel_app` (see docs/http.md).

    `tokens` maps bearer tokens to scopes (runs:read, runs:write, approvals:read,
    approvals:write, or * for all); None reads $KEEL_API_TOKENS. A token under 128 bits is
    refused. `failure_limit` bounds failed authentications per client (default: 10 in 60 s,
    then 429 for 60 s). A Slack signing secret (or $KEEL_SLACK_SIGNING_SECRET) adds
    `POST /slack/actions`. `open_loopback` (`keel dev` only) lets a request from this machine
    that sends no token act with every scope (keel.service.auth.Authenticator).
    `cors_origins` are the browser origins (`https://smith.langchain.com`, or `*`) whose pages
    may call the API; None reads $KEEL_CORS_ORIGINS (comma separated); none: same origin only.
    """
    known = load_tokens(tokens)
    if not known and not open_loopback:
        log.warning(no_tokens(from_env=tokens is None))
    origins = cors_origins_from(cors_origins)
    auth = Authenticator(
        known, limit=failure_limit, open_loopback=open_loopback, loopback_origins=origins
    )
    api = FastAPI(
        title="Keel",
        version=_version(),
        description="Admit and inspect crash-safe LangGraph runs; decide their approvals. "
        f"Keel's own API is under {API_PREFIX}. People use the console at /ui.",
        responses=ERRORS,
        # Served from local assets (keel.service.docs): the defaults load from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    api.state.keel = keel_app
    install(api)
    api.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    api.add_middleware(NoNul)
    if origins:
        # Added after BodyLimit and NoNul, so outside them: a preflight is answered before any
        # other check, and a refusal (413, 400, 401) still carries the headers a browser needs
        # to read it.
        api.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["*"],
            # The SDKs send x-api-key or Authorization, and Last-Event-ID to resume a stream.
            allow_headers=["*"],
            # The JS SDK reads a new run's id from Content-Location.
            expose_headers=["Content-Location", "Location"],
        )
    api.include_router(health_router(keel_app))
    api.include_router(keel_router(keel_app, auth), prefix=API_PREFIX)
    # The LangGraph Agent Server protocol at the root: a client needs only the base URL. (After
    # Keel's own routes: both name routes `get_run` and `get_thread`, and `url_for` takes the
    # first.)
    api.include_router(agent_server_router(keel_app, auth))
    _metrics_route(api, keel_app)
    install_docs(api)
    install_console(api, keel_app, auth)
    instrument(api)
    api.include_router(hooks_router(keel_app))
    secret = slack_signing_secret or os.environ.get(SLACK_SECRET_ENV) or None
    if secret:
        try:
            from keel.service.slack import slack_router
        except ImportError as exc:
            raise ImportError(
                "a Slack signing secret is configured, but Slack actions are not available: "
                f"importing keel.service.slack.slack_router failed ({exc})"
            ) from exc
        api.include_router(slack_router(keel_app, secret))
    return api


def cors_origins_from(given: Iterable[str] | None) -> list[str]:
    """The CORS origins: `given`, or $KEEL_CORS_ORIGINS (comma separated) when None."""
    if given is None:
        given = os.environ.get(CORS_ENV, "").split(",")
    return [origin.strip().rstrip("/") for origin in given if origin.strip()]


def keel_router(keel_app: keel.App, auth: Authenticator) -> APIRouter:
    """Keel's own JSON API (runs, threads, approvals, effects), mounted at `API_PREFIX`."""
    router = APIRouter()
    parts = (
        runs_router(keel_app, auth),
        threads_router(keel_app, auth),
        schedules_router(keel_app, auth),
        events_router(keel_app, auth),
        replay_router(keel_app, auth),
        approvals_router(keel_app, auth),
        effects_router(keel_app, auth),
    )
    # Their routes in one flat router (as agent_server_router's): FastAPI walks each level of
    # included routers at every request, and the Agent Server's requests walk this one first.
    for part in parts:
        router.routes.extend(part.routes)
    return router


def _metrics_route(api: FastAPI, keel_app: keel.App) -> None:
    metrics = metrics_for(keel_app)

    # Unauthenticated like /healthz: scrapers rarely carry tokens. It shows counts and
    # workflow names, never ids or payloads; keep the port private or put a proxy in front.
    @api.get("/metrics", tags=["health"], response_class=Response, include_in_schema=True)
    def prometheus_metrics() -> Response:
        """Prometheus metrics (text exposition format); see docs/operations.md."""
        return Response(metrics.scrape(), media_type=CONTENT_TYPE_LATEST)


def _version() -> str:
    try:
        return metadata.version("keel")
    except metadata.PackageNotFoundError:
        return "0"


# -- runs ---------------------------------------------------------------------------------


def runs_router(keel_app: keel.App, auth: Authenticator) -> APIRouter:
    router = APIRouter(tags=["runs"])
    Reader = Annotated[Principal, Depends(auth.require("runs:read"))]
    Writer = Annotated[Principal, Depends(auth.require("runs:write"))]
    RunId = Annotated[str, Path(description="The run's id.", max_length=200)]

    @router.post(
        "/runs",
        status_code=201,
        response_model=m.Submitted,
        responses={
            200: {"model": m.Submitted, "description": "That job was already admitted: its run."},
            201: {"description": "A new run, queued for a worker."},
            409: {"model": m.Problem, "description": "if_exists=error and other input ran."},
        },
    )
    def submit_run(
        body: m.SubmitIn, request: Request, response: Response, _: Writer
    ) -> m.Submitted:
        """Admit a run (idempotent: the same job, input and version return the same run)."""
        row = keel_app.submit(
            body.workflow,
            job_id=body.job_id,
            input=body.input,
            version=body.version,
            rerun=body.rerun,
            if_exists=body.if_exists,
            after=body.after,
            not_before=body.not_before,
            webhook=body.webhook,
            webhook_on=body.webhook_on,
        )
        url = run_url(request, row["run_id"])
        response.status_code = 201 if row.created else 200
        if row.created:
            response.headers["Location"] = url
        return m.Submitted(**m.run_model(row, url).model_dump(), other_runs=row.other_runs)

    @router.get("/runs", response_model=m.RunPage)
    def list_runs(
        request: Request,
        _: Reader,
        workflow: str | None = None,
        status: Status | None = None,
        job_id: str | None = None,
        since: Annotated[
            str | None,
            Query(description="Admitted at or after: 2h, 7d (ago) or an ISO time."),
        ] = None,
        until: Annotated[
            str | None, Query(description="Admitted before: 2h, 7d (ago) or an ISO time.")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> m.RunPage:
        """Runs, newest first; `next_offset` is null on the last page."""
        rows = keel_app.list_runs(
            workflow=workflow,
            status=status.value if status else None,
            job_id=job_id,
            since=since,
            until=until,
            limit=limit + 1,  # one more tells whether there is a next page
            offset=offset,
        )
        now = keel_app.database_now()
        return m.RunPage(
            runs=[m.run_model(r, run_url(request, r["run_id"]), now) for r in rows[:limit]],
            **paging(offset, limit, len(rows)),
        )

    @router.get("/runs/{run_id}", response_model=m.RunDetail, responses=NOT_FOUND)
    def get_run(run_id: RunId, request: Request, _: Reader) -> m.RunDetail:
        """Status, decision, termination reason, timeline, effects, waits, artifacts."""
        details = keel_app.get_run(run_id)
        url = run_url(request, run_id)
        files = [
            m.Artifact(
                name=a.name,
                size=a.size,
                download_url=str(request.url_for("download_artifact", run_id=run_id, name=a.name)),
            )
            for a in details.artifacts
        ]
        return m.run_detail(
            details.annotated_run,
            url=url,
            run_url=url,
            timeline=details.timeline,
            effects=details.effects,
            waits=details.waits,
            notifications=details.notifications,
            intents=details.intents,
            artifacts=files,
            failure=details.failure,
        )

    @router.get("/runs/{run_id}/summary", response_model=m.RunSummary, responses=NOT_FOUND)
    def run_summary(run_id: RunId, _: Reader) -> m.RunSummary:
        """Outcome and why, time per node (queued, running, waiting, lost), attempts and
        takeovers, effects, waits and who decided them, artifacts, crashes and resumes."""
        return m.RunSummary.model_validate(to_dict(keel_app.summary(run_id)))

    @router.get(
        "/runs/{run_id}/artifacts/{name}",
        response_class=FileResponse,
        responses={**NOT_FOUND, 200: {"description": "The file.", "content": {"*/*": {}}}},
    )
    def download_artifact(
        run_id: RunId,
        name: Annotated[str, Path(max_length=200)],
        request: Request,
        _: Reader,
    ) -> Response:
        """One file of the run's artifacts folder (a `Range` of it: 206; 400 invalid_range,
        416 range_not_satisfiable)."""
        return download(artifact_file(keel_app, run_id, name), name, request)

    @router.post("/runs/{run_id}/cancel", response_model=m.Run, responses=NOT_FOUND)
    def cancel_run(
        run_id: RunId,
        request: Request,
        principal: Writer,
        body: Annotated[m.CancelIn | None, Body()] = None,
    ) -> m.Run:
        """Cancel a run: queued or waiting at once, running at its next step boundary."""
        row = keel_app.cancel(run_id, by=(body.by if body else None) or principal.label)
        return m.run_model(row, run_url(request, run_id))

    @router.post(
        "/runs/{run_id}/resume",
        response_model=m.Run,
        responses={**NOT_FOUND, 409: {"model": m.Problem, "description": "The run is not failed."}},
    )
    def resume_run(
        run_id: RunId,
        request: Request,
        principal: Writer,
        body: Annotated[m.ResumeIn | None, Body()] = None,
    ) -> m.Run:
        """Queue a failed run again: it continues from its last checkpoint with its ledger, so an
        effect it recorded is not performed again. 409 unless the run is failed."""
        keel_app.resume(run_id, by=(body.by if body else None) or principal.label)
        details = keel_app.get_run(run_id)
        row = details.annotated_run
        return m.run_model(row, run_url(request, run_id))

    @router.post("/runs/{run_id}/upgrade", response_model=m.Run, responses=NOT_UPGRADABLE)
    def upgrade_run(run_id: RunId, body: m.UpgradeIn, request: Request, principal: Writer) -> m.Run:
        """Move a queued or waiting run to another registered version of its workflow (409
        `version_mismatch` when its checkpoint does not fit that version's graph)."""
        keel_app.upgrade_run(run_id, to=body.to, by=body.by or principal.label)
        details = keel_app.get_run(run_id)  # its stranded flag, as now derived
        row = details.annotated_run
        return m.run_model(row, run_url(request, run_id))

    return router
