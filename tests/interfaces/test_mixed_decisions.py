"""One approval, a hundred people: HTTP decisions and signed Slack clicks at the same moment,
through one real server. Exactly one decision is recorded, everyone is told the same one, and
the run resumes once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.support.apps.service import PERFORMED
from tests.support.service_client import ADMIN, Service, bearer
from tests.support.slack_fake import SECRET, action_body, signed_headers


def test_hundred_mixed_http_and_slack_decisions_record_one(
    serve: Callable[..., Service],
) -> None:
    svc = serve(slack_signing_secret=SECRET)
    run_id, approval_id = svc.waiting_run("mixed-1")
    n = 100
    gate = threading.Barrier(n)
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)

    with httpx.Client(base_url=svc.url, limits=limits, timeout=60) as http:

        def answered(send: Callable[[], httpx.Response]) -> int:
            # A burst of 100 can wait past the service's bounded wait for a database connection
            # on a busy machine: 503, which changed nothing, and which a client (and Slack)
            # sends again, the same request.
            for _ in range(50):
                code = send().status_code
                if code != 503:
                    return code
                time.sleep(0.2)
            return 503

        def decide(i: int) -> int:
            approve = i % 2 == 0
            if i % 4 < 2:  # half of them over the HTTP API
                gate.wait()
                return answered(
                    lambda: http.post(
                        f"/v1/approvals/{approval_id}/decision",
                        json={"decision": "approve" if approve else "reject", "by": f"web-{i}"},
                        headers={**bearer(ADMIN), "Idempotency-Key": f"web-{i}"},
                    )
                )
            body = action_body(
                approval_id,
                "keel_approve" if approve else "keel_reject",
                user=f"U{i:04d}",
                action_ts=f"1800000000.{i:06d}",
            )
            headers = signed_headers(body, int(time.time()))
            gate.wait()
            return answered(lambda: http.post("/slack/actions", content=body, headers=headers))

        with ThreadPoolExecutor(n) as pool:
            codes = list(pool.map(decide, range(n)))

    run = svc.http.get(f"/v1/runs/{run_id}").json()
    recorded = [e for e in run["timeline"] if e["kind"] == "decision.recorded"]
    assert len(recorded) == 1, recorded
    (wait,) = run["waits"]
    assert wait["status"] == "decided"
    # Over HTTP the other decision is a conflict (409); Slack's clicks are all acknowledged.
    verdicts = ["approved" if i % 2 == 0 else "rejected" for i in range(n)]
    expected = [200 if i % 4 >= 2 or verdicts[i] == wait["decision"] else 409 for i in range(n)]
    assert codes == expected
    # Everyone asking now is told the one recorded decision.
    again = svc.http.get(f"/v1/approvals/{approval_id}").json()
    assert (again["decision"], again["decided_by"]) == (wait["decision"], wait["decided_by"])

    svc.work()
    done = svc.http.get(f"/v1/runs/{run_id}").json()
    assert (done["status"], done["decision"]) == ("completed", wait["decision"])
    after = [e["kind"] for e in done["timeline"] if e["event_id"] > recorded[0]["event_id"]]
    assert after.count("lease.claimed") == 1, "resumed once"
    assert [p["decision"] for p in PERFORMED] == [wait["decision"]]
