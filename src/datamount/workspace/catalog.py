"""The versioned assets a workspace knows: data assets (`data_assets:`),
models (`models:`), components (`components:`) and the assets of the
registries it can read (`registries: {<name>: {data: ..., models: ...,
components: ...}}`), and the lookup of an `azureml:<name>:<version>` /
`@latest` reference among them.

A data-typed entry looks among data assets and a model-typed one among
models; a reference found only in the other section is one clear error
saying so. Also the reading of the file jobs register versions to (workspace/registry.py writes
it). No threads.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from datamount import yamlfile
from datamount.errors import WorkspaceError
from datamount.jobspec.uris import Location

MODEL_TYPE_NAMES = ("mlflow_model", "custom_model", "triton_model")


class AssetVersion(BaseModel):
    model_config = ConfigDict(extra="allow")
    version: str
    type: Literal["uri_file", "uri_folder", "mltable"]
    path: str
    description: str | None = None


class ModelVersion(BaseModel):
    """A model version: a folder (an MLflow, custom or Triton model)."""

    model_config = ConfigDict(extra="allow")
    version: str
    type: Literal["mlflow_model", "custom_model", "triton_model"] = "custom_model"
    path: str
    description: str | None = None


class ComponentVersion(BaseModel):
    """A component version declared in the workspace file: its YAML file
    (`path:`, relative to the workspace file) or the mapping itself
    (`component:`)."""

    model_config = ConfigDict(extra="allow")
    version: str
    path: str | None = None
    component: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ComponentVersion:
        if (self.path is None) == (self.component is None):
            raise ValueError("give the component as `path:` (a YAML file) or `component:`")
        return self


class RegistryConfig(BaseModel):
    """One Azure ML registry, as a section of the workspace file."""

    model_config = ConfigDict(extra="allow")
    data: dict[str, list[AssetVersion]] = Field(default_factory=dict)
    models: dict[str, list[ModelVersion]] = Field(default_factory=dict)
    components: dict[str, list[ComponentVersion]] = Field(default_factory=dict)


Entry = AssetVersion | ModelVersion

REGISTRY_SECTIONS = ("data_assets", "models")


def _load(path: Path) -> Any:
    """The registry file's YAML ({} when empty), None when there is none yet."""
    data = yamlfile.load(path, f"asset registry {path}", WorkspaceError, if_missing=_missing)
    return None if data is _MISSING else data or {}


_MISSING = object()


def _missing() -> object:
    return _MISSING


def read_registry_file(path: Path) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The versions registered by jobs, per section and name ({} when none yet)."""
    data = _load(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise WorkspaceError(f"asset registry {path}: expected 'data_assets:' lists of versions")
    sections: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for section in REGISTRY_SECTIONS:
        assets = data.get(section, {})
        if not isinstance(assets, dict) or not all(isinstance(v, list) for v in assets.values()):
            raise WorkspaceError(f"asset registry {path}: expected '{section}:' lists of versions")
        sections[section] = {str(k): list(v) for k, v in assets.items()}
    return sections


def read_components(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The components registered with `datamount component create`, per name
    (each version: `{version, created, component: <its YAML mapping>}`)."""
    data = _load(path)
    if data is None:
        return {}
    components = data.get("components", {}) if isinstance(data, dict) else None
    if not isinstance(components, dict) or not all(
        isinstance(v, list) for v in components.values()
    ):
        raise WorkspaceError(f"asset registry {path}: expected 'components:' lists of versions")
    return {str(k): list(v) for k, v in components.items()}


def pick_version(versions: list[Any], version: str | None) -> Any | None:
    """The entry of `version` among `versions` (each with a `version`), the
    highest when `version` is None; None when there is no such version."""
    if not versions:
        return None
    if version is None:
        return max(versions, key=lambda e: version_key(str(_version(e))))
    return next((e for e in versions if str(_version(e)) == version), None)


def _version(entry: Any) -> object:
    return entry.get("version") if isinstance(entry, dict) else entry.version


def read_registry(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The data asset versions registered by jobs, per asset name."""
    return read_registry_file(path).get("data_assets", {})


def version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """Numeric-aware ordering: '10' > '9', '1.10' > '1.9', digits before words."""
    parts = re.split(r"[.\-_]", version)
    return tuple((1, int(p)) if p.isdigit() else (0, p) for p in parts)


def kind_of(type_name: str | None) -> str:
    """'model' for a model type name, else 'data'."""
    return "model" if type_name in MODEL_TYPE_NAMES else "data"


class Catalog:
    """The sections to look in; built from a workspace's (merged) config."""

    def __init__(
        self,
        data: dict[str, list[AssetVersion]],
        models: dict[str, list[ModelVersion]],
        registries: dict[str, RegistryConfig],
    ) -> None:
        self.data = data
        self.models = models
        self.registries = registries

    def find(self, location: Location, kind: str, where: str) -> tuple[str, Entry]:
        """The version `location` names, as ('name:version', entry), among
        assets of `kind` ('data' or 'model') of the workspace or its registry."""
        what = "model" if kind == "model" else "data asset"
        data: dict[str, list[AssetVersion]] = self.data
        models: dict[str, list[ModelVersion]] = self.models
        place = "the workspace"
        if location.registry:
            registry = self.registries.get(location.registry)
            if registry is None:
                known = ", ".join(sorted(self.registries)) or "none"
                raise WorkspaceError(
                    f"{where}: registry {location.registry!r} is not in the workspace's "
                    f"registries: section (registries: {known})"
                )
            data, models, place = registry.data, registry.models, f"registry {location.registry}"
        name = location.asset_name
        section: dict[str, list[AssetVersion]] | dict[str, list[ModelVersion]]
        section, other = (models, data) if kind == "model" else (data, models)
        versions: list[Entry] = list(section.get(name, []))
        if not versions:
            if other.get(name):
                found = "a model" if kind != "model" else "a data asset"
                types = "a model type" if kind != "model" else "uri_file, uri_folder or mltable"
                raise WorkspaceError(
                    f"{where}: {name!r} is {found} in {place}, not a {what}: the entry's type "
                    f"must be {types}"
                )
            known = ", ".join(sorted(section)) or "none"
            raise WorkspaceError(
                f"{where}: {what} {name!r} is not registered in {place} (registered: {known})"
            )
        version = location.asset_version
        if version is None:
            entry = max(versions, key=lambda v: version_key(v.version))
            return f"{name}:{entry.version}", entry
        for entry in versions:
            if entry.version == version:
                return f"{name}:{version}", entry
        have = ", ".join(sorted((v.version for v in versions), key=version_key))
        raise WorkspaceError(
            f"{where}: {what} {name!r} has no version {version!r} (versions: {have})"
        )
