"""Storage: the ObjectStore protocol and the store for each kind of location.

`open_store` is the one factory the composition root calls. Only this package
imports the Azure SDK and requests; everything above it sees `ObjectStore`,
`ObjectInfo`, `ListPage` and the `datamount.errors` classes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from datamount.storage.base import ListPage, ObjectInfo, ObjectStore, ReadableStore, WritableStore
from datamount.storage.latency import MAX_IN_FLIGHT
from datamount.storage.location import StorageKind, StorageLocation
from datamount.storage.retry import DEFAULT_MIN_SECONDS, RetryPolicy

if TYPE_CHECKING:
    from datamount.settings import Settings

__all__ = [
    "ListPage",
    "ObjectInfo",
    "ObjectStore",
    "ReadableStore",
    "WritableStore",
    "open_store",
    "store_for",
]


def open_store(
    location: StorageLocation,
    *,
    pool_size: int = 16,
    retry: RetryPolicy | None = None,
    read_timeout: float = 30.0,
    ca_bundle: Path | None = None,
) -> ObjectStore:
    """The store serving `location`; its keys are `location.key`-style.

    LOCAL → LocalStore rooted at '/'; HTTP → HttpStore rooted at scheme://host;
    BLOB and ADLS → AzureBlobStore on the container (ADLS through its blob
    endpoint), sharing one client per (endpoint, container, credential).
    `pool_size` bounds keep-alive connections; size it to the thread counts.
    `read_timeout`: seconds a request may go without receiving a byte before
    it is abandoned (and retried as a transient error). HTTPS trusts the
    system store plus `ca_bundle` (REQUESTS_CA_BUNDLE; see storage.tls).
    """
    retry = retry or RetryPolicy(min_seconds=DEFAULT_MIN_SECONDS)
    if location.kind is StorageKind.LOCAL:
        from datamount.storage.local import LocalStore

        return LocalStore("/")
    if location.kind is StorageKind.HTTP:
        from datamount.storage.http import HttpStore

        return HttpStore(
            location.store_root,
            pool_size=pool_size,
            retry=retry,
            read_timeout=read_timeout,
            ca_bundle=ca_bundle,
        )
    if location.is_azure:
        from datamount.storage.azure_blob import AzureBlobStore

        return AzureBlobStore.from_location(
            location,
            pool_size=pool_size,
            retry=retry,
            read_timeout=read_timeout,
            ca_bundle=ca_bundle,
        )
    raise ValueError(f"no store for {location.kind}")


def store_for(settings: Settings, location: StorageLocation, retry: RetryPolicy) -> ObjectStore:
    """`open_store` sized from the settings: one keep-alive connection per
    worker that may hold one at a time, stalled reads abandoned after
    DATAMOUNT_STALL_TIMEOUT_SECONDS, HTTPS trusting REQUESTS_CA_BUNDLE too.

    A location with replicas (inside the first copy's store) gets a
    ReplicaStore over one store per copy, reading `location.prefer` first
    (storage.replicas): its copies give up after the retry count alone,
    failing over instead of waiting out DATAMOUNT_RETRY_MIN_SECONDS."""
    # Room for the requests in flight a link's round trip may ask for (storage.latency).
    pool = max(settings.downloader_threads, settings.read_threads, MAX_IN_FLIGHT)

    def one(copy: StorageLocation, retry: RetryPolicy = retry) -> ObjectStore:
        return open_store(
            copy,
            pool_size=pool,
            retry=retry,
            read_timeout=settings.stall_timeout_seconds,
            ca_bundle=settings.ca_bundle,
        )

    copies = location.replicas
    if not copies or copies[0].store_root != location.store_root:
        return one(dataclasses.replace(location, replicas=(), prefer=0))
    from datamount.storage.replicas import Replica, ReplicaStore

    return ReplicaStore(
        [Replica(one(copy, retry.without_budget()), copy.key, copy.uri()) for copy in copies],
        preferred=location.prefer,
    )
