"""What the endpoints of Keel's own API share: their documented 404s, a page's fields, a
run's URL."""

from typing import Any

from fastapi import Request

from keel.service import models as m

MAX_PAGE = 500
"""The most rows one page of a listing holds."""

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    400: {"model": m.Problem, "description": "A malformed id."},
    404: {"model": m.Problem, "description": "No such run, approval or artifact."},
}


def refused_with(why: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI responses of an answer to a wait: not found, or refused (409) and why."""
    return {**NOT_FOUND, 409: {"model": m.Problem, "description": why}}


def run_url(request: Request, run_id: str) -> str:
    return str(request.url_for("get_run", run_id=run_id))


def paging(offset: int, limit: int, fetched: int) -> dict[str, Any]:
    """A page's limit, offset and next offset, from the `fetched` rows (one more than a page
    when there is a next one)."""
    return {
        "limit": limit,
        "offset": offset,
        "next_offset": offset + limit if fetched > limit else None,
    }
