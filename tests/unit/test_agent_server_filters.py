"""The metadata filters an Agent Server auth handler returns, as Keel reads them."""

from __future__ import annotations

import pytest

from keel.service.agent_server.authz import exact_part, matches, merged
from keel.service.errors import Refused


def test_a_filter_matches_exact_values_eq_and_contains() -> None:
    metadata = {"owner": "alice", "members": ["alice", "bob"], "n": 1}
    assert matches(metadata, None) and matches(metadata, {})
    assert matches(metadata, {"owner": "alice", "n": {"$eq": 1}})
    assert not matches(metadata, {"owner": "bob"})
    assert not matches(metadata, {"team": "x"})  # a missing key never matches
    assert matches(metadata, {"members": {"$contains": "bob"}})
    assert matches(metadata, {"members": {"$contains": ["bob", "alice"]}})
    assert not matches(metadata, {"members": {"$contains": ["bob", "carol"]}})
    assert not matches(metadata, {"owner": {"$contains": "a"}})  # not a list
    with pytest.raises(Refused):
        matches(metadata, {"owner": {"$like": "a%"}})


def test_exact_conditions_go_to_the_store_and_contradictions_match_nothing() -> None:
    exact, rest = exact_part({"owner": {"$eq": "a"}, "n": 2, "m": {"$contains": "x"}})
    assert exact == {"owner": "a", "n": 2} and rest == {"m": {"$contains": "x"}}
    assert merged({"topic": "t"}, exact) == {"topic": "t", "owner": "a", "n": 2}
    assert merged({"owner": "a"}, {"owner": "a"}) == {"owner": "a"}
    assert merged({"owner": "b"}, {"owner": "a"}) is None
