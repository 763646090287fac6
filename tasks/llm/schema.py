"""Structured (JSON) outputs: parsing model replies, a small JSON-schema subset, one repair round,
and the empty-output guard of extraction stages.

:func:`structured_replies` is the transport-free core of ``LLMClient.chat_json``: it takes an
``ask`` callback (conversations -> reply texts) so it can be tested and reused without a client.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tasks.llm.params import ExtractionMostlyEmpty, Messages

JSON_FORMAT: dict[str, str] = {"type": "json_object"}

# conversations -> one reply text each, in order
Ask = Callable[[Sequence[Messages]], list[str]]


# --------------------------------------------------------------------------
# JSON parsing and schema validation
# --------------------------------------------------------------------------
def parse_json_text(text: str) -> Any:
    """Parse a JSON value from model output (strips ``` fences, leading prose).

    Raises ``ValueError`` when no JSON value can be decoded.
    """
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else body.lstrip("`")
        body = body.rsplit("```", 1)[0]
    starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
    if not starts:
        raise ValueError("no JSON object or array found in the reply")
    value, _ = json.JSONDecoder().raw_decode(body[min(starts):])
    return value


_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate_schema(value: Any, schema: dict[str, Any], path: str = "$") -> str | None:
    """Validate ``value`` against a JSON-schema subset; return an error or None.

    Supported keywords: ``type`` (a name or list of names among object, array,
    string, number, integer, boolean, null), ``required``, ``properties``,
    ``items`` and ``enum``. Other keywords are ignored.
    """
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_TYPE_CHECKS[t](value) for t in names):
            return f"{path}: expected {'/'.join(names)}, got {type(value).__name__}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path}: {value!r} not one of {schema['enum']!r}"
    if isinstance(value, dict):
        return _validate_object(value, schema, path)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            if (err := validate_schema(item, schema["items"], f"{path}[{i}]")) is not None:
                return err
    return None


def _validate_object(value: dict[str, Any], schema: dict[str, Any], path: str) -> str | None:
    """``required`` and ``properties`` checks for an object value."""
    for name in schema.get("required", []):
        if name not in value:
            return f"{path}: missing required property {name!r}"
    for name, sub in (schema.get("properties") or {}).items():
        if name in value and (err := validate_schema(value[name], sub, f"{path}.{name}")) is not None:
            return err
    return None


def parse_and_validate(text: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """(value, None) when ``text`` holds schema-valid JSON, else (None, error)."""
    try:
        value = parse_json_text(text)
    except ValueError as exc:
        return None, f"reply is not valid JSON ({exc})"
    err = validate_schema(value, schema)
    return (value, None) if err is None else (None, err)


def repair_messages(messages: Messages, bad_reply: str, error: str, schema: dict[str, Any]) -> Messages:
    """Conversation asking the model to fix an invalid structured reply."""
    note = (f"Your previous reply could not be used: {error}. Reply again with only a JSON value "
            f"(no prose, no code fences) that satisfies this JSON schema: "
            f"{json.dumps(schema, sort_keys=True)}")
    return [*messages, {"role": "assistant", "content": bad_reply}, {"role": "user", "content": note}]


# --------------------------------------------------------------------------
# One structured round plus one repair round
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class StructuredReplies:
    """Schema-valid values (None where still invalid), repair rounds asked, final failures."""

    values: list[Any]
    repairs: int
    failures: int


def structured_replies(ask: Ask, messages_list: Sequence[Messages], schema: dict[str, Any]) -> StructuredReplies:
    """Ask every conversation once; each invalid reply gets one repair turn quoting its error.

    The repair turns go out in one second ``ask`` call (none when every first reply is valid).
    """
    first = ask(messages_list)
    values: list[Any] = [None] * len(first)
    repairs: list[tuple[int, Messages]] = []
    for i, (text, msgs) in enumerate(zip(first, messages_list)):
        value, err = parse_and_validate(text, schema)
        if err is None:
            values[i] = value
        else:
            repairs.append((i, repair_messages(msgs, text, err, schema)))
    failures = 0
    if repairs:
        for (i, _), text in zip(repairs, ask([m for _, m in repairs])):
            value, err = parse_and_validate(text, schema)
            values[i] = value if err is None else None
            failures += err is not None
    return StructuredReplies(values, len(repairs), failures)


# --------------------------------------------------------------------------
# Empty outputs
# --------------------------------------------------------------------------
def is_empty_output(value: Any) -> bool:
    """True for None, empty str/list/dict, or a dict whose values are all empty."""
    if value is None:
        return True
    if isinstance(value, (str, list, tuple)):
        return len(value) == 0
    if isinstance(value, dict):
        return all(is_empty_output(v) for v in value.values())
    return False


def check_empty_fraction(outputs: Sequence[Any], max_empty_fraction: float, stage: str) -> float:
    """Return the empty fraction of ``outputs``; raise ``ExtractionMostlyEmpty`` above the limit."""
    if not outputs:
        return 0.0
    empty = sum(is_empty_output(o) for o in outputs)
    frac = empty / len(outputs)
    if frac > max_empty_fraction:
        raise ExtractionMostlyEmpty(
            f"stage {stage!r}: {empty}/{len(outputs)} outputs ({frac:.0%}) are empty or invalid, "
            f"above the allowed {max_empty_fraction:.0%}. Check the model, prompt and json_mode "
            f"settings before building anything from this output."
        )
    return frac
