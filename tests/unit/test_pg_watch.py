"""The round-trip bound's look at a socket sees an answer waiting on any descriptor: a busy
process (many connections, files) has descriptors past 1024, where `select` cannot look."""

from __future__ import annotations

import os
import resource
import socket

import pytest

from keel.backends.pg_bounds import _answered

HIGH = 1500


@pytest.fixture
def high_descriptor() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= HIGH:
        if hard != resource.RLIM_INFINITY and hard <= HIGH:
            pytest.skip(f"descriptors are limited to {hard} here")
        resource.setrlimit(resource.RLIMIT_NOFILE, (HIGH + 1, hard))
    return HIGH


def test_an_answer_waiting_on_a_descriptor_past_1024_is_seen(high_descriptor: int) -> None:
    ours, theirs = socket.socketpair()
    try:
        os.dup2(ours.fileno(), high_descriptor)
        assert not _answered(high_descriptor)
        theirs.sendall(b"Z")  # the server's answer arrived, unread
        assert _answered(high_descriptor)
    finally:
        os.close(high_descriptor)
        ours.close()
        theirs.close()
