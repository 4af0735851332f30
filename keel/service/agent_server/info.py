"""The Agent Server's `/ok` and `/info`: what a client (Studio, agent-chat-ui) asks first.

Both answer without a token, as `/healthz` does: they name no thread, run or graph.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from fastapi import APIRouter


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def info_router() -> APIRouter:
    router = APIRouter(tags=["agent server"])

    @router.get("/ok")
    def ok() -> dict[str, Any]:
        """The server answers (its database is checked at /readyz)."""
        return {"ok": True}

    @router.get("/info")
    def info() -> dict[str, Any]:
        """The server's version and what it offers (`flags`): assistants, no crons, no
        LangSmith."""
        keel_version = _version("keel") or "0"
        return {
            "version": keel_version,
            "langgraph_py_version": _version("langgraph"),
            "flags": {"assistants": True, "crons": False, "langsmith": False},
            "host": {
                "kind": "self-hosted",
                "project_id": None,
                "host_revision_id": None,
                "revision_id": None,
                "tenant_id": None,
            },
            "keel": {"version": keel_version},
        }

    return router
