"""JSON as Keel stores it: one encoder for rows, one canonical form for hashing."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import json
import math
import uuid
from typing import Any

from keel.core.errors import InvalidInput


def json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()  # as pydantic's and LangGraph's API write it
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


MAX_DEPTH = 100
"""How deep a value given to Keel may nest. LangGraph's serializer gives up at a few hundred
levels (a run's input or an answer past that failed in the worker, the turn lost) and so does
the HTTP layer's (a thread's metadata past that made every read of it fail): refused at the
door instead, far above what an agent's state needs."""


MIN_INT, MAX_INT = -(2**63), 2**64 - 1
"""The integers a checkpoint keeps (LangGraph's msgpack serializer): one past them was admitted
and failed its run at the first checkpoint."""


def check_storable(value: Any, what: str) -> None:
    """InvalidInput if `value` (JSON-like: dicts, lists, text) nests deeper than `MAX_DEPTH`,
    holds text UTF-8 cannot store (a lone surrogate, which JSON can carry as `\\ud800`) or
    PostgreSQL cannot (a NUL, `\\u0000`, in a key or a value: refused on SQLite too, as a value
    must be storable wherever the app moves), or a NaN or an infinity (Python's `json` reads
    and writes them; JSON has none, so they came back as text no other reader takes, or as
    null), or an integer past 64 bits."""
    stack: list[tuple[Any, int, _Path]] = [(value, 0, None)]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            _text(item, what, path)
            continue
        if isinstance(item, float) and not math.isfinite(item):
            raise InvalidInput(f"{what} holds {item!r}, which JSON cannot carry")
        if isinstance(item, int) and not MIN_INT <= item <= MAX_INT:
            raise InvalidInput(f"{what} holds an integer past 64 bits, which a checkpoint cannot")
        if isinstance(item, dict):
            children: Any = item.items()
            for key in item:
                if isinstance(key, str):
                    _text(key, what, (path, key), key=True)
        elif isinstance(item, list | tuple):
            children = enumerate(item)
        else:
            continue
        if depth >= MAX_DEPTH:
            raise InvalidInput(f"{what} nests deeper than {MAX_DEPTH} levels")
        stack.extend((child, depth + 1, (path, key)) for key, child in children)


def storable_entries(mapping: dict[str, Any], what: str) -> tuple[dict[str, Any], list[str]]:
    """`mapping`'s entries that `check_storable` takes, and why it refused each other one: for a
    copy of values kept before a rule refused them (a thread's metadata with a NUL, which SQLite
    took), so that what was kept once blocks nothing written now, and is not written again."""
    kept: dict[str, Any] = {}
    refused: list[str] = []
    for key, value in mapping.items():
        try:
            check_storable({key: value}, what)
        except InvalidInput as exc:
            refused.append(str(exc))
        else:
            kept[key] = value
    return kept, refused


_Path = tuple[Any, Any] | None
"""Where a value sits in what `check_storable` walks: (its parent's path, its key or index),
linked (a pair a value), written out only for the value refused."""


def _where(path: _Path) -> str:
    steps: list[str] = []
    while path is not None:
        path, key = path
        shown = json.dumps(key, ensure_ascii=True) if isinstance(key, str | int) else repr(key)
        steps.append(f"[{shown}]")
    return "".join(reversed(steps))


def _text(text: str, what: str, path: _Path, *, key: bool = False) -> None:
    try:
        text.encode()
    except UnicodeEncodeError:
        where = _place(path, key)
        raise InvalidInput(
            f"{what}{where} holds text that is not valid Unicode (a surrogate)"
        ) from None
    if "\x00" in text:
        where = _place(path, key)
        raise InvalidInput(
            f"{what}{where} holds a NUL character (\\u0000), which PostgreSQL cannot store"
        )


def _place(path: _Path, key: bool) -> str:
    at = _where(path)
    if not at:
        return ""
    return f" (its key {at})" if key else f" at {at}"


def canonical_json(value: Any) -> str:
    """One text per value: sorted keys, no spaces, UTF-8, no NaN."""
    try:
        return json.dumps(
            value,
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
            default=_canonical_default,
        )
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"value is not canonical JSON: {exc}") from None


def _canonical_default(value: Any) -> Any:
    # Bytes read as base64 text, which the same text would digest alike: no key of them.
    if isinstance(value, bytes | bytearray):
        raise TypeError(f"{type(value).__name__} is not canonical JSON")
    return json_default(value)


def dumps(value: Any) -> str:
    """A value as the store keeps it (JSON text; dates, enums, dataclasses, models included)."""
    return json.dumps(value, ensure_ascii=False, default=json_default)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _number(value: Any) -> bool:
    return isinstance(value, int | float | decimal.Decimal) and not isinstance(value, bool)


def contains(value: Any, pattern: Any) -> bool:
    """Whether JSON `value` holds `pattern` as PostgreSQL's `@>` decides it (metadata searches):
    an object holds each key of the pattern with a value holding its value, an array holds each
    element of the pattern in one of its own, a scalar equals it as JSON (numbers by value,
    `true` is not `1`, `null` only `null`)."""
    if isinstance(pattern, dict):
        return isinstance(value, dict) and all(
            k in value and contains(value[k], v) for k, v in pattern.items()
        )
    if isinstance(pattern, list):
        return isinstance(value, list) and all(any(contains(x, p) for x in value) for p in pattern)
    if _number(pattern):
        return _number(value) and bool(value == pattern)
    return type(value) is type(pattern) and bool(value == pattern)


def json_contains(value: str | None, pattern: str | None) -> int | None:
    """`contains` on JSON texts, numbers read exactly (as PostgreSQL's numeric): SQLite's
    queries call it as `keel_json_contains(metadata, :metadata)`, registered on each
    connection, where PostgreSQL's say `metadata::jsonb @> :metadata::jsonb`. NULL if either
    is NULL, as `@>` is."""
    if value is None or pattern is None:
        return None
    held, wanted = (json.loads(text, parse_float=decimal.Decimal) for text in (value, pattern))
    return int(contains(held, wanted))
