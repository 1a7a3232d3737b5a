"""Literal inputs of a job (`epochs: 3`, `{type: number, default: 0.1}`,
the SDK's `{value: 3}`): their values as their declared type, rendered in
the command as Azure ML renders them.

Pure. No threads.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

LITERAL_TYPES = {"integer": int, "number": float, "boolean": bool, "string": str}
# The keys the SDK's schemas allow on a literal input (azure-ai-ml's
# ParameterSchema): `enum`, `min` and `max` are checked against the value
# only when the job runs (bounds_problems), as Azure ML checks them at
# submission, not at load.
LITERAL_KEYS = frozenset(
    {"type", "default", "value", "description", "optional", "min", "max", "enum"}
)


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
    extra = set(value) - LITERAL_KEYS
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


def is_primitive(entry: object) -> bool:
    """An input or output declared with a literal type (`{type: string}`): a
    value, not data. A component's primitive outputs (a flow's verdict, a
    control output) have no place in storage; they are not data entries."""
    return isinstance(entry, dict) and str(entry.get("type", "")).lower() in LITERAL_TYPES


def bounds_problems(inputs: dict[str, Any], where: str) -> list[str]:
    """Each literal input of a job (a mapping as its YAML holds it) whose
    value is outside its declared `enum` or `min`/`max`: one line each."""
    problems = []
    for name, raw in inputs.items():
        if not isinstance(raw, dict) or str(raw.get("type", "")).lower() not in LITERAL_TYPES:
            continue
        value = raw.get("value", raw.get("default"))
        if value is None:
            continue
        here = f"{where}.inputs.{name}"
        enum = raw.get("enum")
        if isinstance(enum, list) and value not in enum and str(value) not in map(str, enum):
            shown = ", ".join(map(str, enum))
            problems.append(f"{here}: {value!r} is not one of its enum ({shown})")
        for key, outside in (("min", lambda v, b: v < b), ("max", lambda v, b: v > b)):
            bound = raw.get(key)
            try:
                if bound is not None and outside(float(value), float(bound)):
                    problems.append(f"{here}: {value!r} is {'below' if key == 'min' else 'above'} "
                                    f"its {key} {bound!r}")  # fmt: skip
            except (TypeError, ValueError):
                continue
    return problems
