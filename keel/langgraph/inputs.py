"""A run's input checked at submit against its graph's input schema.

LangGraph takes any mapping as a graph's input (a partial state update) and finds a wrong one
only inside the first step (`InvalidUpdateError: Expected dict, got hello`), after Keel has
admitted the run. So `submit` checks it first, as LangGraph would read it:

- a TypedDict schema: the input is an object; every key it gives is a field of the schema, with
  a value of the field's type, and a typo in a key is refused rather than silently dropped.
  Which fields must be given: those marked `Required[...]`, and, when the graph declares an
  input schema of its own (`StateGraph(State, input_schema=Input)`), every required key of
  that schema (a `total=True` one: all of them). A state schema used as the input otherwise
  describes the whole state, most of which later nodes write, so its fields may be left out
  (an input is a partial update, and LangGraph accepts that).
- a pydantic model (or a dataclass): the input must validate as one, as LangGraph validates it.

Each problem is named by its field (`input.to: Input should be a valid string`).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import typing_extensions
from langchain_core.messages import convert_to_messages
from pydantic import BaseModel, TypeAdapter, ValidationError

from keel.core.errors import InvalidInput
from keel.core.workflows import Workflow


class _Schema:
    """How to check an input: a whole-value adapter (pydantic, dataclass), or one adapter per
    field of a TypedDict (fields may be left out), or nothing but "an object"."""

    def __init__(self, schema: Any, *, declared: bool = False) -> None:
        self.name = getattr(schema, "__name__", "the input schema")
        self.whole: TypeAdapter[Any] | None = None
        self.fields: dict[str, TypeAdapter[Any] | Messages | None] = {}
        self.required: frozenset[str] = frozenset()
        self.message_fields: frozenset[str] = frozenset()
        """A whole schema's fields that LangGraph's message reducer takes: judged as it judges
        them, not by the field's type (a plain string is a message to it, not a list)."""
        if (isinstance(schema, type) and issubclass(schema, BaseModel)) or dataclasses.is_dataclass(
            schema
        ):
            self.whole = TypeAdapter(schema)
            try:
                hints = typing.get_type_hints(schema, include_extras=True)
            except Exception:
                hints = {}
            self.message_fields = frozenset(k for k, h in hints.items() if _is_messages(h))
        elif typing_extensions.is_typeddict(schema):  # typing's misses typing_extensions'
            try:
                hints = typing.get_type_hints(schema, include_extras=True)
            except Exception:
                # Annotations that do not resolve here (names only the user's module knows):
                # the keys can still be checked, their types cannot.
                hints = dict.fromkeys(schema.__annotations__)
            self.fields = {key: _adapter(hint) for key, hint in hints.items()}
            self.required = (
                frozenset(getattr(schema, "__required_keys__", ()))
                if declared
                else _marked_required(schema)
            )

    def problems(self, value: dict[str, Any], *, partial: bool = False) -> list[str]:
        found = [
            f"input.{key}: missing (a required field of {self.name})"
            for key in sorted(self.required - value.keys())
            if not partial
        ]
        for key, item in value.items():
            if self.fields and key not in self.fields:
                known = ", ".join(sorted(self.fields))
                found.append(f"input.{key}: not a field of {self.name} (its fields: {known})")
            elif isinstance(adapter := self.fields.get(key), Messages):
                found += adapter.problems(item, ("input", key))
            elif adapter is not None:
                found += _errors(adapter, item, ("input", key))
        if self.whole is not None:
            whole = dict(value)
            for key in self.message_fields & value.keys():
                found += MESSAGES.problems(value[key], ("input", key))
                whole[key] = []  # the reducer's input, not the field's: judged just above
            found += _errors(self.whole, whole, ("input",))
        return found


# Per registered workflow (a frozen dataclass: the same registration, the same entry).
_schemas: dict[Workflow, _Schema | None] = {}


def learn_input_schema(workflow: Workflow, graph: Any) -> None:
    """Remember the input schema of `workflow`'s graph, compiled at registration (its builder
    is `graph.builder`), so that submit checks inputs without building the graph again."""
    if workflow not in _schemas:
        _schemas[workflow] = _schema_of(getattr(graph, "builder", graph))


def _schema_of(builder: Any) -> _Schema | None:
    """None: the graph declares no state schema (the functional API's `@entrypoint` takes any
    value), so there is nothing to check."""
    state = getattr(builder, "state_schema", None)
    if state is None:
        return None
    declared = getattr(builder, "input_schema", None)
    if declared is None or declared is state:
        return _Schema(state)
    return _Schema(declared, declared=True)


def _marked_required(schema: Any) -> frozenset[str]:
    """The keys annotated `Required[...]` (also as a string, under postponed annotations)."""
    annotations = getattr(schema, "__annotations__", {})  # a TypedDict's own and inherited
    return frozenset(key for key, hint in annotations.items() if _is_required(hint))


def _is_required(hint: Any) -> bool:
    if isinstance(hint, typing.ForwardRef):  # how a TypedDict keeps a postponed annotation
        hint = hint.__forward_arg__
    if isinstance(hint, str):
        return hint.replace(" ", "").split("[", 1)[0].rsplit(".", 1)[-1] == "Required"
    return typing.get_origin(hint) is typing.Required


def check_input(workflow: Workflow, value: Any, *, partial: bool = False) -> None:
    """InvalidInput, with one entry per field in `.errors`, unless the graph can take `value`.
    `partial`: a later turn of a thread, whose state already holds what its first run gave,
    so no field is required."""
    if workflow not in _schemas:
        # Not learned at registration (a Workflow registered by other means): build it once.
        try:
            builder = workflow.factory()
        except Exception:
            # The graph compiled at registration; a factory that fails now fails the run where
            # it executes (with the attempt limits), not the admission: no schema to check.
            return
        _schemas[workflow] = _schema_of(getattr(builder, "builder", builder))
    schema = _schemas[workflow]
    if schema is None:
        return
    if not isinstance(value, dict):
        problems = [f"input: expected an object ({schema.name}), got {type(value).__name__}"]
    else:
        problems = schema.problems(value, partial=partial)
    if problems:
        message = f"input does not match {schema.name}: " + "; ".join(problems)
        raise InvalidInput(message, errors=problems)


_QUALIFIERS = frozenset(
    q for q in (typing.Required, typing.NotRequired, getattr(typing, "ReadOnly", None)) if q
)
"""TypedDict's key qualifiers: they say whether a key is needed, not what its value is (pydantic
cannot build a validator of `Required[str]`: the field went unchecked)."""


def _unqualified(hint: Any) -> Any:
    """`hint` without TypedDict's qualifiers, also inside `Annotated[...]`."""
    while True:
        origin = typing.get_origin(hint)
        if origin in _QUALIFIERS:
            hint = typing.get_args(hint)[0]
        elif origin is typing.Annotated:
            inner = _unqualified(hint.__origin__)
            return (
                typing.Annotated[(inner, *hint.__metadata__)]
                if inner is not hint.__origin__
                else hint
            )
        else:
            return hint


class Messages:
    """A field LangGraph's message reducer (`add_messages`) reduces. It takes what
    `convert_to_messages` makes messages of (a string, a (role, text) tuple, a {"role",
    "content"} dict, a message; one or a list of them), as the reducer itself calls it; anything
    else fails the run's first step (`Unsupported message type`), after it was admitted."""

    def problems(self, value: Any, where: tuple[str, ...]) -> list[str]:
        try:
            convert_to_messages(value if isinstance(value, list) else [value])
        except Exception as exc:  # NotImplementedError, ValueError, KeyError, TypeError
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if len(reason) > 200:
                reason = reason[:197] + "..."
            return [f"{'.'.join(where)}: not a message or a list of messages ({reason})"]
        return []


MESSAGES = Messages()


def _is_messages(hint: Any) -> bool:
    """Whether a field is reduced by LangGraph's message reducer (`add_messages`)."""
    hint = _unqualified(hint)
    return typing.get_origin(hint) is typing.Annotated and any(
        getattr(extra, "__module__", "") == "langgraph.graph.message" for extra in hint.__metadata__
    )


def _adapter(hint: Any) -> TypeAdapter[Any] | Messages | None:
    if hint is None:
        return None
    hint = _unqualified(hint)  # Required[str] is checked as a str
    if _is_messages(hint):
        # LangGraph's message reducer judges its input by what it can make messages of, not by
        # the field's type (other reducers take the field's own type).
        return MESSAGES
    try:
        return TypeAdapter(hint)
    except Exception:  # a type pydantic cannot check (an arbitrary class): the key is enough
        return None


def _errors(adapter: TypeAdapter[Any], value: Any, where: tuple[str, ...]) -> list[str]:
    try:
        adapter.validate_python(value)
    except ValidationError as exc:
        return [
            f"{'.'.join(str(p) for p in (*where, *err.get('loc', ())))}: {err.get('msg')}"
            for err in exc.errors()
        ]
    except (TypeError, ValueError):
        # The schema's own validator cannot judge the value (a discriminator that raises):
        # LangGraph would take it, and so does the admission.
        return []
    return []
