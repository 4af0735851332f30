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

A field of messages is judged as LangGraph treats it, not by its declared type alone: through
JSON a message arrives as a dict (`{"role": "user", "content": "hi"}`), which LangGraph passes to
the graph's nodes or its reducer as it came (see `Messages`).

Each problem is named by its field (`input.to: Input should be a valid string`).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import typing_extensions
from langchain_core.messages import BaseMessage, convert_to_messages
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

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
        self.message_fields: dict[str, Messages] = {}
        """A whole schema's fields judged as messages, apart from the whole (their placeholder
        there is `[]`): a pydantic model's `add_messages` fields (LangGraph validates the others
        by the model itself), a dataclass's lists of messages (LangGraph validates nothing of a
        dataclass; its message fields are judged as a TypedDict's are)."""
        self.model = schema if isinstance(schema, type) and issubclass(schema, BaseModel) else None
        if self.model or dataclasses.is_dataclass(schema):
            self.whole = TypeAdapter(schema)
            try:
                hints = typing.get_type_hints(schema, include_extras=True)
            except Exception:
                hints = {}
            for key, hint in hints.items():
                judge = _adapter(hint)
                if isinstance(judge, Messages) and (judge.reduced or self.model is None):
                    self.message_fields[key] = judge
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
            for key in self.message_fields.keys() & value.keys():
                found += self.message_fields[key].problems(value[key], ("input", key))
                whole[key] = []  # judged just above, as LangGraph takes it
            # LangGraph validates a pydantic state with the model itself: what makes the model's
            # validator raise (AnyMessage's discriminator, given a role dict) fails the run too.
            raising = functools.partial(self._raising, whole) if self.model else None
            found += _errors(self.whole, whole, ("input",), raising=raising)
        return found

    def _raising(self, value: dict[str, Any], exc: Exception) -> list[str]:
        """The fields of a pydantic state whose own validator raises on `value` (pydantic names
        none when a validator raises rather than reports), each named with the reason."""
        reason = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"[:200]
        fields = self.model.model_fields if self.model else {}
        named = [key for key, item in value.items() if key in fields and _raises(fields[key], item)]
        return [f"input.{key}: {reason}" for key in named] or [f"input: {reason}"]


def _raises(field: FieldInfo, value: Any) -> bool:
    try:
        TypeAdapter(field.annotation or Any).validate_python(value)
    except ValidationError:
        return False
    except (TypeError, ValueError):
        return True
    return False


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
    """A field of messages, judged by what LangGraph and LangChain make messages of
    (`convert_to_messages`: a string, a (role, text) pair, a {"role", "content"} dict, a
    message or its dict) rather than by the message classes of its type, which no JSON value is.

    - `reduced`: a field LangGraph's message reducer (`add_messages`) reduces. It takes one of
      them or a list, as the reducer itself calls `convert_to_messages`; anything else fails the
      run's first step (`Unsupported message type`), after it was admitted.
    - otherwise a list of messages (`list[AnyMessage]`, `Sequence[BaseMessage]`): a list of
      them. LangGraph hands such a field to the nodes as it came, and a node hands it to a chat
      model, which makes messages of it then; without a reducer a string is taken too (a chat
      model reads it as one human message), with one (`operator.add`) it is not (the reducer
      fails on it).
    """

    def __init__(self, *, reduced: bool, text: bool = False) -> None:
        self.reduced = reduced
        self.text = text

    def problems(self, value: Any, where: tuple[str, ...]) -> list[str]:
        name = ".".join(where)
        if self.text and isinstance(value, str):
            return []
        if not self.reduced and not isinstance(value, list):
            takes = "a list of messages or a string" if self.text else "a list of messages"
            return [f"{name}: expected {takes}, got {type(value).__name__}"]
        try:
            convert_to_messages(value if isinstance(value, list) else [value])
        except Exception as exc:  # NotImplementedError, ValueError, KeyError, TypeError
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if len(reason) > 200:
                reason = reason[:197] + "..."
            return [f"{name}: not a message or a list of messages ({reason})"]
        return []


MESSAGES = Messages(reduced=True)


def _is_messages(hint: Any) -> bool:
    """Whether a field is reduced by LangGraph's message reducer (`add_messages`)."""
    hint = _unqualified(hint)
    return typing.get_origin(hint) is typing.Annotated and any(
        getattr(extra, "__module__", "") == "langgraph.graph.message" for extra in hint.__metadata__
    )


def _is_message_type(hint: Any) -> bool:
    """A message class, or a union of them (`AnyMessage`), also under `Annotated`."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _is_message_type(hint.__origin__)
    if origin in (typing.Union, types.UnionType):
        return all(_is_message_type(arg) for arg in typing.get_args(hint))
    return isinstance(hint, type) and issubclass(hint, BaseMessage)


def _mentions_messages(hint: Any) -> bool:
    return _is_message_type(hint) or any(_mentions_messages(a) for a in typing.get_args(hint))


def _message_list(hint: Any) -> Messages | None:
    """The judge of a field whose type holds messages but no `add_messages`: a list of them
    (see `Messages`); None for another shape (`dict[str, BaseMessage]`), left unchecked rather
    than judged by classes no JSON value is."""
    inner, reducer = hint, False
    if typing.get_origin(hint) is typing.Annotated:
        inner, reducer = hint.__origin__, any(callable(extra) for extra in hint.__metadata__)
    args = typing.get_args(inner)
    if (
        typing.get_origin(inner) in (list, Sequence)
        and len(args) == 1
        and _is_message_type(args[0])
    ):
        return Messages(reduced=False, text=not reducer)
    return None


def _adapter(hint: Any) -> TypeAdapter[Any] | Messages | None:
    if hint is None:
        return None
    hint = _unqualified(hint)  # Required[str] is checked as a str
    if _is_messages(hint):
        # LangGraph's message reducer judges its input by what it can make messages of, not by
        # the field's type (other reducers take the field's own type).
        return MESSAGES
    if _mentions_messages(hint):
        return _message_list(hint)
    try:
        return TypeAdapter(hint)
    except Exception:  # a type pydantic cannot check (an arbitrary class): the key is enough
        return None


def _errors(
    adapter: TypeAdapter[Any],
    value: Any,
    where: tuple[str, ...],
    *,
    raising: Callable[[Exception], list[str]] | None = None,
) -> list[str]:
    try:
        adapter.validate_python(value)
    except ValidationError as exc:
        return [
            f"{'.'.join(str(p) for p in (*where, *err.get('loc', ())))}: {err.get('msg')}"
            for err in exc.errors()
        ]
    except (TypeError, ValueError) as exc:
        # The schema's own validator cannot judge the value (a discriminator that raises): where
        # LangGraph does not run that validator (a TypedDict's field) it takes the value, and so
        # does the admission; where it does (a pydantic state), the run would fail on it.
        return raising(exc) if raising else []
    return []
