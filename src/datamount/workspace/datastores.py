"""The workspace registry (datastores, accounts, data assets, models, components,
registries, the run history) and resolution of any spec `Location` into a
concrete `StorageLocation` with its credential.

There is no cloud service behind it: a YAML file (docs/specs.md). Loading
expands `${VAR}` from the mapping it is given (never os.environ directly) and
registers every secret with the log redactor.

Threads: none of its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from datamount import yamlfile
from datamount.errors import UriError, WorkspaceError
from datamount.jobspec.uris import DEFAULT_SUFFIX, Location, LocationKind, parse
from datamount.log import register_secret
from datamount.storage.credentials import Credential, CredentialKind
from datamount.storage.location import StorageKind, StorageLocation
from datamount.workspace import runhistory
from datamount.workspace.catalog import (
    AssetVersion,
    Catalog,
    ComponentVersion,
    ModelVersion,
    RegistryConfig,
    kind_of,
    read_registry_file,
)
from datamount.workspace.catalog import read_registry as read_registry  # re-exported
from datamount.workspace.catalog import version_key as version_key  # re-exported
from datamount.workspace.expand import Recording, expand

DEFAULT_WORKSPACE = Path("configs/workspace.yaml")
_MAX_ASSET_DEPTH = 16  # an asset pointing at an asset ... deeper than this is a cycle


class Credentials(BaseModel):
    model_config = ConfigDict(extra="forbid")
    account_key: SecretStr | None = None
    sas_token: SecretStr | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Credentials:
        if self.account_key and self.sas_token:
            raise ValueError("give account_key or sas_token, not both")
        return self

    def credential(self) -> Credential:
        return _credential(self.account_key, self.sas_token) or Credential.anonymous()


class Datastore(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["azure_blob", "azure_data_lake_gen2"] = "azure_blob"
    account_name: str
    container_name: str | None = None
    filesystem: str | None = None
    endpoint: str | None = None  # blob endpoint; default https://<account>.blob.<suffix>
    endpoint_suffix: str = DEFAULT_SUFFIX
    protocol: Literal["https", "http"] = "https"
    credentials: Credentials | None = None
    description: str | None = None

    @model_validator(mode="after")
    def _container(self) -> Datastore:
        if not (self.container_name or self.filesystem):
            key = "filesystem" if self.type == "azure_data_lake_gen2" else "container_name"
            raise ValueError(f"missing '{key}'")
        return self

    @property
    def container(self) -> str:
        return self.container_name or self.filesystem or ""


class Account(BaseModel):
    model_config = ConfigDict(extra="forbid")
    endpoint: str | None = None
    endpoint_suffix: str = DEFAULT_SUFFIX
    account_key: SecretStr | None = None
    sas_token: SecretStr | None = None


def _missing(path: Path) -> Callable[[], Any]:
    def missing() -> Any:
        raise WorkspaceError(
            f"workspace file {path} not found (use --workspace FILE or DATAMOUNT_WORKSPACE)"
        )

    return missing


class WorkspaceConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    datastores: dict[str, Datastore] = Field(default_factory=dict)
    accounts: dict[str, Account] = Field(default_factory=dict)
    data_assets: dict[str, list[AssetVersion]] = Field(default_factory=dict)
    models: dict[str, list[ModelVersion]] = Field(default_factory=dict)
    registries: dict[str, RegistryConfig] = Field(default_factory=dict)
    components: dict[str, list[ComponentVersion]] = Field(default_factory=dict)
    registry_file: str | None = None  # where jobs register versions (workspace/registry.py)


def registry_path(source: Path, config: WorkspaceConfig) -> Path:
    """The file registered asset versions go to: `registry_file:` (relative to
    the workspace file), else `<workspace stem>.assets.yaml` beside it."""
    if config.registry_file:
        return source.parent / os.path.expanduser(config.registry_file)
    return source.with_name(f"{source.stem}.assets.yaml")


def find_workspace(flag: str | None, environ: Mapping[str, str], cwd: Path) -> Path:
    """--workspace FILE, else DATAMOUNT_WORKSPACE, else ./configs/workspace.yaml."""
    if flag:
        return Path(flag)
    if environ.get("DATAMOUNT_WORKSPACE"):
        return Path(environ["DATAMOUNT_WORKSPACE"])
    return cwd / DEFAULT_WORKSPACE


class Workspace:
    """A loaded registry. `resolve` is pure lookup: no network."""

    def __init__(self, config: WorkspaceConfig, source: Path | None = None) -> None:
        self.config = config
        self.source = source
        # The versions written in the workspace file itself (before registered ones).
        self._declared = {k: list(v) for k, v in config.data_assets.items()}
        self._declared_models = {k: list(v) for k, v in config.models.items()}
        # The environment variables the file referenced as ${VAR} (secrets among them).
        self.variables: frozenset[str] = frozenset()

    def declared_versions(self, name: str, kind: str = "data") -> list[Any]:
        declared = self._declared_models if kind == "model" else self._declared
        return list(declared.get(name, []))

    def versions(self, name: str, kind: str = "data") -> list[AssetVersion | ModelVersion]:
        """Every known version of data asset (or model) `name`."""
        section = self.config.models if kind == "model" else self.config.data_assets
        return list(section.get(name, []))

    @property
    def catalog(self) -> Catalog:
        return Catalog(self.config.data_assets, self.config.models, self.config.registries)

    def history_path(self) -> Path | None:
        """The run history (workspace/runhistory.py), beside the asset registry."""
        if self.source is None:
            return None
        return runhistory.history_path(registry_path(self.source, self.config), self.source)

    @classmethod
    def empty(cls) -> Workspace:
        return cls(WorkspaceConfig())

    @classmethod
    def load(cls, path: Path, environ: Mapping[str, str]) -> Workspace:
        data = yamlfile.load(
            path, f"workspace file {path}", WorkspaceError, if_missing=_missing(path)
        )
        if data is None:
            raise WorkspaceError(
                f"workspace file {path}: empty; expected a mapping (datastores: ...)"
            )
        if not isinstance(data, dict):
            raise WorkspaceError(f"workspace file {path}: expected a mapping at the top level")
        problems: list[str] = []
        used: set[str] = set()
        expanded = expand(data, Recording(environ, used), "", problems)
        if problems:
            raise WorkspaceError([f"workspace file {path}: {p}" for p in problems])
        try:
            config = WorkspaceConfig.model_validate(expanded)
        except ValidationError as exc:
            raise WorkspaceError(
                [
                    f"workspace file {path}: {'.'.join(map(str, e['loc']))}: "
                    f"{e['msg'].removeprefix('Value error, ')}"
                    for e in exc.errors()
                ]
            ) from None
        for store in config.datastores.values():
            if store.credentials:
                _register(store.credentials.account_key, store.credentials.sas_token)
        for account in config.accounts.values():
            _register(account.account_key, account.sas_token)
        workspace = cls(config, path)
        workspace.variables = frozenset(used)
        workspace._merge_registered(registry_path(path, config))
        return workspace

    def _merge_registered(self, registry: Path) -> None:
        """Add the versions jobs registered (workspace/registry.py) to `data_assets`
        and `models`."""
        for section, by_name in read_registry_file(registry).items():
            model = ModelVersion if section == "models" else AssetVersion
            target: dict[str, list[Any]] = getattr(self.config, section)
            for name, versions in by_name.items():
                try:
                    entries = [model.model_validate(v) for v in versions]
                except ValidationError as exc:
                    raise WorkspaceError(
                        f"asset registry {registry}: {section}.{name}: {exc.errors()[0]['msg']}"
                    ) from None
                merged = target.setdefault(str(name), [])
                have = {v.version for v in merged}
                merged.extend(e for e in entries if e.version not in have)

    # -- resolution -----------------------------------------------------------

    def resolve(
        self,
        location: Location,
        *,
        where: str = "path",
        identity: str | None = None,
        client_id: str | None = None,
        base_dir: Path | None = None,
        expected_type: str | None = None,
    ) -> StorageLocation:
        """Turn a parsed path into a concrete location + credential.

        `identity` is 'user_identity' / 'managed_identity' (identity-based
        access replaces stored credentials) or None / 'aml_token'.
        """
        if location.kind is LocationKind.JOB_OUTPUT:
            location = self._job_output(location, where, expected_type)
        if location.kind is LocationKind.ASSET:
            location = self._asset_target(location, where, expected_type)
        if location.kind is LocationKind.LOCAL:
            base = base_dir or Path.cwd()
            path = os.path.normpath(os.path.abspath(base / os.path.expanduser(location.path)))
            return StorageLocation(
                StorageKind.LOCAL, path + ("/" if location.path.endswith("/") else "")
            )
        if location.kind is LocationKind.HTTP:
            return self._http(location, identity, client_id)
        if location.kind is LocationKind.DATASTORE:
            return self._datastore(location, where, identity, client_id)
        kind = StorageKind.BLOB if location.kind is LocationKind.BLOB else StorageKind.ADLS
        endpoint, credential = self._account(location.account, location, location.container)
        return StorageLocation(
            kind,
            location.path,
            account=location.account,
            container=location.container,
            endpoint=endpoint,
            endpoint_suffix=location.endpoint_suffix,
            credential=_identity_credential(identity, client_id) or credential,
        )

    def _job_output(self, location: Location, where: str, expected: str | None) -> Location:
        history = self.history_path()
        if history is None:
            raise WorkspaceError(
                f"{where}: {location.raw!r}: job outputs are found in the run history, "
                "which lives beside the workspace file (--workspace FILE or DATAMOUNT_WORKSPACE)"
            )
        output = runhistory.output_of(history, location.job, location.job_output, where)
        if expected and kind_of(output.type) != kind_of(expected):
            raise WorkspaceError(
                f"{where}: output {location.job_output!r} of run {location.job} is a "
                f"{output.type}, but the entry is a {expected}"
            )
        try:
            target = parse(output.path, f"run {location.job} outputs.{location.job_output}")
        except UriError as exc:
            raise WorkspaceError(exc.problems) from None
        if not location.path:
            return target
        return Location(**{**target.__dict__, "path": _join(target.path, location.path)})

    def _asset_target(self, location: Location, where: str, expected: str | None) -> Location:
        seen: list[str] = []
        kind = kind_of(expected) if expected else (location.asset_kind or "data")
        catalog = self.catalog
        while location.kind is LocationKind.ASSET:
            ref, entry = catalog.find(location, kind, where)
            if ref in seen or len(seen) >= _MAX_ASSET_DEPTH:
                raise WorkspaceError(f"{where}: data asset cycle: {' -> '.join([*seen, ref])}")
            seen.append(ref)
            what = "model" if kind == "model" else "data asset"
            if expected and entry.type != expected:
                raise WorkspaceError(
                    f"{where}: {what} {ref} is a {entry.type}, but the spec declares "
                    f"type {expected}"
                )
            try:
                location = parse(entry.path, f"{what} {ref} path")
            except UriError as exc:
                raise WorkspaceError(exc.problems) from None
            if location.kind is LocationKind.LOCAL and not os.path.isabs(location.path):
                raise WorkspaceError(f"{where}: {what} {ref} has a relative local path")
        return location

    def asset(self, name: str, version: str | None, where: str = "path") -> AssetVersion:
        ref = Location(LocationKind.ASSET, name, asset_name=name, asset_version=version)
        entry = self.catalog.find(ref, "data", where)[1]
        assert isinstance(entry, AssetVersion)
        return entry

    def _datastore(
        self, location: Location, where: str, identity: str | None, client_id: str | None
    ) -> StorageLocation:
        store = self.config.datastores.get(location.datastore)
        if store is None:
            known = ", ".join(sorted(self.config.datastores)) or "none"
            raise WorkspaceError(
                f"{where}: datastore {location.datastore!r} is not in the workspace "
                f"(datastores: {known})"
            )
        endpoint = (
            store.endpoint
            or f"{store.protocol}://{store.account_name}.blob.{store.endpoint_suffix}"
        )
        credential = store.credentials.credential() if store.credentials else None
        if credential is None:  # fall back to the accounts section, then anonymous
            _, credential = self._account(store.account_name, location, store.container)
        kind = StorageKind.ADLS if store.type == "azure_data_lake_gen2" else StorageKind.BLOB
        return StorageLocation(
            kind,
            location.path,
            account=store.account_name,
            container=store.container,
            endpoint=endpoint.rstrip("/"),
            endpoint_suffix=store.endpoint_suffix,
            credential=_identity_credential(identity, client_id) or credential,
        )

    def _account(self, account: str, location: Location, container: str) -> tuple[str, Credential]:
        """Endpoint and stored credential for an account named by a URI.

        Always HTTPS, `wasb://` and `abfs://` too, as Azure ML reads them:
        Azure accounts refuse plain HTTP by default ("secure transfer
        required"), and a key-signed request over HTTP is readable on the
        way. An account's explicit `endpoint:` (Azurite's) still decides."""
        scheme = "https"
        conf = self.config.accounts.get(account)
        if conf is not None:
            endpoint = conf.endpoint or f"{scheme}://{account}.blob.{conf.endpoint_suffix}"
            credential = _credential(conf.account_key, conf.sas_token)
            return endpoint.rstrip("/"), credential or self._datastore_credential(
                account, container
            )
        suffix = location.endpoint_suffix
        return f"{scheme}://{account}.blob.{suffix}", self._datastore_credential(account, container)

    def _datastore_credential(self, account: str, container: str) -> Credential:
        """A datastore over the same account and container lends its credential."""
        for store in self.config.datastores.values():
            same = store.account_name == account and store.container == container
            if same and store.credentials:
                return store.credentials.credential()
        return Credential.anonymous()

    def _http(
        self, location: Location, identity: str | None, client_id: str | None
    ) -> StorageLocation:
        """A URL under a configured account endpoint (Azurite, sovereign clouds) is blob storage."""
        url = location.path
        for name, conf in self.config.accounts.items():
            if not conf.endpoint:
                continue
            base = conf.endpoint.rstrip("/") + "/"
            if url.startswith(base):
                container, _, rest = url[len(base) :].partition("/")
                inner = parse(f"wasbs://{container}@{name}.blob.{conf.endpoint_suffix}/{rest}")
                inner = Location(**{**inner.__dict__, "secure": url.startswith("https")})
                return self.resolve(inner, identity=identity, client_id=client_id)
        return StorageLocation(StorageKind.HTTP, url)


def _join(base: str, sub: str) -> str:
    """`sub` below `base` (a storage path or a local one)."""
    if not base:
        return sub
    return base.rstrip("/") + "/" + sub


def _identity_credential(identity: str | None, client_id: str | None) -> Credential | None:
    if identity == "user_identity":
        return Credential(CredentialKind.USER_IDENTITY)
    if identity == "managed_identity":
        return Credential(CredentialKind.MANAGED_IDENTITY, client_id=client_id)
    return None


def _credential(key: SecretStr | None, sas: SecretStr | None) -> Credential | None:
    if key is not None and key.get_secret_value():
        return Credential.account_key(key.get_secret_value())
    if sas is not None and sas.get_secret_value():
        return Credential.sas(sas.get_secret_value())
    return None


def _register(*secrets: SecretStr | None) -> None:
    for secret in secrets:
        if secret is not None and secret.get_secret_value():
            register_secret(secret.get_secret_value())
