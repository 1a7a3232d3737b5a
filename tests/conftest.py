"""Shared fixtures: a real Azurite blob service for the session, a fresh
container per test, the mount points of a test (detached at its end), a
FaultProxy in front of the session's Azurite and an HTTPS file server with the
test CA's leaf (`https_site`). Tests that use them are marked `azurite` automatically
(select or skip them with `-m azurite` / `-m "not azurite"`). Every test
carries a tier marker (unit, azurite, fuse, oracle, slow: pyproject.toml);
collection fails, naming them, if any has none."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import ssl
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from azure.storage.blob import ContainerClient

from azurite import KEY, SECOND, SECOND_KEY, Azurite, AzuriteMissing, make_certs
from datamount.storage import ObjectStore, open_store
from datamount.storage.credentials import Credential
from datamount.storage.location import StorageKind, StorageLocation
from datamount.storage.retry import RetryPolicy
from faultproxy import FaultProxy
from fuse_helpers import Mounts, tracked_mounts

# Seeding 5,003 blobs costs Azurite ~10 s (≈2 ms per request): do it once.
MANY = {f"many/{i // 100:03d}/{i:05d}.txt": str(i).encode() for i in range(5_003)}


def _serving(service: Azurite) -> Iterator[Azurite]:
    """Start `service` (a missing Azurite fails the test, not errors it), yield
    it, stop it."""
    try:
        service.start()
    except AzuriteMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    yield from _serving(Azurite(tmp_path_factory.mktemp("azurite")))


@pytest.fixture(scope="session")
def two_accounts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """An Azurite of its own serving devstoreaccount1 and a second account
    SECOND (AZURITE_ACCOUNTS), so the session instance other tests use is unchanged."""
    service = Azurite(tmp_path_factory.mktemp("azurite2"))
    saved = os.environ.get("AZURITE_ACCOUNTS")
    os.environ["AZURITE_ACCOUNTS"] = f"devstoreaccount1:{KEY};{SECOND}:{SECOND_KEY}"
    try:
        service.start()
    except AzuriteMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    finally:
        if saved is None:
            del os.environ["AZURITE_ACCOUNTS"]
        else:
            os.environ["AZURITE_ACCOUNTS"] = saved
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="session")
def azurite_https(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """An Azurite of its own serving HTTPS with a leaf certificate for
    127.0.0.1 signed by a throwaway CA (`.tls.ca`, trusted by nothing on the host)."""
    certs = make_certs(tmp_path_factory.mktemp("tls"))
    yield from _serving(Azurite(tmp_path_factory.mktemp("azurite-https"), tls=certs))


@pytest.fixture
def run_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TMPDIR of the CLI processes a test starts, under tmp_path: a `datamount
    run` without --workdir makes its work folder there, and a failed one
    keeps its step logs there, not in the machine's /tmp."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    return scratch


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[Mounts]:
    """Every mount point of a test, detached and its daemon killed at the end."""
    yield from tracked_mounts(tmp_path)


@pytest.fixture
def proxy(azurite: Azurite) -> Iterator[FaultProxy]:
    """A FaultProxy in front of the session's Azurite, closed at the end."""
    with FaultProxy(azurite.port) as p:
        yield p


@pytest.fixture
def container(azurite: Azurite) -> Iterator[ContainerClient]:
    client = azurite.create_container(f"t{uuid.uuid4().hex[:24]}")
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            client.delete_container()


@pytest.fixture(scope="session")
def many_blobs(azurite: Azurite) -> tuple[str, dict[str, bytes]]:
    """A container holding MANY: 5,003 blobs under many/, two listing pages."""
    client = azurite.create_container(f"many{uuid.uuid4().hex[:20]}")
    azurite.seed(client, MANY, threads=32)
    return client.container_name, MANY


def store_on(
    azurite: Azurite,
    container: str,
    *,
    endpoint: str | None = None,
    pool_size: int = 16,
    retries: int = 3,
) -> ObjectStore:
    """An AzureBlobStore on `container` through the public factory, fast
    retries; `endpoint`: another way to Azurite (e.g. a FaultProxy's)."""
    location = StorageLocation(
        StorageKind.BLOB,
        "",
        account=azurite.account,
        container=container,
        endpoint=endpoint or azurite.endpoint,
        credential=Credential.account_key(azurite.key),
    )
    return open_store(
        location, pool_size=pool_size, retry=RetryPolicy(retries=retries, sleep=lambda s: None)
    )


def seeded_stores(
    azurite: Azurite, container: ContainerClient, endpoint: str, *, retries: int
) -> Iterator[Callable[[dict[str, bytes]], ObjectStore]]:
    """For a `seeded` fixture: `make(blobs)` uploads `blobs` to the test's
    container and opens a store on it through `endpoint` (a proxy that sees
    every process's requests); the stores close at the end of the test."""
    stores: list[ObjectStore] = []

    def make(blobs: dict[str, bytes]) -> ObjectStore:
        for name, body in blobs.items():
            container.upload_blob(name, body, overwrite=True)
        store = store_on(
            azurite, container.container_name, endpoint=endpoint, pool_size=8, retries=retries
        )
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def azure_store(azurite: Azurite, container: ContainerClient) -> Iterator[ObjectStore]:
    store = store_on(azurite, container.container_name)
    yield store
    store.close()


TIERS = ("unit", "azurite", "fuse", "oracle", "slow")
AZURITE_FIXTURES = {"azurite", "azurite_https", "azurite_oauth", "two_accounts"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks `azurite` every test that uses an Azurite (one of AZURITE_FIXTURES,
    directly or through another fixture), then fails the session, naming them,
    if any collected test carries none of the tier markers TIERS: every test
    says its tier (`make test-fast` runs `-m unit`)."""
    for item in items:
        if AZURITE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.azurite)
    unmarked = [item.nodeid for item in items if not any(map(item.get_closest_marker, TIERS))]
    if unmarked:
        shown = "\n  ".join(unmarked[:50])
        more = f"\n  ... and {len(unmarked) - 50} more" if len(unmarked) > 50 else ""
        raise pytest.UsageError(
            f"{len(unmarked)} test(s) without a tier marker (one of {', '.join(TIERS)}; "
            f"e.g. `pytestmark = pytest.mark.unit` or `@pytest.mark.unit`):\n  {shown}{more}"
        )


@pytest.fixture(scope="session")
def azurite_oauth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """An Azurite of its own serving HTTPS (a throwaway CA, `.tls.ca`) with
    `--oauth basic`: it accepts bearer tokens (azurite.bearer_token) and
    refuses expired ones. Started only when a test asks for it."""
    certs = make_certs(tmp_path_factory.mktemp("tls-oauth"))
    yield from _serving(Azurite(tmp_path_factory.mktemp("azurite-oauth"), tls=certs, oauth=True))


@pytest.fixture
def https_site(azurite_https: Azurite, tmp_path: Path) -> Iterator[str]:
    """An HTTPS file server on loopback with the test CA's leaf: its root URL."""
    assert azurite_https.tls is not None
    certs = azurite_https.tls
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "f.txt").write_bytes(b"0123456789")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path / "www"))
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.cert, certs.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
