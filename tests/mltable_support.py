"""Helpers for the MLTable tests: a store wrapper that counts listing pages,
listed prefixes and bytes read, a workspace on Azurite, a local http server."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from datamount.storage import ListPage, ObjectInfo, ObjectStore, open_store
from datamount.storage.location import StorageLocation
from datamount.storage.retry import RetryPolicy
from datamount.workspace.datastores import Workspace, WorkspaceConfig


class CountingStore:
    """Wraps a real ObjectStore; counts what the MLTable code asks of it."""

    def __init__(self, inner: ObjectStore, log: Counts) -> None:
        self.inner, self.log = inner, log

    def list_pages(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ListPage]:
        self.log.add("prefixes", (prefix, delimiter))
        for page in self.inner.list_pages(prefix, delimiter=delimiter):
            self.log.add("pages", prefix)
            self.log.bump("listed", len(page.objects))
            yield page

    def stat(self, key: str) -> ObjectInfo:
        self.log.add("stats", key)
        return self.inner.stat(key)

    def read(self, key: str, offset: int, length: int, *, etag: str | None = None) -> bytes:
        data = self.inner.read(key, offset, length, etag=etag)
        self.log.bump("reads", 1)
        self.log.bump("bytes", len(data))
        return data

    def read_into(
        self, key: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        n = self.inner.read_into(key, offset, buffer, etag=etag)
        self.log.bump("reads", 1)
        self.log.bump("bytes", n)
        self.log.add("ranges", (key, offset, len(buffer)))
        return n

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # write operations: not used here
        return getattr(self.inner, name)


class Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lists: dict[str, list[Any]] = {}
        self.totals: dict[str, int] = {}

    def add(self, what: str, item: Any) -> None:
        with self.lock:
            self.lists.setdefault(what, []).append(item)

    def bump(self, what: str, n: int) -> None:
        with self.lock:
            self.totals[what] = self.totals.get(what, 0) + n

    def __getitem__(self, what: str) -> Any:
        return self.lists.get(what, []) if what in self.lists else self.totals.get(what, 0)


def counting_factory(counts: Counts) -> Any:
    def factory(location: StorageLocation) -> ObjectStore:
        inner = open_store(
            location, pool_size=8, retry=RetryPolicy(retries=2, sleep=lambda s: None)
        )
        return CountingStore(inner, counts)  # type: ignore[return-value]

    return factory


def azurite_workspace(
    endpoint: str,
    key: str,
    datastores: dict[str, str],
    accounts: dict[str, tuple[str, str]] | None = None,
) -> Workspace:
    """Datastores name → container on the Azurite account at `endpoint`;
    `accounts` name → (endpoint, key) for wasbs:// URIs naming other accounts."""
    account = endpoint.rstrip("/").rsplit("/", 1)[1]
    config: dict[str, Any] = {
        "datastores": {
            name: {
                "account_name": account,
                "container_name": container,
                "endpoint": endpoint,
                "credentials": {"account_key": key},
            }
            for name, container in datastores.items()
        },
        "accounts": {account: {"endpoint": endpoint, "account_key": key}},
    }
    for name, (ep, k) in (accounts or {}).items():
        config["accounts"][name] = {"endpoint": ep, "account_key": k}
    return Workspace(WorkspaceConfig.model_validate(config))


@contextlib.contextmanager
def http_folder(root: Path) -> Iterator[str]:
    """Serve `root` over http on 127.0.0.1 (plain http.server: no ranges, no
    ETags); yields the base URL, ending in '/'."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass
