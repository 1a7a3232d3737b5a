"""fsspec's `azureml` protocol: `azureml://datastores/<ds>/paths/<p>` (also the
long `azureml://subscriptions/.../workspaces/<w>/datastores/<ds>/paths/<p>`
form) read through adlfs with the datastore's account, endpoint and
credentials from the workspace registry.

Registered through the `fsspec.specs` entry point (pyproject.toml), so
`fsspec.open("azureml://datastores/ds/paths/x.csv", workspace=ws)` and
`pandas.read_csv("azureml://...", storage_options={"workspace": ...})` work.
`workspace` is a Workspace, a path (str or os.PathLike) to a workspace file,
or omitted: then `DATAMOUNT_WORKSPACE`, else ./configs/workspace.yaml, as the
CLI finds it (mltable/wsarg.py; this module is its own composition root for
code outside datamount, so it reads the environment, once, at construction).
Read-only.

Paths inside this filesystem are `datastores/<ds>/paths/<p>` (protocol
stripped). Threads: none of its own; reads run on adlfs's, as fsspec drives it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fsspec.spec import AbstractFileSystem

from datamount.errors import InvalidInput
from datamount.jobspec.uris import LocationKind, parse
from datamount.mltable.wsarg import WorkspaceArg, workspace_from
from datamount.storage.credentials import CredentialKind
from datamount.storage.location import StorageLocation

PREFIX = "datastores/"


class AzureMLFileSystem(AbstractFileSystem):
    protocol = ("azureml",)
    root_marker = ""

    def __init__(self, workspace: WorkspaceArg = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # No workspace file at all is an error here (missing_ok=False): every
        # path this filesystem serves names a datastore of the workspace.
        self.workspace = workspace_from(workspace, os.environ, Path.cwd(), missing_ok=False)
        self._adlfs: dict[str, Any] = {}

    # -- paths --------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = str(path)
        if text.startswith("azureml://"):
            location = parse(text, "azureml path")
            if location.kind is not LocationKind.DATASTORE:
                raise InvalidInput(f"{text!r}: the azureml filesystem reads datastore paths only")
            text = f"{PREFIX}{location.datastore}/paths/{location.path}"
        return text.rstrip("/")

    def _split(self, path: str) -> tuple[Any, str, str]:
        """(adlfs filesystem, 'container/blob path', our prefix for this datastore)."""
        path = self._strip_protocol(path)
        parts = path.split("/", 3)
        if len(parts) < 3 or parts[0] != "datastores" or parts[2] != "paths":
            raise FileNotFoundError(f"not a datastore path: {path!r}")
        name, rest = parts[1], parts[3] if len(parts) > 3 else ""
        location = self.workspace.resolve(parse(f"azureml://{path}/"), where="azureml")
        fs = self._adlfs.get(name)
        if fs is None:
            fs = self._adlfs[name] = _adlfs_for(location)
        return fs, f"{location.container}/{rest}".rstrip("/"), f"{PREFIX}{name}/paths/"

    @staticmethod
    def _ours(entry: dict[str, Any], container: str, prefix: str) -> dict[str, Any]:
        name = str(entry["name"]).rstrip("/")
        inner = name.split("/", 1)[1] if "/" in name else ""
        return {**entry, "name": f"{prefix}{inner}".rstrip("/"), "container": container}

    # -- read operations -----------------------------------------------------

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        fs, inner, prefix = self._split(path)
        container = inner.split("/", 1)[0]
        entries = [self._ours(e, container, prefix) for e in fs.ls(inner, detail=True, **kwargs)]
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        fs, inner, prefix = self._split(path)
        return self._ours(fs.info(inner, **kwargs), inner.split("/", 1)[0], prefix)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        fs, inner, _ = self._split(path)
        return bytes(fs.cat_file(inner, start=start, end=end, **kwargs))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if mode != "rb":
            raise PermissionError(f"the azureml filesystem is read-only (mode {mode!r})")
        fs, inner, _ = self._split(path)
        return fs._open(inner, mode, **kwargs)


def _adlfs_for(location: StorageLocation) -> Any:
    """An adlfs filesystem on the datastore's account, endpoint and credential."""
    from adlfs import AzureBlobFileSystem

    cred = location.credential
    secret = cred.secret.reveal() if cred.secret else ""
    default = f"https://{location.account}.blob.{location.endpoint_suffix}"
    if location.endpoint.rstrip("/") != default:  # Azurite, a sovereign cloud, a private link
        protocol = "https" if location.endpoint.startswith("https") else "http"
        parts = [
            f"DefaultEndpointsProtocol={protocol}",
            f"AccountName={location.account}",
            f"BlobEndpoint={location.endpoint.rstrip('/')}",
        ]
        if cred.kind is CredentialKind.ACCOUNT_KEY:
            parts.append(f"AccountKey={secret}")
        elif cred.kind is CredentialKind.SAS:
            parts.append(f"SharedAccessSignature={secret}")
        return AzureBlobFileSystem(
            connection_string=";".join(parts) + ";", skip_instance_cache=True
        )
    if cred.kind is CredentialKind.ACCOUNT_KEY:
        return AzureBlobFileSystem(account_name=location.account, account_key=secret)
    if cred.kind is CredentialKind.SAS:
        return AzureBlobFileSystem(account_name=location.account, sas_token=secret)
    if cred.kind is CredentialKind.ANONYMOUS:
        return AzureBlobFileSystem(account_name=location.account, anon=True)
    # user / managed identity: adlfs' own DefaultAzureCredential chain
    return AzureBlobFileSystem(account_name=location.account, anon=False)
