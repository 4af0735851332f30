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

import functools
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.responses import FileResponse
from starlette.middleware.cors import CORSMiddleware

import keel
from keel.core.errors import InvalidId, RunFinished, WrongWaitKind
from keel.core.lifecycle import Status
from keel.core.waits import DecisionResult
from keel.runtime.summary import to_dict
from keel.service import models as m
from keel.service.agent_server import agent_server_router
from keel.service.auth import Authenticator, FailureLimit, Principal, load_tokens, no_tokens
from keel.service.console import install_console
from keel.service.docs import install_docs
from keel.service.effects_api import effects_router
from keel.service.errors import (
    API_PREFIX,
    DECISION_CONFLICT,
    BodyLimit,
    Refused,
    conflict_message,
    conflicts,
    install,
    keel_message,
    keel_status,
)
from keel.service.events import events_router
from keel.service.files import artifact_file
from keel.service.health import health_router
from keel.service.hooks import hooks_router
from keel.service.metrics import CONTENT_TYPE_LATEST, metrics_for
from keel.service.replay import replay_router
from keel.service.schedules_api import schedules_router
from keel.service.threads_api import threads_router
from keel.service.tracing import instrument

log = logging.getLogger("keel.service")
SLACK_SECRET_ENV = "KEEL_SLACK_SIGNING_SECRET"
CORS_ENV = "KEEL_CORS_ORIGINS"
MAX_PAGE = 500
_APPROVAL_ID = re.compile(r"[a-z0-9][a-z0-9._-]*")

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
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    400: {"model": m.Problem, "description": "A malformed id."},
    404: {"model": m.Problem, "description": "No such run, approval or artifact."},
}
NOT_UPGRADABLE: dict[int | str, dict[str, Any]] = {
    **NOT_FOUND,
    409: {
        "model": m.Problem,
        "description": "The run finished (`run_finished`), or its checkpoint does not fit "
        "that version (`version_mismatch`); a running run is 400.",
    },
}


def _refused_with(why: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI responses of an answer to a wait: not found, or refused (409) and why."""
    return {**NOT_FOUND, 409: {"model": m.Problem, "description": why}}


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
    auth = Authenticator(known, limit=failure_limit, open_loopback=open_loopback)
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
    origins = cors_origins_from(cors_origins)
    if origins:
        # Added after BodyLimit, so outside it: a preflight is answered before any other
        # check, and a refusal (413, 401) still carries the headers a browser needs to read it.
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


def _run_url(request: Request, run_id: str) -> str:
    return str(request.url_for("get_run", run_id=run_id))


def _paging(offset: int, limit: int, fetched: int) -> dict[str, Any]:
    """A page's limit, offset and next offset, from the `fetched` rows (one more than a page
    when there is a next one)."""
    return {
        "limit": limit,
        "offset": offset,
        "next_offset": offset + limit if fetched > limit else None,
    }


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
        url = _run_url(request, row["run_id"])
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
            runs=[m.run_model(r, _run_url(request, r["run_id"]), now) for r in rows[:limit]],
            **_paging(offset, limit, len(rows)),
        )

    @router.get("/runs/{run_id}", response_model=m.RunDetail, responses=NOT_FOUND)
    def get_run(run_id: RunId, request: Request, _: Reader) -> m.RunDetail:
        """Status, decision, termination reason, timeline, effects, waits, artifacts."""
        details = keel_app.get_run(run_id)
        url = _run_url(request, run_id)
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
        _: Reader,
    ) -> FileResponse:
        """One file of the run's artifacts folder."""
        return FileResponse(artifact_file(keel_app, run_id, name), filename=name)

    @router.post("/runs/{run_id}/cancel", response_model=m.Run, responses=NOT_FOUND)
    def cancel_run(
        run_id: RunId,
        request: Request,
        principal: Writer,
        body: Annotated[m.CancelIn | None, Body()] = None,
    ) -> m.Run:
        """Cancel a run: queued or waiting at once, running at its next step boundary."""
        row = keel_app.cancel(run_id, by=(body.by if body else None) or principal.label)
        return m.run_model(row, _run_url(request, run_id))

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
        return m.run_model(row, _run_url(request, run_id))

    @router.post("/runs/{run_id}/upgrade", response_model=m.Run, responses=NOT_UPGRADABLE)
    def upgrade_run(run_id: RunId, body: m.UpgradeIn, request: Request, principal: Writer) -> m.Run:
        """Move a queued or waiting run to another registered version of its workflow (409
        `version_mismatch` when its checkpoint does not fit that version's graph)."""
        keel_app.upgrade_run(run_id, to=body.to, by=body.by or principal.label)
        details = keel_app.get_run(run_id)  # its stranded flag, as now derived
        row = details.annotated_run
        return m.run_model(row, _run_url(request, run_id))

    return router


# -- approvals -----------------------------------------------------------------------------


def approvals_router(keel_app: keel.App, auth: Authenticator) -> APIRouter:
    router = APIRouter(tags=["approvals"])
    Reader = Annotated[Principal, Depends(auth.require("approvals:read"))]
    Writer = Annotated[Principal, Depends(auth.require("approvals:write"))]
    ApprovalId = Annotated[str, Path(description="The approval's (wait's) id.", max_length=200)]
    IdempotencyKey = Annotated[
        str | None, Header(min_length=1, max_length=200, description="Deduplication key.")
    ]

    @router.get("/approvals", response_model=m.ApprovalPage)
    def list_approvals(
        request: Request,
        _: Reader,
        status: Annotated[
            Literal["pending"], Query(description="Only open waits are listed here.")
        ] = "pending",
        kind: Annotated[
            str, Query(max_length=50, description="approval, effect, interrupt, or all.")
        ] = "approval",
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> m.ApprovalPage:
        """Open waits, oldest deadline first (decided ones are on their run's page)."""
        want = offset + limit + 1
        fetch = want
        while True:
            rows = keel_app.pending_waits(limit=fetch)
            matching = [w for w in rows if kind == "all" or w["kind"] == kind]
            if len(matching) >= want or len(rows) < fetch:
                break
            fetch *= 4
        page = matching[offset : offset + limit + 1]
        return m.ApprovalPage(
            approvals=[m.approval_model(w, _run_url(request, w["run_id"])) for w in page[:limit]],
            **_paging(offset, limit, len(page)),
        )

    @router.get("/approvals/{approval_id}", response_model=m.Approval, responses=NOT_FOUND)
    def get_approval(approval_id: ApprovalId, request: Request, _: Reader) -> m.Approval:
        """One wait, open or decided."""
        wait = keel_app.get_wait(_checked(approval_id))
        return m.approval_model(wait, _run_url(request, wait["run_id"]))

    @router.post(
        "/approvals/{approval_id}/decision",
        response_model=m.DecisionOut,
        responses=_refused_with(
            "Another decision was recorded first (`decision_conflict`), or the run finished or "
            "the wait expired (`run_finished`); `approval` shows what was recorded instead."
        ),
    )
    def decide(
        approval_id: ApprovalId,
        body: m.DecisionIn,
        request: Request,
        principal: Writer,
        idempotency_key: IdempotencyKey = None,
    ) -> m.DecisionOut:
        """Approve or reject; the first decision wins. The same decision again is told it was
        recorded (200), another one is refused (409 `decision_conflict`)."""
        approve = body.decision == "approve"
        record = keel_app.approve if approve else keel_app.reject
        wanted = "approved" if approve else "rejected"
        return _answer(record, wanted, approval_id, body, request, principal, idempotency_key)

    @router.post(
        "/approvals/{approval_id}/resolution",
        response_model=m.DecisionOut,
        responses=_refused_with("Not an in-doubt effect, finished, or answered otherwise first."),
    )
    def resolve_effect(
        approval_id: ApprovalId,
        body: m.ResolutionIn,
        request: Request,
        principal: Writer,
        idempotency_key: IdempotencyKey = None,
    ) -> m.DecisionOut:
        """Say whether an in-doubt effect reached the provider; the first answer wins."""
        record = functools.partial(
            keel_app.resolve_effect, performed=body.performed, result=body.result
        )
        wanted = "performed" if body.performed else "not_performed"
        return _answer(record, wanted, approval_id, body, request, principal, idempotency_key)

    def _answer(
        record: Callable[..., DecisionResult],
        wanted: str,
        approval_id: str,
        body: m.DecisionIn | m.ResolutionIn,
        request: Request,
        principal: Principal,
        idempotency_key: str | None,
    ) -> m.DecisionOut:
        """Record an answer (`wanted`, as the wait records it); the wait as it is now, whether
        this call recorded it. A refusal carries the wait too: the run finished, the wait takes
        another kind of answer, or another answer won (a conflict: the CLI's exit 1)."""
        wait = keel_app.get_wait(_checked(approval_id))
        run_url = _run_url(request, wait["run_id"])
        action_id = idempotency_key or body.action_id
        try:
            result = record(
                wait["run_id"],
                wait_id=approval_id,
                by=body.by or principal.label,
                principal=principal.label,
                action_id=action_id,
                comment=body.comment,
                channel="http",
            )
        except (RunFinished, WrongWaitKind) as exc:
            status, code = keel_status(exc)
            now = m.approval_fields(keel_app.get_wait(approval_id), run_url)
            raise Refused(status, code, keel_message(exc), approval=now) from None
        fields = m.approval_fields(result.wait, run_url)
        if conflicts(result, wanted, action_id):
            raise Refused(
                *DECISION_CONFLICT, conflict_message(result.wait, wanted), approval=fields
            )
        return m.DecisionOut(**fields, recorded=result.recorded)

    return router


def _checked(approval_id: str) -> str:
    if not _APPROVAL_ID.fullmatch(approval_id):
        raise InvalidId(
            f"approval_id {approval_id[:60]!r} may only contain lowercase letters, digits, '.', "
            "'_' and '-'"
        )
    return approval_id
