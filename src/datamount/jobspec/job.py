"""Job specs: the three shapes of docs/specs.md and the Azure ML type × mode table.

`load_spec(path)` / `parse_spec(mapping)` return a `JobSpec` or raise
`SpecError` carrying one line per problem, each naming the input and field.
Parsing is pure: no network, no workspace lookups.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from datamount import yamlfile
from datamount.errors import SpecError, UriError
from datamount.jobspec.literals import LITERAL_TYPES, LiteralInput, plain_literal, typed_literal
from datamount.jobspec.typemode import (
    ALLOWED_MODES,
    DEFAULT_DATASTORE,
    DEFAULT_MODE,
    DEFAULT_TYPE,
    MODEL_TYPES,
    DataType,
    Direction,
    Mode,
    check_asset,
    check_path_kind,
    data_type,
    default_output_path,
    expand_output_path,
    mode,
    replica_locations,
    upload_datastore,
)
from datamount.jobspec.uris import Location, parse

__all__ = [
    "ALLOWED_MODES",
    "DEFAULT_DATASTORE",
    "DEFAULT_MODE",
    "DataInput",
    "DataType",
    "Direction",
    "JobSpec",
    "MODEL_TYPES",
    "LiteralInput",
    "Mode",
    "load_spec",
    "parse_spec",
]


SINGLE_INPUT_NAME = "input"
REFERENCE = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")


class IdentityKind(StrEnum):
    USER_IDENTITY = "user_identity"
    MANAGED_IDENTITY = "managed_identity"
    AML_TOKEN = "aml_token"  # the job's token: datastore credentials apply


class Identity(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    type: IdentityKind
    client_id: str | None = None


class DataInput(BaseModel):
    """A data input or output. `location` is the parsed `path`."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    name: str = Field(exclude=True)
    direction: Direction = Field(exclude=True)
    type: DataType
    path: str
    mode: Mode
    location: Location = Field(exclude=True)
    description: str | None = None
    identity: Identity | None = None
    asset_name: str | None = None  # outputs: register the result as this data asset
    # inputs: where Azure ML uploads a local path on submission (typemode.upload_datastore)
    datastore: str | None = None
    asset_version: str | None = None
    path_was_default: bool = Field(default=False, exclude=True)
    replicas: tuple[str, ...] = ()  # an extension: copies of `path` (typemode.replica_locations)
    replica_locations: tuple[Location, ...] = Field(default=(), exclude=True)


class JobSpec(BaseModel):
    """A parsed spec, whatever its shape. Unknown job keys are kept in `extra`."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    shape: Literal["single", "named", "command"]
    name: str
    inputs: dict[str, DataInput | LiteralInput] = {}
    outputs: dict[str, DataInput] = {}
    command: str | None = None
    code: str | None = None
    environment_variables: dict[str, str] = {}
    identity: Identity | None = None
    extra: dict[str, Any] = {}
    source: Path | None = None

    @property
    def data_inputs(self) -> dict[str, DataInput]:
        return {k: v for k, v in self.inputs.items() if isinstance(v, DataInput)}

    def entry(self, name: str | None) -> DataInput:
        """The one data input/output named `name` (or the only one)."""
        entries = {**self.data_inputs, **self.outputs}
        if name is None:
            if len(entries) == 1:
                return next(iter(entries.values()))
            choices = ", ".join(sorted(entries)) or "none"
            raise SpecError(
                f"the spec has several data entries; choose one with --input ({choices})"
            )
        if name not in entries:
            choices = ", ".join(sorted(entries)) or "none"
            raise SpecError(f"--input {name}: no such input or output; the spec has: {choices}")
        return entries[name]


class _Names(NamedTuple):
    """What output paths are made of: the run's name and the default datastore."""

    run: str
    datastore: str


def load_spec(
    path: Path, *, run_name: str | None = None, default_datastore: str = DEFAULT_DATASTORE
) -> JobSpec:
    data = yamlfile.load(path, str(path), SpecError)
    return parse_spec(data, source=path, run_name=run_name, default_datastore=default_datastore)


def parse_spec(
    data: object,
    *,
    source: Path | None = None,
    run_name: str | None = None,
    default_datastore: str = DEFAULT_DATASTORE,
) -> JobSpec:
    """`run_name`: the unique name of this run of the job (`datamount run`),
    used for default output paths and `${{name}}` instead of the job's own
    name; `default_datastore`: where default output paths go, and
    `${{default_datastore}}`."""
    if not isinstance(data, dict):
        raise SpecError(f"{source or 'spec'}: expected a YAML mapping at the top level")
    problems: list[str] = []
    shape = _shape(data)
    default_name = source.stem if source else "job"
    job_name = str(data.get("name") or default_name) if shape == "command" else default_name
    names = _Names(run_name or job_name, default_datastore)  # output paths
    identity = _identity(data.get("identity"), "identity", problems) if shape == "command" else None

    inputs: dict[str, DataInput | LiteralInput] = {}
    outputs: dict[str, DataInput] = {}
    if shape == "single":
        entry = _data(SINGLE_INPUT_NAME, "input", data, SINGLE_INPUT_NAME, names, problems)
        if entry:
            inputs[SINGLE_INPUT_NAME] = entry
    else:
        for name, value in _mapping(data, "inputs", problems).items():
            if not _valid_name(str(name), "inputs", problems):
                continue
            entry_in = _input(str(name), value, names, problems)
            if entry_in:
                inputs[str(name)] = entry_in
        for name, value in _mapping(data, "outputs", problems).items():
            if not _valid_name(str(name), "outputs", problems):
                continue
            entry_out = _data(str(name), "output", value or {}, f"outputs.{name}", names, problems)
            if entry_out:
                outputs[str(name)] = entry_out
    env = _mapping(data, "environment_variables", problems)
    command = data.get("command")
    if shape == "command":
        if not isinstance(command, str) or not command.strip():
            problems.append("command: a command job needs a non-empty 'command' string")
        else:
            problems += _check_references(command, data)
    if problems:
        raise SpecError(problems)
    known = {"inputs", "outputs", "command", "code", "environment_variables", "identity", "name"}
    return JobSpec(
        shape=shape,
        name=job_name,
        inputs=inputs,
        outputs=outputs,
        command=command if shape == "command" else None,
        code=str(data["code"]).removeprefix("file:") if data.get("code") is not None else None,
        environment_variables={str(k): _env_value(v) for k, v in env.items()},
        identity=identity,
        extra={k: v for k, v in data.items() if k not in known} if shape != "single" else {},
        source=source,
    )


def _valid_name(name: str, group: str, problems: list[str]) -> bool:
    """Input and output names are identifiers, as in Azure ML: they become
    folder names and `${{...}}` references."""
    if NAME.fullmatch(name):
        return True
    problems.append(
        f"{group}.{name}: not a valid name (letters, digits and '_', not starting with a "
        "digit, at most 255 characters)"
    )
    return False


def _shape(data: dict[str, Any]) -> Literal["single", "named", "command"]:
    if data.get("type") in ("pipeline", "sweep", "parallel", "spark", "automl"):
        raise SpecError(f"type: {data['type']!r} jobs are not supported; use a command job")
    if "command" in data or "$schema" in data or data.get("type") == "command":
        return "command"
    if "inputs" in data or "outputs" in data:
        return "named"
    if "type" in data or "path" in data:
        return "single"
    raise SpecError(
        "spec: expected one input (type/path/mode), an inputs:/outputs: map, "
        "or an Azure ML command job (command:)"
    )


def _mapping(data: dict[str, Any], key: str, problems: list[str]) -> dict[Any, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(
            f"{key}: expected a mapping of names to entries, got {type(value).__name__}"
        )
        return {}
    return value


def _input(
    name: str, value: object, names: _Names, problems: list[str]
) -> DataInput | LiteralInput | None:
    where = f"inputs.{name}"
    if not isinstance(value, dict):
        return plain_literal(name, value, where, problems)
    if set(value) == {"value"}:
        return plain_literal(name, value["value"], where, problems)  # the SDK's {value: ...}
    if value.get("type") in LITERAL_TYPES:
        return typed_literal(name, value, where, problems)
    return _data(name, "input", value, where, names, problems)


def _data(
    name: str,
    direction: Direction,
    raw: object,
    where: str,
    names: _Names,
    problems: list[str],
) -> DataInput | None:
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping with type/path/mode")
        return None
    before = len(problems)
    data_types = ", ".join(t.value for t in DataType)
    type_raw = raw.get("type", DEFAULT_TYPE.value)
    kind = data_type(type_raw)
    if kind is None:
        problems.append(f"{where}.type: {type_raw!r} is not a data type; allowed: {data_types}")

    mode_raw = raw.get("mode", DEFAULT_MODE[direction].value)
    chosen = mode(mode_raw, direction, where)
    if kind is not None:
        allowed = ALLOWED_MODES[(direction, kind)]
        if chosen not in allowed:
            problems.append(
                f"{where}.mode: {mode_raw!r} is not allowed for a {kind.value} {direction}; "
                f"allowed: {', '.join(m.value for m in allowed)}"
            )
    elif chosen is None:
        problems.append(
            f"{where}.mode: {mode_raw!r} is not a mode; allowed: {', '.join(m.value for m in Mode)}"
        )

    path = raw.get("path")
    default_path = False
    optional = raw.get("optional") is True
    if path is None and direction == "input" and optional:
        return None  # an optional input left out: `$[[...]]` blocks naming it are dropped
    if path is None and direction == "output" and kind is not None:
        path = default_output_path(names.run, name, kind, names.datastore)
        default_path = True
    elif isinstance(path, str) and direction == "output":
        path = expand_output_path(
            path, f"{where}.path", run_name=names.run, output=name,
            datastore=names.datastore, problems=problems,
        )  # fmt: skip
    location = None
    if path is None:
        if direction == "input":
            problems.append(f"{where}.path: required for an input (or set `optional: true`)")
    else:
        try:
            location = parse(path, f"{where}.path")
            if kind is not None:
                check_path_kind(location, kind, f"{where}.path", problems)
        except UriError as exc:
            problems += exc.problems

    if direction == "output":
        check_asset(raw, kind, where, problems)
    replicas: tuple[Location, ...] = ()
    if location is not None and kind is not None:
        replicas = replica_locations(raw.get("replicas"), location, kind, direction,
                                     f"{where}.replicas", problems)  # fmt: skip
    skip = ("type", "mode", "path", "name", "version", "optional", "replicas")
    fields = {k: v for k, v in raw.items() if k not in skip}
    if direction == "input" and ("name" in raw or "version" in raw):
        problems.append(f"{where}: 'name'/'version' register outputs; an input cannot have them")
    identity = _identity(fields.pop("identity", None), f"{where}.identity", problems)
    if "datastore" in fields:
        fields["datastore"] = upload_datastore(fields["datastore"], direction, where, problems)
    if len(problems) > before or kind is None or chosen is None or location is None:
        return None
    try:
        return DataInput(
            name=name,
            direction=direction,
            type=kind,
            path=str(path),
            mode=chosen,
            location=location,
            identity=identity,
            asset_name=str(raw["name"]) if raw.get("name") is not None else None,
            asset_version=str(raw["version"]) if raw.get("version") is not None else None,
            path_was_default=default_path,
            replicas=tuple(str(r) for r in raw.get("replicas") or ()),
            replica_locations=replicas,
            **fields,
        )
    except ValidationError as exc:
        problems += [_pydantic_line(where, err) for err in exc.errors()]
        return None


def _identity(raw: object, where: str, problems: list[str]) -> Identity | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = {"type": raw}
    if isinstance(raw, dict) and raw.get("type") in ("managed", "managed_identity"):
        raw = {**raw, "type": IdentityKind.MANAGED_IDENTITY.value}
    try:
        return Identity.model_validate(raw)
    except ValidationError:
        allowed = ", ".join(k.value for k in IdentityKind)
        problems.append(f"{where}: {raw!r} is not an identity; allowed types: {allowed}")
        return None


def _pydantic_line(where: str, err: Any) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ()))
    if err.get("type") == "extra_forbidden":
        return f"{where}.{loc}: unknown key"
    return f"{where}.{loc}: {err.get('msg')}"


def _env_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _check_references(command: str, data: dict[str, Any]) -> list[str]:
    """Every ${{inputs.x}} / ${{outputs.y}} must name a declared entry."""
    problems = []
    declared = {
        "inputs": set(map(str, (data.get("inputs") or {}))),
        "outputs": set(map(str, (data.get("outputs") or {}))),
    }
    for ref in REFERENCE.findall(command):
        group, _, name = ref.partition(".")
        if group not in declared or not name:
            problems.append(
                f"command: unknown reference ${{{{{ref}}}}}; use ${{{{inputs.<name>}}}} "
                "or ${{outputs.<name>}}"
            )
        elif name not in declared[group]:
            choices = ", ".join(sorted(declared[group])) or "none"
            problems.append(
                f"command: ${{{{{ref}}}}} names no declared {group[:-1]} (declared: {choices})"
            )
    return problems
