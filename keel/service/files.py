"""Finding a run's artifact for a download: one rule for the HTTP API and the console."""

from __future__ import annotations

from pathlib import Path

from keel.core.artifacts import RunArtifacts, artifact_name
from keel.core.errors import InvalidId
from keel.core.ids import validate_run_id
from keel.runtime.app import App
from keel.service.errors import Refused


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
