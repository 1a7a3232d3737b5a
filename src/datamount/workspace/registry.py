"""Data asset and model registration: the versions jobs add to the workspace
registry (`data_assets:`, and `models:` for the model types).

Assets declared by hand live in the workspace file (`data_assets:`), which
holds comments and `${VAR}` references datamount must never rewrite. Versions
registered by jobs go to a second file next to it — `<stem>.assets.yaml`, or
the workspace's `registry_file:` — which `Workspace.load` merges in.

Registration is atomic and safe between processes on one node: under an
exclusive `flock` on `<registry>.lock`, the registry is re-read, the name and
version checked against both files, and the new content written to a
temporary file that is fsync'd and renamed over the old one. Two jobs
registering at once both land; a reader never sees half a file.

Threads: none of its own; the flock is the one lock (between processes).
"""

from __future__ import annotations

import time
from typing import Any

import yaml

from datamount.errors import WorkspaceError
from datamount.jobspec.uris import OUTPUT_ASSET_NAME, OUTPUT_ASSET_RULE
from datamount.workspace.catalog import kind_of, read_components, read_registry_file
from datamount.workspace.datastores import Workspace, registry_path, version_key
from datamount.workspace.locked import locked, write_atomic

HEADER = (
    "# Data asset and model versions registered by datamount jobs (merged into the workspace).\n"
    "# Written atomically under a lock; edit only while no job runs.\n"
)


def next_version(versions: list[str]) -> str:
    """One more than the highest numeric version ('1' for a new asset)."""
    numbers = [int(v) for v in versions if v.isdigit()]
    return str(max(numbers, default=0) + 1)


def register(
    workspace: Workspace,
    name: str,
    version: str | None,
    *,
    type_: str,
    path: str,
    description: str | None = None,
    job: str | None = None,
) -> str:
    """Register `name` (at `version`, or the next number) pointing at `path`
    as a data asset, or a model when `type_` is a model type; returns the
    version. An existing name+version is a WorkspaceError."""
    kind = kind_of(type_)
    what = "model" if kind == "model" else "data asset"
    if workspace.source is None:
        raise WorkspaceError(
            f"{what} {name!r}: registering needs a workspace file "
            "(--workspace FILE or DATAMOUNT_WORKSPACE)"
        )
    if not OUTPUT_ASSET_NAME.fullmatch(name):
        raise WorkspaceError(f"{what} name {name!r}: not a {what} name ({OUTPUT_ASSET_RULE})")
    target = registry_path(workspace.source, workspace.config)
    declared = [v.version for v in workspace.declared_versions(name, kind)]
    section = "models" if kind == "model" else "data_assets"
    with locked(target):
        sections = read_registry_file(target)
        registry = sections.setdefault(section, {})
        entries = registry.setdefault(name, [])
        taken = declared + [str(e.get("version")) for e in entries]
        chosen = version if version is not None else next_version(taken)
        if chosen in taken:
            raise WorkspaceError(
                f"{what} {name}:{chosen} is already registered; choose another version "
                "or leave it out to take the next one"
            )
        entry: dict[str, Any] = {"version": chosen, "type": type_, "path": path}
        if description:
            entry["description"] = description
        if job:
            entry["job"] = job
        entry["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        entries.append(entry)
        entries.sort(key=lambda e: version_key(str(e.get("version"))))
        kept: dict[str, Any] = {k: v for k, v in sections.items() if v or k == "data_assets"}
        components = read_components(target)
        if components:
            kept["components"] = components
        body = yaml.safe_dump(kept, sort_keys=True, allow_unicode=True)
        write_atomic(target, HEADER + body)
    return chosen


def register_component(
    workspace: Workspace, name: str, version: str | None, component: dict[str, Any]
) -> str:
    """Register a component definition (its YAML mapping, with `code` made
    absolute) as `name` at `version` (or the next number); returns the version."""
    if workspace.source is None:
        raise WorkspaceError(
            f"component {name!r}: registering needs a workspace file "
            "(--workspace FILE or DATAMOUNT_WORKSPACE)"
        )
    target = registry_path(workspace.source, workspace.config)
    with locked(target):
        sections: dict[str, Any] = {k: v for k, v in read_registry_file(target).items() if v}
        sections.setdefault("data_assets", {})
        components = read_components(target)
        entries = components.setdefault(name, [])
        taken = [str(e.get("version")) for e in entries]
        chosen = version if version is not None else next_version(taken)
        if chosen in taken:
            raise WorkspaceError(
                f"component {name}:{chosen} is already registered; choose another version "
                "or leave it out to take the next one"
            )
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        entries.append({"version": chosen, "created": created, "component": component})
        entries.sort(key=lambda e: version_key(str(e.get("version"))))
        sections["components"] = components
        body = yaml.safe_dump(sections, sort_keys=True, allow_unicode=True)
        write_atomic(target, HEADER + body)
    return chosen
