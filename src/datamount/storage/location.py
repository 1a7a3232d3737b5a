"""A concrete storage location: where bytes live and how to authenticate.

`uris.parse` turns a spec path into a `uris.Location` (which may still name a
datastore or data asset); `workspace.Workspace.resolve` turns that into a
`StorageLocation`, the only thing the storage layer accepts. Immutable
values; no threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import quote, urlsplit

from datamount.storage.credentials import Credential

DEFAULT_SUFFIX = "core.windows.net"


class StorageKind(StrEnum):
    LOCAL = "local"
    HTTP = "http"
    BLOB = "azure_blob"
    ADLS = "azure_data_lake_gen2"


@dataclass(frozen=True)
class StorageLocation:
    """One resolved place.

    - LOCAL: `path` is an absolute filesystem path.
    - HTTP: `path` is the full http(s) URL of a single public file.
    - BLOB / ADLS: `path` is the blob name or prefix inside `container`
      ('' = the container root, a trailing '/' marks a folder), `endpoint`
      is the account's *blob* endpoint (ADLS reads go through it too).

    `replicas`: every copy of the data as resolved (the spec's `path:` first,
    then its `replicas:`, an extension), each a plain location; `prefer` is
    the index of the copy to read first (RANK % n). They stay as they are in
    a location derived from this one (`child`, `dataclasses.replace`): a store
    for any key under the first copy's is a storage.replicas.ReplicaStore.
    """

    kind: StorageKind
    path: str
    account: str = ""
    container: str = ""
    endpoint: str = ""
    endpoint_suffix: str = DEFAULT_SUFFIX
    credential: Credential = field(default_factory=Credential.anonymous)
    replicas: tuple[StorageLocation, ...] = ()
    prefer: int = 0

    @property
    def is_azure(self) -> bool:
        return self.kind in (StorageKind.BLOB, StorageKind.ADLS)

    @property
    def is_folder(self) -> bool:
        return self.path.endswith("/") or (self.is_azure and self.path == "")

    @property
    def key(self) -> str:
        """The object key (or prefix) inside the store that serves this location.

        Azure: the blob name in the container. Local: the absolute path
        without its leading '/' (the local store is rooted at '/'). HTTP: the
        URL path without its leading '/' (the store is rooted at scheme://host).
        """
        if self.kind is StorageKind.HTTP:
            parts = urlsplit(self.path)
            return parts.path.lstrip("/") + (f"?{parts.query}" if parts.query else "")
        if self.kind is StorageKind.LOCAL:
            return self.path.lstrip("/")
        return self.path

    @property
    def store_root(self) -> str:
        """Identity of the store (one client per account and container)."""
        if self.kind is StorageKind.HTTP:
            parts = urlsplit(self.path)
            return f"{parts.scheme}://{parts.netloc}"
        if self.kind is StorageKind.LOCAL:
            return "/"
        return f"{self.endpoint.rstrip('/')}/{self.container}"

    def uri(self) -> str:
        """The URI handed to a job in `direct` mode."""
        if self.kind is StorageKind.LOCAL or self.kind is StorageKind.HTTP:
            return self.path
        quoted = quote(self.path, safe="/~")
        if self.kind is StorageKind.ADLS:
            return f"abfss://{self.container}@{self.account}.dfs.{self.endpoint_suffix}/{quoted}"
        return f"{self.endpoint.rstrip('/')}/{self.container}/{quoted}"

    def child(self, relative: str) -> StorageLocation:
        """The location of `relative` under this folder location."""
        base = self.path if self.is_folder or not self.path else self.path + "/"
        if self.kind is StorageKind.LOCAL and not base.endswith("/"):
            base += "/"
        return StorageLocation(
            self.kind,
            base + relative.lstrip("/"),
            self.account,
            self.container,
            self.endpoint,
            self.endpoint_suffix,
            self.credential,
            self.replicas,
            self.prefer,
        )

    def __str__(self) -> str:
        return self.uri()
