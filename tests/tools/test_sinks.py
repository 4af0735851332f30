"""The sinks count what changed the outside world: changes, not lookups, and a repeat under a
seen Idempotency-Key once. A reconciler looks a delivery up with a GET."""

from __future__ import annotations

import socket
import time

import httpx

from keel.chaos.world import HTTP, World
from keel.testing.http import HttpSink


def test_only_changes_are_deliveries_and_a_get_is_a_lookup() -> None:
    with HttpSink() as sink:
        url = sink.url
        assert httpx.post(url + "/charges", json={"reference": "k1", "amount": 5}).json() == {
            "ok": True,
            "delivery": 1,
        }
        httpx.put(url + "/customers/7", json={"name": "Ana"})
        httpx.patch(url + "/customers/7", json={"name": "Ana B"})
        httpx.delete(url + "/customers/7")
        found = httpx.get(url + "/charges", params={"reference": "k1"}).json()
        missing = httpx.get(url + "/charges", params={"reference": "k2"}).json()
        httpx.head(url + "/charges")
        assert [r.method for r in sink.deliveries] == ["POST", "PUT", "PATCH", "DELETE"]
        assert len(sink.requests) == 7
    assert found == {"deliveries": [{"reference": "k1", "amount": 5, "delivery": 1}]}
    assert missing == {"deliveries": []}


def test_a_request_whose_caller_died_before_its_body_is_not_a_delivery() -> None:
    with HttpSink() as sink:
        port = int(sink.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as cut:
            # The headers promise 60 bytes; the caller is killed before it writes them.
            cut.sendall(b"POST /charges HTTP/1.1\r\nHost: x\r\nContent-Length: 60\r\n\r\n")
        httpx.post(sink.url + "/charges", json={"reference": "whole"})  # after it, in full
        assert [d.json()["reference"] for d in sink.deliveries] == ["whole"]
        assert sink.arrived == 1


def test_a_repeat_under_a_seen_idempotency_key_is_answered_alike_and_not_counted() -> None:
    with HttpSink() as sink:
        first = httpx.post(sink.url + "/charges", json={"n": 1}, headers={"Idempotency-Key": "a"})
        again = httpx.post(sink.url + "/charges", json={"n": 1}, headers={"Idempotency-Key": "a"})
        other = httpx.post(sink.url + "/charges", json={"n": 1}, headers={"Idempotency-Key": "b"})
        by_key = httpx.get(sink.url + "/charges", params={"idempotency_key": "a"}).json()
        assert first.json() == again.json() == {"ok": True, "delivery": 1}
        assert other.json()["delivery"] == 2
        assert len(sink.deliveries) == 2
        assert [d["delivery"] for d in by_key["deliveries"]] == [1]
        assert [d.route for d in sink.lookup("/charges", idempotency_key="b")] == ["/charges"]


def test_each_world_is_fresh_and_stamps_deliveries_on_the_monotonic_clock(tmp_path) -> None:
    before = time.monotonic_ns()
    with World(tmp_path / "one") as one:
        httpx.post(one.placeholders()["http_url"] + "/x", json={}, headers={"Idempotency-Key": "k"})
        [delivery] = one.deliveries()
    with World(tmp_path / "two") as two:
        # The same request, under the same key, in another world: a delivery of its own.
        httpx.post(two.placeholders()["http_url"] + "/x", json={}, headers={"Idempotency-Key": "k"})
        assert two.counts()[HTTP] == 1
    assert before <= delivery.at_ns <= time.monotonic_ns()
    assert (delivery.what, delivery.key) == ("POST /x", "k")
