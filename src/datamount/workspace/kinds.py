"""What an Azure ML YAML is, and the checks of the kinds that are not jobs.

`kind_of(mapping)`: 'pipeline', 'sweep', 'data' (a data asset: the
data.schema.json `$schema`, or `type` + `path` + `name`), 'component' (the
commandComponent `$schema`, or a command whose inputs are declared without
paths) or 'job' (everything else: what jobspec/job.py reads). A data asset and a
component are checked as what they are, each problem one line. Also the
lookup of a component (`azureml:<name>:<version>` / `@latest`, registered or
declared in the workspace; `azureml://registries/<r>/components/...`).
Pure: no network. No threads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from datamount import yamlfile
from datamount.errors import InvalidInput, SpecError, WorkspaceError
from datamount.jobspec.job import parse_spec
from datamount.jobspec.literals import LITERAL_TYPES, is_primitive
from datamount.jobspec.uris import OUTPUT_ASSET_NAME, OUTPUT_ASSET_RULE, parse
from datamount.workspace.catalog import ComponentVersion, pick_version, read_components
from datamount.workspace.datastores import Workspace, registry_path

DATA_TYPES = ("uri_file", "uri_folder", "mltable")
PLACEHOLDER = "azureml://datastores/workspaceblobstore/paths/component-input/"
COMPONENT_REF = re.compile(r"^azureml:([A-Za-z0-9_.-]+)(?::([^:@]+)|@latest)?$")
REGISTRY_COMPONENT = re.compile(
    r"^azureml://registries/([^/]+)/components/([^/]+)(?:/versions/([^/]+)|/labels/([^/]+))?/?$"
)
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
    outputs = data.get("outputs")
    if isinstance(outputs, dict):
        job["outputs"] = {k: v for k, v in outputs.items() if not is_primitive(v)}
    job.update({"type": "command", "inputs": inputs})
    return job


def find_component(workspace: Workspace, reference: str, where: str) -> tuple[dict[str, Any], Path]:
    """A component `reference` names: (its definition, the folder its paths
    are relative to). `azureml:<name>:<version>` / `@latest`: registered with
    `component create`, or declared in the workspace's `components:`;
    `azureml://registries/<r>/components/<name>[/versions/<v>|/labels/latest]`:
    declared in that registry's `components:` section."""
    if workspace.source is None:
        raise WorkspaceError(f"{where}.component: {reference} needs a workspace file")
    here = f"{where}.component"
    in_registry = REGISTRY_COMPONENT.match(reference)
    if in_registry is not None:
        registry_name, name, version, label = in_registry.groups()
        if label is not None and label != "latest":
            raise SpecError(f"{here}: label {label!r}: only labels/latest is known locally")
        registry = workspace.config.registries.get(registry_name)
        if registry is None:
            known = ", ".join(sorted(workspace.config.registries)) or "none"
            raise ComponentNotFound(
                f"{here}: component {name!r} of registry {registry_name!r}: the registry is not "
                f"in the workspace's registries: section (registries: {known}); declare it "
                "there with its components"
            )
        declared = registry.components.get(name, [])
        entry = pick_version(declared, version)
        if entry is None:
            _missing(
                here, name, version, declared, f"registry {registry_name}", registry.components
            )
        return _declared(workspace.source, entry, here)
    match = COMPONENT_REF.match(reference)
    if match is None:
        raise SpecError(
            f"{here}: {reference!r} is not azureml:<name>:<version> or "
            "azureml://registries/<r>/components/<name>/versions/<v>"
        )
    name, version = match.groups()
    registered = read_components(registry_path(workspace.source, workspace.config))
    found = pick_version(registered.get(name) or [], version)
    if found is not None:
        return dict(found["component"]), workspace.source.parent
    declared = workspace.config.components.get(name, [])
    entry = pick_version(declared, version)
    if entry is None:
        versions = [*(registered.get(name) or []), *declared]
        names = {**workspace.config.components, **registered}
        _missing(here, name, version, versions, "the workspace", names)
    return _declared(workspace.source, entry, here)


class ComponentNotFound(WorkspaceError):
    """A component the workspace does not know here (not registered, no such
    version, a registry not declared): its interface is unknown, not empty."""


def _missing(
    here: str, name: str, version: str | None, versions: list[Any], place: str,
    known: Mapping[str, object],
) -> NoReturn:  # fmt: skip
    if not versions:
        names = ", ".join(sorted(known)) or "none"
        raise ComponentNotFound(
            f"{here}: component {name!r} is not registered in {place} (components: {names}); "
            "use `datamount component create FILE` or the workspace's components: section"
        )
    have = ", ".join(str(v.get("version") if isinstance(v, dict) else v.version) for v in versions)
    raise ComponentNotFound(
        f"{here}: component {name!r} has no version {version!r} in {place} (versions: {have}); "
        "use `datamount component create FILE` to register it"
    )


def _declared(source: Path, entry: ComponentVersion, here: str) -> tuple[dict[str, Any], Path]:
    """A workspace-declared component version: its mapping, or its file read."""
    if entry.component is not None:
        return dict(entry.component), source.parent
    file = (source.parent / str(entry.path)).expanduser().resolve()
    data = yamlfile.load(file, f"{here}: component file {file}", WorkspaceError)
    if not isinstance(data, dict):
        raise WorkspaceError(f"{here}: component file {file}: expected a YAML mapping")
    return data, file.parent
