"""Finding a run's artifact for a download: one rule for the HTTP API and the console."""

from __future__ import annotations

import os
from pathlib import Path

from fastapi.responses import FileResponse, JSONResponse
from starlette.requests import Request
from starlette.responses import MalformedRangeHeader, RangeNotSatisfiable

from keel.core.artifacts import RunArtifacts, artifact_name
from keel.core.errors import InvalidId
from keel.core.ids import validate_run_id
from keel.runtime.app import App
from keel.service.errors import Refused, problem


def artifact_file(keel_app: App, run_id: str, name: str) -> Path:
    """The file `name` of the run's artifacts; Refused (400/404) for anything else."""
    validate_run_id(run_id)
    keel_app.get_run(run_id)  # 404 for an unknown run, before looking at any folder
    try:
        artifact_name(name)  # the same rule artifact writes follow: refused, never rewritten
    except InvalidId as exc:
        raise Refused(400, "invalid_id", str(exc)) from None
    path = RunArtifacts(keel_app.aio.runtime.artifacts_root, run_id).path(name)
    if not path.is_file():
        raise Refused(404, "artifact_not_found", f"run {run_id} has no artifact {name!r}")
    return path


def download(path: Path, name: str, request: Request) -> FileResponse | JSONResponse:
    """The file as a download, whole or the `Range` asked for; a range Starlette would refuse
    in plain text (400), or with an empty body (416), is refused with the JSON error body."""
    response = FileResponse(path, filename=name, stat_result=os.stat(path))
    asked, if_range = request.headers.get("range"), request.headers.get("if-range")
    if asked is None or request.method not in ("GET", "HEAD"):
        return response
    if if_range is not None and not response._should_use_range(if_range):
        return response  # the file changed: sent whole, as Starlette does
    size = response.stat_result.st_size if response.stat_result else 0
    try:
        response._parse_range_header(asked, size)  # what FileResponse will do with it
    except MalformedRangeHeader as exc:
        return problem(400, "invalid_range", f"Range {asked[:60]!r}: {exc.content}")
    except RangeNotSatisfiable:
        return problem(
            416,
            "range_not_satisfiable",
            f"Range {asked[:60]!r} is past the end of the file ({size} bytes)",
            headers={"Content-Range": f"bytes */{size}"},
        )
    return response
