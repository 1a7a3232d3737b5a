"""AzureBlobStore on a real Azurite: paging, credentials, request counts,
retries, and the open_store factory."""

from __future__ import annotations

import datetime as dt
import errno
import http.server
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import requests
from azure.storage.blob import ContainerClient, ContainerSasPermissions, generate_container_sas

from azurite import Azurite
from datamount.errors import AccessDenied, ObjectNotFound, Throttled
from datamount.storage import open_store
from datamount.storage.azure_blob import AzureBlobStore, account_of
from datamount.storage.credentials import Credential
from datamount.storage.location import StorageKind, StorageLocation
from datamount.storage.retry import RetryPolicy

WRONG_KEY = "V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3Jvbmc="


def fast_retry(retries: int = 2) -> RetryPolicy:
    return RetryPolicy(retries=retries, sleep=lambda s: None)


def key_store(az: Azurite, container: ContainerClient, **kw: Any) -> AzureBlobStore:
    return AzureBlobStore(
        az.endpoint,
        container.container_name,
        Credential.account_key(az.key),
        account=az.account,
        retry=kw.pop("retry", fast_retry()),
        **kw,
    )


class RequestCounter:
    """Counts a store's requests by HTTP method: the SDK's (a requests Session
    hook) and the raw path's (a RawClient hook)."""

    def __init__(self, store: AzureBlobStore) -> None:
        self.methods: Counter[str] = Counter()
        self.ranges: list[str | None] = []
        store.session.hooks["response"].append(self._sdk)
        store.raw.hooks.append(self._raw)

    def _count(self, method: str, headers: Mapping[str, str]) -> None:
        self.methods[method] += 1
        self.ranges.append(headers.get("x-ms-range") or headers.get("Range"))

    def _sdk(self, r: requests.Response, *args: Any, **kwargs: Any) -> None:
        self._count(r.request.method or "", r.request.headers)

    def _raw(self, method: str, path: str, headers: dict[str, str], status: int) -> None:
        self._count(method, headers)

    @property
    def total(self) -> int:
        return sum(self.methods.values())


@pytest.mark.slow
@pytest.mark.azurite
def test_listing_crosses_the_5000_page_boundary_lazily(
    azurite: Azurite, many_blobs: tuple[str, dict[str, bytes]]
) -> None:
    name, names = many_blobs
    store = key_store(
        azurite, ContainerClient.from_connection_string(azurite.connection_string, name)
    )
    counter = RequestCounter(store)
    pages = store.list_pages("many/")
    first = next(pages)
    assert len(first.objects) == 5000
    assert counter.methods["GET"] == 1  # the second page is not requested yet
    rest = list(pages)
    assert len(rest) == 1 and len(rest[0].objects) == 3
    assert counter.methods["GET"] == 2
    listed = [o.key for o in first.objects + rest[0].objects]
    assert listed == sorted(names)
    store.close()


@pytest.mark.azurite
def test_a_read_is_exactly_one_bounded_request(
    azurite: Azurite, container: ContainerClient
) -> None:
    data = bytes(range(256)) * 8192  # 2 MiB
    store = key_store(azurite, container)
    info = store.put("one/blob", data)
    counter = RequestCounter(store)
    assert store.read("one/blob", 1000, 1 << 20) == data[1000 : 1000 + (1 << 20)]
    assert store.read("one/blob", 5, 10, etag=info.etag) == data[5:15]
    assert store.read("one/blob", len(data) - 3, 100) == data[-3:]
    assert store.read("one/blob", len(data), 100) == b""
    assert counter.methods == Counter({"GET": 4})
    # Every range is bounded: never 'bytes=N-' (DESIGN §7).
    assert counter.ranges[0] == f"bytes=1000-{1000 + (1 << 20) - 1}"
    assert all(r and not r.endswith("-") for r in counter.ranges)
    store.close()


@pytest.mark.azurite
def test_wrong_account_key_is_access_denied_without_the_key(
    azurite: Azurite, container: ContainerClient
) -> None:
    container.upload_blob("secret/blob", b"x")
    store = AzureBlobStore(
        azurite.endpoint,
        container.container_name,
        Credential.account_key(WRONG_KEY),
        account=azurite.account,
        retry=fast_retry(),
    )
    counter = RequestCounter(store)
    for call in (lambda: store.read("secret/blob", 0, 1), lambda: next(store.list_pages(""))):
        with pytest.raises(AccessDenied) as info:
            call()
        assert info.value.errno == errno.EACCES
        assert info.value.status == 403
        text = f"{info.value} {info.value!r} {info.value.args}"
        assert WRONG_KEY not in text and WRONG_KEY[:20] not in text
        assert "secret/blob" in str(info.value) or "list" in str(info.value)
    assert counter.total == 2  # 403 is permanent: no retries
    assert WRONG_KEY not in repr(store)
    store.close()


@pytest.mark.azurite
def test_sas_credential_works_and_never_shows(azurite: Azurite, container: ContainerClient) -> None:
    sas = generate_container_sas(
        azurite.account,
        container.container_name,
        account_key=azurite.key,
        permission=ContainerSasPermissions(read=True, write=True, list=True, delete=True),
        expiry=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1),
    )
    location = StorageLocation(
        StorageKind.BLOB,
        "sas/",
        account=azurite.account,
        container=container.container_name,
        endpoint=azurite.endpoint,
        credential=Credential.sas("?" + sas),
    )
    store = open_store(location, retry=fast_retry())
    store.put("sas/a", b"hello sas")
    assert store.read("sas/a", 6, 100) == b"sas"
    assert [o.key for p in store.list_pages("sas/") for o in p.objects] == ["sas/a"]
    assert store.copy("sas/a", "sas/b").size == 9
    signature = sas.split("sig=")[1].split("&")[0]
    with pytest.raises(ObjectNotFound) as info:
        store.read("sas/missing", 0, 1)
    assert signature not in str(info.value) and "sig=" not in str(info.value)
    store.close()


@pytest.mark.azurite
def test_open_store_serves_adls_through_the_blob_endpoint(
    azurite: Azurite, container: ContainerClient
) -> None:
    container.upload_blob("lake/dir/file.csv", b"a,b\n1,2\n")
    container.upload_blob("lake/dir/sub", b"", metadata={"hdi_isfolder": "true"})
    location = StorageLocation(
        StorageKind.ADLS,
        "lake/dir/file.csv",
        account=azurite.account,
        container=container.container_name,
        endpoint=azurite.endpoint,
        credential=Credential.account_key(azurite.key),
    )
    store = open_store(location, retry=fast_retry())
    assert isinstance(store, AzureBlobStore)
    assert store.stat(location.key).size == 8
    assert store.read(location.key, 4, 4) == b"1,2\n"
    listed = {o.key: o.is_dir for p in store.list_pages("lake/dir/") for o in p.objects}
    assert listed == {"lake/dir/file.csv": False, "lake/dir/sub": True}  # ADLS directory marker
    assert store.stat("lake/dir/sub").is_dir
    store.close()


@pytest.mark.azurite
def test_stores_on_one_container_share_one_client(
    azurite: Azurite, container: ContainerClient
) -> None:
    a = key_store(azurite, container, pool_size=4)
    b = key_store(azurite, container, pool_size=32)
    a.put("lazy", b"x")
    assert a.stat("lazy").size == 1 and next(a.list_pages("")).objects
    assert a._shared.sdk_clients is None  # no SDK client until an SDK operation
    assert a.session is b.session  # created now, for both, with the larger pool
    adapter = a.session.get_adapter("http://127.0.0.1/")
    assert adapter._pool_maxsize == 32
    assert a.raw is b.raw and a.raw.pool.maxsize == 32  # the raw path's pool too
    a.close()
    b.put("shared", b"still open")  # the other user keeps the client alive
    assert b.read("shared", 0, 5) == b"still"
    b.close()
    c = key_store(azurite, container)
    assert c.session is not a.session  # the last close released it
    c.close()


@pytest.mark.unit
def test_identity_credentials_map_to_azure_identity() -> None:
    from azure.identity import ChainedTokenCredential, ManagedIdentityCredential

    from datamount.storage.azure_clients import sdk_credential
    from datamount.storage.credentials import CredentialKind

    managed = Credential(CredentialKind.MANAGED_IDENTITY, client_id="1234")
    assert isinstance(sdk_credential(managed, "acct"), ManagedIdentityCredential)
    user = Credential(CredentialKind.USER_IDENTITY)
    assert isinstance(sdk_credential(user, "acct"), ChainedTokenCredential)
    assert sdk_credential(Credential.anonymous(), "acct") is None


@pytest.mark.unit
def test_account_of_endpoint() -> None:
    assert account_of("http://127.0.0.1:10000/devstoreaccount1") == "devstoreaccount1"
    assert account_of("https://acct.blob.core.windows.net") == "acct"
    assert account_of("https://acct.blob.core.chinacloudapi.cn/") == "acct"


# -- retries: the SDK's are off, ours count --------------------------------


class _Busy(http.server.BaseHTTPRequestHandler):
    """Answers every request 503 ServerBusy with Retry-After: 2."""

    protocol_version = "HTTP/1.1"
    seen: list[str] = []

    def _answer(self) -> None:
        self.seen.append(self.command)
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(503)
        self.send_header("Retry-After", "2")
        self.send_header("x-ms-error-code", "ServerBusy")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_PUT = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def busy_server() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Busy", (_Busy,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/devstoreaccount1", seen
    server.shutdown()
    server.server_close()


@pytest.mark.unit
@pytest.mark.parametrize("retries", [0, 3])
def test_only_our_policy_retries(busy_server: tuple[str, list[str]], retries: int) -> None:
    endpoint, seen = busy_server
    delays: list[float] = []
    policy = RetryPolicy(retries=retries, sleep=delays.append)
    store = AzureBlobStore(endpoint, "c", Credential.account_key(WRONG_KEY), retry=policy)
    with pytest.raises(Throttled) as info:
        store.read("blob", 0, 10)
    assert info.value.errno == errno.EAGAIN
    assert len(seen) == retries + 1  # the SDK itself never repeats a request
    assert policy.stats.retries == retries
    assert all(d >= 2.0 for d in delays)  # Retry-After honoured
    store.close()


@pytest.mark.slow
@pytest.mark.azurite
def test_directory_listing_starts_with_a_small_page(
    azurite: Azurite, container: ContainerClient
) -> None:
    """`ls` / os.scandir wait on the first page of a delimiter listing: it is
    1,000 entries, the next ones 5,000; a recursive listing keeps 5,000."""
    from datamount.storage.azure_list import FIRST_DIR_PAGE_SIZE

    azurite.seed(container, {f"flat/{i:05d}": b"" for i in range(1_203)}, threads=32)
    store = key_store(azurite, container)
    sizes = [len(p.objects) for p in store.list_pages("flat/", delimiter="/")]
    assert sizes == [FIRST_DIR_PAGE_SIZE, 1_203 - FIRST_DIR_PAGE_SIZE]
    assert [len(p.objects) for p in store.list_pages("flat/")] == [1_203]
    store.close()
