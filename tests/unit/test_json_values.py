"""What a client reads for values JSON has no word for: bytes as base64 text (as LangGraph's API
and pydantic write them), not Python's repr."""

from __future__ import annotations

import base64
import json

from keel.core.codec import dumps
from keel.runtime.snapshot_json import jsonable


def test_bytes_read_as_base64_as_langgraphs_api_writes_them() -> None:
    state = {"blob": b"hi", "parts": [bytearray(b"\x00\xff")]}
    shown = jsonable(state)
    assert shown == {"blob": "aGk=", "parts": ["AP8="]}
    assert base64.b64decode(shown["blob"]) == b"hi"
    assert json.loads(dumps(state)) == shown
