"""Nobody answers a timer, over Keel's HTTP API: an approval's decision and a thread's resume
aimed at a sleeping run are refused (409 `wrong_kind`) and record nothing, on both backends."""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel
from tests.support.service_client import Service


class Nap(TypedDict, total=False):
    done: bool


def napping() -> StateGraph:
    def nap(state: Nap) -> dict[str, Any]:
        keel.sleep("1h")
        return {"done": True}

    g = StateGraph(Nap)
    g.add_node("nap", nap)
    g.add_edge(START, "nap")
    g.add_edge("nap", END)
    return g


def test_approve_and_resume_aimed_at_a_timer_are_refused(svc: Service) -> None:
    svc.app.workflow("nap")(napping)
    run_id = svc.app.submit("nap", {}, thread_id="t-nap").run_id
    svc.work()
    before = svc.app.get_run(run_id)
    (timer,) = before.waits
    assert (before.status, timer["kind"], timer["status"]) == ("waiting", "timer", "pending")
    listed = svc.http.get("/v1/approvals", params={"kind": "all"}).json()["approvals"]
    assert [a for a in listed if a["approval_id"] == timer["wait_id"]] == []

    for decision in ("approve", "reject"):
        refused = svc.http.post(
            f"/v1/approvals/{timer['wait_id']}/decision", json={"decision": decision}
        )
        assert (refused.status_code, refused.json()["error"]) == (409, "wrong_kind")
    for body in ({"value": "wake up"}, {"value": "wake up", "wait_id": timer["wait_id"]}):
        refused = svc.http.post("/v1/threads/t-nap/resume", json=body)
        assert (refused.status_code, refused.json()["error"]) == (409, "wrong_kind")

    after = svc.app.get_run(run_id)
    assert after.status == "waiting"
    assert [(w["wait_id"], w["status"], w["decision"]) for w in after.waits] == [
        (timer["wait_id"], "pending", None)
    ]
    assert [e["kind"] for e in after.timeline] == [e["kind"] for e in before.timeline]
