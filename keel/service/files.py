"""Finding a run's artifact for a download: one rule for the HTTP API and the console."""

from __future__ import annotations

from pathlib import Path

from keel.core.artifacts import RunArtifacts
from keel.core.errors import InvalidId
from keel.core.ids import safe_name, validate_run_id
from keel.runtime.app import App
from keel.service.errors import Refused


def artifact_file(keel_app: App, run_id: str, name: str) -> Path:
    """The file `name` of the run's artifacts; Refused (400/404) for anything else."""
    validate_run_id(run_id)
    keel_app.get_run(run_id)  # 404 for an unknown run, before looking at any folder
    try:
        clean = safe_name(name, "artifact name")
    except InvalidId as exc:
        raise Refused(400, "invalid_id", str(exc)) from None
    if clean != name:
        # safe_name() maps unsafe characters to '_'; serving the mapped file would answer for a
        # name that was never asked for.
        raise Refused(400, "invalid_id", f"artifact name {name!r} is not a plain file name")
    path = RunArtifacts(keel_app.aio.artifacts_root, run_id).path(name)
    if not path.is_file():
        raise Refused(404, "artifact_not_found", f"run {run_id} has no artifact {name!r}")
    return path
