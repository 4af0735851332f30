"""`submit(..., if_not_exists="reject")`: a run only on a thread that exists when it is admitted.

The Agent Server's `POST /threads/{id}/runs` looks the thread up before it submits; the
admission itself must refuse a thread gone since (a deletion in between), not make a new one
of the id (tests/processes/test_thread_delete_race.py races the two in real processes).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import keel
from keel.core.errors import ThreadNotFound, UsageError
from tests.support.thread_graphs import chat

AppFactory = Callable[..., keel.App]
HI = {"messages": [("user", "hi")]}


def test_reject_admits_on_a_thread_that_exists_and_refuses_one_deleted(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow("chat")(chat)
    app.create_thread("chat", thread_id="t-1", metadata={"owner": "ann"})
    first = app.submit("chat", HI, thread_id="t-1", if_not_exists="reject")
    assert first.created and app.thread_runs("t-1")[0]["run_id"] == first.run_id
    app.cancel(first.run_id, by="test")
    app.delete_thread("t-1")
    with pytest.raises(ThreadNotFound):
        app.submit("chat", HI, thread_id="t-1", if_not_exists="reject")
    with pytest.raises(ThreadNotFound):
        app.get_thread("t-1")  # not made again, without its owner
    # The default makes a new thread of the id.
    again = app.submit("chat", HI, thread_id="t-1")
    assert app.thread_runs("t-1")[-1]["run_id"] == again.run_id
    assert app.get_thread("t-1")["metadata"] == {}


def test_reject_needs_a_thread_and_no_other_value_is_taken(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("chat")(chat)
    with pytest.raises(UsageError, match="give thread_id"):
        app.submit("chat", HI, if_not_exists="reject")
    with pytest.raises(UsageError, match="create or reject"):
        app.submit("chat", HI, thread_id="t-2", if_not_exists="maybe")
    assert app.list_runs() == []
