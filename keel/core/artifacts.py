"""Per-run artifact folders, written atomically.

A write goes to a temp file in the same folder, is flushed and fsynced, renamed over the
target, and the folder is fsynced: a reader sees the old file or the new one, never half.
Folder and file names are sanitized and checked to stay under the artifacts root.

Inside a run the rename is a publication the lease fences: it happens only after a check that
this worker still holds the run, so a worker that froze or carried on past a takeover leaves
the next owner's files alone. The check and the rename are two moves, not one transaction: a
freeze between them longer than the lease's remaining time is the window that stays (see
docs/effects.md).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keel.core.context import RunContext, current
from keel.core.effects.ledger import check_lease
from keel.core.errors import InvalidId, UsageError
from keel.core.faults import fault_point
from keel.core.ids import safe_name

MAX_NAME = 200


def artifact_name(name: str) -> str:
    """`name`, if it can be a file name as it is; InvalidId saying why otherwise.

    Rewriting a name would make `report:v1.txt` and `report v1.txt` the same file, and a
    truncated one would answer for a name nobody wrote: both are refused, never mapped.
    """
    if len(name) > MAX_NAME:
        raise InvalidId(
            f"artifact name {name[:40]!r}... is {len(name)} characters; at most {MAX_NAME}"
        )
    if safe_name(name, "artifact name") != name:
        raise InvalidId(
            f"artifact name {name!r} may only contain letters, digits, '.', '_' and '-' "
            "(and may not start with '.')"
        )
    return name


@dataclass(frozen=True)
class ArtifactInfo:
    name: str
    size: int
    path: Path


class RunArtifacts:
    def __init__(
        self,
        root: str | os.PathLike[str],
        run_id: str,
        *,
        fence: Callable[[], None] | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.folder = _inside(self.root, self.root / safe_name(run_id, "run id"))
        self._fence = fence
        """Raises (LeaseLost) unless the writer may still publish: called before each rename."""

    def path(self, name: str) -> Path:
        return _inside(self.folder, self.folder / artifact_name(name))

    def write_bytes(self, name: str, data: bytes) -> Path:
        target = self.path(name)
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=self.folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            fault_point("artifact.before_rename", target.name)
            if self._fence is not None:
                self._fence()
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(self.folder)
        return target

    def write_text(self, name: str, text: str) -> Path:
        return self.write_bytes(name, text.encode())

    def write_json(self, name: str, value: Any) -> Path:
        return self.write_bytes(name, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode())

    def read_bytes(self, name: str) -> bytes:
        return self.path(name).read_bytes()

    def list(self) -> list[ArtifactInfo]:
        if not self.folder.is_dir():
            return []
        return [
            ArtifactInfo(p.name, p.stat().st_size, p)
            for p in sorted(self.folder.iterdir())
            if p.is_file() and not p.name.startswith(".")
        ]


def artifacts() -> RunArtifacts:
    """The current run's artifact folder (inside a node)."""
    ctx = current("keel.artifacts()")
    return RunArtifacts(ctx.services.artifacts_root, ctx.run_id, fence=lambda: _fence(ctx))


def _fence(ctx: RunContext) -> None:
    if ctx.replay is not None:
        return  # a replay writes into its own throwaway folder and holds no lease
    portal = ctx.services.portal
    if portal.on_loop():
        raise UsageError(
            "keel.artifacts() writes block (fsync, and a lease check before the rename): call "
            "them from a plain `def` node, or from an async node through "
            "`await asyncio.to_thread(folder.write_text, name, text)`"
        )
    portal.call(check_lease(ctx))


def _inside(root: Path, candidate: Path) -> Path:
    resolved = candidate.resolve()
    if resolved == root or not resolved.is_relative_to(root):
        raise InvalidId(f"{candidate} is outside {root}")
    return resolved


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
