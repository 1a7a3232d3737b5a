"""What an Azure ML YAML is, and the checks of the kinds that are not jobs.

`kind_of(mapping)`: 'pipeline', 'sweep', 'data' (a data asset: the
data.schema.json `$schema`, or `type` + `path` + `name`), 'component' (the
commandComponent `$schema`, or a command whose inputs are declared without
paths) or 'job' (everything else: what spec.py reads). A data asset and a
component are checked as what they are, each problem one line. Also the
lookup of a registered component (`azureml:<name>:<version>` / `@latest`).
Pure: no network. No threads.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from datamount.catalog import read_components, version_key
from datamount.errors import InvalidInput, SpecError, WorkspaceError
from datamount.spec import parse_spec
from datamount.specliteral import LITERAL_TYPES
from datamount.uris import OUTPUT_ASSET_NAME, OUTPUT_ASSET_RULE, parse
from datamount.workspace import Workspace, registry_path

DATA_TYPES = ("uri_file", "uri_folder", "mltable")
PLACEHOLDER = "azureml://datastores/workspaceblobstore/paths/component-input/"
COMPONENT_REF = re.compile(r"^azureml:([A-Za-z0-9_.-]+)(?::([^:@]+)|@latest)?$")
COMPONENT_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_.-]{0,254}$")


def kind_of(data: dict[str, Any]) -> str:
    schema = str(data.get("$schema") or "").lower()
    kind = str(data.get("type") or "").lower()
    if "pipelinejob" in schema or kind == "pipeline":
        return "pipeline"
    if "sweepjob" in schema or kind == "sweep":
        return "sweep"
    if "data.schema" in schema:
        return "data"
    if "component" in schema:
        return "component"
    if schema or "command" in data:
        if not schema and _inputs_without_paths(data):
            return "component"
        return "job"
    if {"type", "path", "name"} <= set(data) and "inputs" not in data:
        return "data"
    return "job"


def _inputs_without_paths(data: dict[str, Any]) -> bool:
    inputs = data.get("inputs")
    if not isinstance(inputs, dict):
        return False
    return any(
        isinstance(v, dict)
        and str(v.get("type", "uri_folder")).lower() not in LITERAL_TYPES
        and "path" not in v
        and not v.get("optional")
        for v in inputs.values()
    )


def check_data(data: dict[str, Any], version: str | None = None) -> tuple[str, str, str, str]:
    """A data asset YAML: (name, version or '', type, path); SpecError otherwise."""
    problems: list[str] = []
    name = data.get("name")
    if not isinstance(name, str) or not OUTPUT_ASSET_NAME.fullmatch(name):
        problems.append(f"name: {name!r} is not a data asset name ({OUTPUT_ASSET_RULE})")
    raw_version = version if version is not None else data.get("version")
    if isinstance(raw_version, float):
        problems.append(f"version: {raw_version!r} is a number in YAML: quote it")
    kind = str(data.get("type", "uri_folder")).lower()
    if kind not in DATA_TYPES:
        problems.append(
            f"type: {kind!r} is not a data asset type; allowed: {', '.join(DATA_TYPES)}"
        )
    path = data.get("path")
    if not isinstance(path, str) or not path:
        problems.append("path: a data asset needs a `path` (a local path or a URI)")
    else:
        try:
            parse(path, "path")
        except InvalidInput as exc:
            problems += exc.problems
    if problems:
        raise SpecError(problems)
    return str(name), "" if raw_version is None else str(raw_version), kind, str(path)


def check_component(data: dict[str, Any], source: Path | None = None) -> str:
    """A command component YAML: checked as the job it becomes once every
    input has a path; returns its name."""
    problems: list[str] = []
    name = data.get("name")
    if not isinstance(name, str) or not COMPONENT_NAME.fullmatch(name):
        problems.append(
            f"name: {name!r} is not a component name (letters, digits, '_', '.' and '-', "
            "starting with a letter or '_')"
        )
    kind = str(data.get("type", "command")).lower()
    if kind != "command":
        raise SpecError(f"type: {kind!r} components cannot run on one node (command only)")
    if problems:
        raise SpecError(problems)
    parse_spec(as_job(data), source=source)
    return str(name)


def as_job(data: dict[str, Any]) -> dict[str, Any]:
    """The component as a command job: inputs without a path get a placeholder."""
    inputs = {}
    for key, value in (data.get("inputs") or {}).items():
        if (
            isinstance(value, dict)
            and str(value.get("type", "uri_folder")).lower() not in LITERAL_TYPES
        ):
            value = {k: v for k, v in value.items() if k not in ("default",)}
            value.setdefault("path", PLACEHOLDER)
        inputs[key] = value
    skip = ("name", "version", "display_name", "is_deterministic", "tags", "inputs", "$schema")
    job = {k: v for k, v in data.items() if k not in skip}
    job.update({"type": "command", "inputs": inputs})
    return job


def find_component(workspace: Workspace, reference: str, where: str) -> tuple[dict[str, Any], Path]:
    """A registered component: (its definition, the folder its paths are relative to)."""
    match = COMPONENT_REF.match(reference)
    if match is None:
        raise SpecError(f"{where}.component: {reference!r} is not azureml:<name>:<version>")
    name, version = match.groups()
    if workspace.source is None:
        raise WorkspaceError(f"{where}.component: {reference} needs a workspace file")
    registered = read_components(registry_path(workspace.source, workspace.config))
    versions = registered.get(name) or []
    if not versions:
        known = ", ".join(sorted(registered)) or "none"
        raise WorkspaceError(
            f"{where}.component: component {name!r} is not registered (registered: {known}); "
            "use `datamount component create FILE`"
        )
    if version is None:
        entry = max(versions, key=lambda e: version_key(str(e.get("version"))))
    else:
        found = [e for e in versions if str(e.get("version")) == version]
        if not found:
            have = ", ".join(str(e.get("version")) for e in versions)
            raise WorkspaceError(
                f"{where}.component: component {name!r} has no version {version!r} "
                f"(versions: {have})"
            )
        entry = found[0]
    return dict(entry["component"]), workspace.source.parent
