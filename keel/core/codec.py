"""JSON as Keel stores it: one encoder for rows, one canonical form for hashing."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import uuid
from typing import Any

from keel.core.errors import InvalidInput


def json_default(value: Any) -> Any:
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


def canonical_json(value: Any) -> str:
    """One text per value: sorted keys, no spaces, UTF-8, no NaN."""
    try:
        return json.dumps(
            value,
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
            default=json_default,
        )
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"value is not canonical JSON: {exc}") from None


def dumps(value: Any) -> str:
    """A value as the store keeps it (JSON text; dates, enums, dataclasses, models included)."""
    return json.dumps(value, ensure_ascii=False, default=json_default)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
