"""Literal inputs of a job (`epochs: 3`, `{type: number, default: 0.1}`,
the SDK's `{value: 3}`): their values as their declared type, rendered in
the command as Azure ML renders them.

Pure. No threads.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

LITERAL_TYPES = {"integer": int, "number": float, "boolean": bool, "string": str}


class LiteralInput(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    value: str | int | float | bool | None

    def render(self) -> str:
        if isinstance(self.value, bool):
            return "True" if self.value else "False"  # Azure ML renders Python-style
        return "" if self.value is None else str(self.value)


def typed_literal(
    name: str, value: dict[str, Any], where: str, problems: list[str]
) -> LiteralInput | None:
    """A `{type: integer|number|boolean|string, default|value: ...}` input."""
    kind = str(value.get("type"))
    extra = set(value) - {"type", "default", "value", "description", "optional", "min", "max"}
    if extra:
        problems.append(f"{where}: unknown keys for a {kind} input: {', '.join(sorted(extra))}")
    literal = value.get("value", value.get("default"))
    if literal is None and not value.get("optional", False):
        problems.append(
            f"{where}: a {kind} input needs a value (`default:` or `value:`) "
            "unless it is `optional: true`"
        )
        return None
    try:
        literal = _literal(kind, literal) if literal is not None else None
    except (TypeError, ValueError):
        problems.append(f"{where}.value: {literal!r} is not a valid {kind}")
        return None
    return LiteralInput(name=name, value=literal)


def plain_literal(name: str, value: object, where: str, problems: list[str]) -> LiteralInput | None:
    if isinstance(value, list | dict):
        problems.append(f"{where}: a {type(value).__name__} is not an input value")
        return None
    return LiteralInput(name=name, value=value)  # type: ignore[arg-type]


def _literal(kind: str, raw: object) -> str | int | float | bool:
    """A literal input's value as its declared type; strings such as
    "false"/"0" are booleans as YAML would read them, never truthy text."""
    if kind == "boolean":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("true", "yes", "on", "1"):
            return True
        if text in ("false", "no", "off", "0"):
            return False
        raise ValueError(raw)
    if kind == "integer" and isinstance(raw, float) and not raw.is_integer():
        raise ValueError(raw)
    result: str | int | float = LITERAL_TYPES[kind](raw)
    return result
