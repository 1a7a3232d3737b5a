"""Listing and stat of AzureBlobStore on the raw path (azure_list, azure_raw):
field by field equal to what azure-storage-blob reports for the same blobs,
lazy paging, credentials, and the SDK left unimported. The XML reading is
also checked on hand-written answers (no network)."""

from __future__ import annotations

import datetime as dt
import email.utils
import errno
import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from azure.storage.blob import (
    BlobPrefix,
    BlobProperties,
    ContainerClient,
    ContainerSasPermissions,
    ContentSettings,
    generate_container_sas,
)

from azurite import Azurite, free_port
from datamount.errors import AccessDenied, ObjectNotFound, StorageError
from datamount.storage import open_store
from datamount.storage.azure_blob import AzureBlobStore
from datamount.storage.azure_clients import API_VERSION
from datamount.storage.azure_list import http_time, list_params, parse_list
from datamount.storage.base import ObjectInfo
from datamount.storage.credentials import Credential
from datamount.storage.location import StorageKind, StorageLocation
from datamount.storage.retry import RetryPolicy

WRONG_KEY = "V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3Jvbmc="
REPO = Path(__file__).resolve().parent.parent


def fast_retry(retries: int = 2) -> RetryPolicy:
    return RetryPolicy(retries=retries, sleep=lambda s: None)


def key_store(az: Azurite, name: str, key: str | None = None) -> AzureBlobStore:
    return AzureBlobStore(
        az.endpoint,
        name,
        Credential.account_key(key or az.key),
        account=az.account,
        retry=fast_retry(),
    )


def sdk_info(props: BlobProperties, key: str | None = None) -> ObjectInfo:
    """What the store reported when it read these fields from the SDK."""
    md5 = props.content_settings.content_md5 if props.content_settings else None
    etag = props.etag if props.etag.startswith('"') else f'"{props.etag}"'
    return ObjectInfo(
        key=key if key is not None else props.name,
        size=int(props.size or 0),
        etag=etag,
        last_modified=props.last_modified.timestamp() if props.last_modified else None,
        content_md5=bytes(md5) if md5 else None,
        is_dir=(props.metadata or {}).get("hdi_isfolder") == "true",
    )


# -- hand-written answers -------------------------------------------------------

ANSWER = b"""<?xml version="1.0" encoding="utf-8"?>
<EnumerationResults ServiceEndpoint="https://a.blob.core.windows.net/" ContainerName="c">
  <Prefix>p/</Prefix><Delimiter>/</Delimiter>
  <Blobs>
    <BlobPrefix><Name>p/dir/</Name></BlobPrefix>
    <Blob>
      <Name>p/a b.txt</Name>
      <Properties>
        <Last-Modified>Sun, 01 Mar 2026 10:00:05 GMT</Last-Modified>
        <Etag>0x8DE1</Etag>
        <Content-Length>12</Content-Length>
        <Content-MD5>XrY7u+Ae7tCTyyK7j1rNww==</Content-MD5>
      </Properties>
      <Metadata><Blob>not a blob</Blob><NextMarker>not a marker</NextMarker></Metadata>
    </Blob>
    <Blob>
      <Name Encoded="true">p/%EF%BF%BEodd</Name>
      <Properties>
        <Last-Modified>Mon, 02 Mar 2026 23:59:59 GMT</Last-Modified>
        <Etag>"0x8DE2"</Etag>
        <Content-Length>0</Content-Length>
        <Content-MD5 />
      </Properties>
      <Metadata><hdi_isfolder>true</hdi_isfolder></Metadata>
    </Blob>
    <BlobPrefix><Name Encoded="true">p/%01x/</Name></BlobPrefix>
  </Blobs>
  <NextMarker>2!88!MDAwMDI0-</NextMarker>
</EnumerationResults>"""


@pytest.mark.unit
def test_a_list_answer_is_read_by_depth_with_encoded_names() -> None:
    page, marker = parse_list(ANSWER)
    assert marker == "2!88!MDAwMDI0-"
    assert page.prefixes == ["p/dir/", "p/\x01x/"]
    first, second = page.objects
    assert first == ObjectInfo(
        key="p/a b.txt",
        size=12,
        etag='"0x8DE1"',  # quoted, as HEAD and GET return it
        last_modified=dt.datetime(2026, 3, 1, 10, 0, 5, tzinfo=dt.UTC).timestamp(),
        content_md5=hashlib.md5(b"hello world").digest(),
        is_dir=False,  # metadata named Blob / NextMarker are not entries
    )
    assert (second.key, second.etag, second.size) == ("p/\ufffeodd", '"0x8DE2"', 0)
    assert second.content_md5 is None and second.is_dir


@pytest.mark.unit
def test_an_empty_last_page_and_a_broken_answer() -> None:
    page, marker = parse_list(b"<EnumerationResults><Blobs /><NextMarker /></EnumerationResults>")
    assert (page.objects, page.prefixes, marker) == ([], [], None)
    with pytest.raises(StorageError) as info:
        parse_list(b"<html><body>proxy says no", target="acct/c/p")
    assert info.value.transient and "not a listing" in str(info.value)


@pytest.mark.unit
def test_list_params_leave_empty_ones_out() -> None:
    assert list_params("", None, None) == [
        ("restype", "container"),
        ("comp", "list"),
        ("maxresults", "5000"),
        ("include", "metadata"),
    ]
    assert ("marker", "m!1") in list_params("p/", "/", "m!1")


@pytest.mark.unit
@pytest.mark.parametrize(
    "text",
    [
        "Sun, 01 Mar 2026 10:00:00 GMT",
        "Thu, 29 Feb 2024 23:59:59 GMT",
        "Thu, 01 Jan 1970 00:00:00 GMT",
        "Sunday, 01-Mar-26 10:00:00 GMT",  # RFC 850: the general parser's job
        "Sun, 01 Mar 2026 11:00:00 +0100",
    ],
)
def test_http_time_equals_the_general_parser(text: str) -> None:
    assert http_time(text) == email.utils.parsedate_to_datetime(text).timestamp()


@pytest.mark.unit
def test_http_time_of_nothing_or_junk_is_none() -> None:
    assert http_time(None) is None and http_time("") is None and http_time("soon") is None


@pytest.mark.unit
def test_the_raw_path_speaks_the_sdk_service_version() -> None:
    client = ContainerClient("http://127.0.0.1:1/acct", "c")
    assert client.api_version == API_VERSION  # a newer SDK: raise API_VERSION with it


# -- on Azurite -----------------------------------------------------------------

TREE: dict[str, bytes] = {
    "tree/a.txt": b"alpha",
    "tree/b/c.txt": b"charlie",
    "tree/b/d/e.txt": b"echo",
    "tree/x/": b"",  # a folder marker by name
    "tree/x/inside.txt": b"in x",
    "tree/dir with space/naïve 日本.txt": b"unicode",
    "tree/hash#tag/50%off %20 %2F.dat": b"percent",
    "tree/plus+amp&=;,'!(x)~.bin": b"punctuation",
    "top.txt": b"top",
}


def seed_tree(container: ContainerClient) -> None:
    for name, data in TREE.items():
        container.upload_blob(name, data)
    # A folder marker by metadata (as ADLS and its tools write them).
    container.upload_blob("tree/dir", b"", metadata={"hdi_isfolder": "true"})
    # Metadata names that are also element names of the listing.
    container.upload_blob("tree/meta", b"m", metadata={"Blob": "x", "NextMarker": "y", "k": "v"})
    container.upload_blob(
        "tree/md5.bin",
        b"with md5",
        content_settings=ContentSettings(content_md5=bytearray(hashlib.md5(b"with md5").digest())),
    )
    blocks = container.get_blob_client("tree/blocks.bin")  # committed blocks: no Content-MD5
    blocks.stage_block("AAAA", b"block one ")
    blocks.stage_block("AAAB", b"block two")
    blocks.commit_block_list(["AAAA", "AAAB"])


def sdk_listing(
    container: ContainerClient, prefix: str, delimiter: str | None
) -> tuple[list[ObjectInfo], list[str]]:
    start = prefix or None
    paged = (
        container.walk_blobs(start, delimiter=delimiter, include=["metadata"])
        if delimiter
        else container.list_blobs(start, include=["metadata"])
    )
    objects: list[ObjectInfo] = []
    prefixes: list[str] = []
    for page in paged.by_page():
        for item in page:
            if isinstance(item, BlobPrefix):
                prefixes.append(item.name)
            else:
                objects.append(sdk_info(item))
    return objects, prefixes


@pytest.mark.azurite
def test_raw_listing_equals_the_sdk_listing(azurite: Azurite, container: ContainerClient) -> None:
    seed_tree(container)
    store = key_store(azurite, container.container_name)
    for prefix, delimiter in [
        ("", None),
        ("tree/", None),
        ("tree/x", None),
        ("", "/"),
        ("tree/", "/"),
        ("tree/x/", "/"),
        ("tree/hash#tag/", "/"),
        ("tree/plus+amp&=;", None),
        ("tree/dir with space/na", None),
        ("nothing/", "/"),
    ]:
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        for page in store.list_pages(prefix, delimiter=delimiter):
            objects += page.objects
            prefixes += page.prefixes
        want_objects, want_prefixes = sdk_listing(container, prefix, delimiter)
        assert prefixes == want_prefixes, (prefix, delimiter)
        assert len(objects) == len(want_objects)
        for ours, theirs in zip(objects, want_objects, strict=True):
            assert ours == theirs, (prefix, delimiter)
    listed = {o.key: o for p in store.list_pages("tree/") for o in p.objects}
    # Every kind of field was exercised, not just its absence.
    assert listed["tree/dir"].is_dir and not listed["tree/x/"].is_dir
    assert listed["tree/x/"].size == 0 and listed["tree/meta"].size == 1
    assert listed["tree/md5.bin"].content_md5 == hashlib.md5(b"with md5").digest()
    assert listed["tree/blocks.bin"].content_md5 is None
    assert all(o.etag.startswith('"') and o.last_modified for o in listed.values())
    store.close()


@pytest.mark.azurite
def test_stat_equals_the_sdk_properties(azurite: Azurite, container: ContainerClient) -> None:
    seed_tree(container)
    store = key_store(azurite, container.container_name)
    names = [*TREE, "tree/dir", "tree/meta", "tree/md5.bin", "tree/blocks.bin"]
    for name in names:
        want = sdk_info(container.get_blob_client(name).get_blob_properties(), name)
        assert store.stat(name) == want
    listed = {o.key: o for p in store.list_pages("") for o in p.objects}
    assert {n: store.stat(n) for n in names} == {n: listed[n] for n in names}
    assert store.stat("tree/dir").is_dir
    with pytest.raises(ObjectNotFound) as info:
        store.stat("tree/missing")
    assert info.value.errno == errno.ENOENT and "tree/missing" in str(info.value)
    store.close()


@pytest.mark.slow
@pytest.mark.azurite
def test_paging_is_lazy_over_5003_blobs(
    azurite: Azurite, many_blobs: tuple[str, dict[str, bytes]]
) -> None:
    name, blobs = many_blobs
    store = key_store(azurite, name)
    seen: list[tuple[str, str, int]] = []
    store.raw.hooks.append(
        lambda method, path, headers, status: seen.append((method, path, status))
    )
    pages = store.list_pages("many/")
    assert seen == []  # nothing is asked for before the first page is wanted
    first = next(pages)
    assert len(first.objects) == 5000 and len(seen) == 1
    assert seen[0] == ("GET", store.raw.container_path, 200)
    second = next(pages)
    assert len(second.objects) == 3 and len(seen) == 2
    assert next(pages, None) is None and len(seen) == 2
    keys = [o.key for o in first.objects + second.objects]
    assert keys == sorted(blobs)
    assert all(o.size == len(blobs[o.key]) for o in first.objects + second.objects)
    folders = [p for page in store.list_pages("many/", delimiter="/") for p in page.prefixes]
    assert folders == [f"many/{i:03d}/" for i in range(51)]
    store.close()


@pytest.mark.azurite
def test_wrong_key_list_and_stat_are_access_denied_without_the_key(
    azurite: Azurite, container: ContainerClient
) -> None:
    container.upload_blob("secret/blob", b"x")
    store = key_store(azurite, container.container_name, WRONG_KEY)
    seen: list[int] = []
    store.raw.hooks.append(lambda method, path, headers, status: seen.append(status))
    for op, call in (
        ("list", lambda: next(store.list_pages("secret/"))),
        ("stat", lambda: store.stat("secret/blob")),
    ):
        with pytest.raises(AccessDenied) as info:
            call()
        assert (info.value.errno, info.value.status) == (errno.EACCES, 403)
        text = f"{info.value} {info.value!r} {info.value.args}"
        assert WRONG_KEY not in text and WRONG_KEY[:20] not in text
        assert str(info.value).startswith(f"{op} ") and "secret/" in text
    assert seen == [403, 403]  # permanent: not repeated
    store.close()


def sas_store(az: Azurite, container: ContainerClient, **permissions: bool) -> AzureBlobStore:
    sas = generate_container_sas(
        az.account,
        container.container_name,
        account_key=az.key,
        permission=ContainerSasPermissions(**permissions),
        expiry=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1),
    )
    location = StorageLocation(
        StorageKind.BLOB,
        "",
        account=az.account,
        container=container.container_name,
        endpoint=az.endpoint,
        credential=Credential.sas(sas),
    )
    store = open_store(location, retry=fast_retry())
    assert isinstance(store, AzureBlobStore)
    return store


@pytest.mark.azurite
def test_sas_list_and_stat(azurite: Azurite, container: ContainerClient) -> None:
    seed_tree(container)
    store = sas_store(azurite, container, read=True, list=True)
    listed = [o for p in store.list_pages("tree/hash#tag/", delimiter="/") for o in p.objects]
    assert [o.key for o in listed] == ["tree/hash#tag/50%off %20 %2F.dat"]
    assert store.stat(listed[0].key) == listed[0]
    store.close()
    no_list = sas_store(azurite, container, read=True)
    with pytest.raises(AccessDenied) as info:
        next(no_list.list_pages("tree/"))
    assert "sig=" not in str(info.value) and info.value.status == 403
    assert no_list.stat("tree/a.txt").size == 5
    no_list.close()
    no_read = sas_store(azurite, container, list=True)
    with pytest.raises(AccessDenied):
        no_read.stat("tree/a.txt")
    assert [o.key for o in next(no_read.list_pages("tree/b/")).objects] == [
        "tree/b/c.txt",
        "tree/b/d/e.txt",
    ]
    no_read.close()


def run_python(code: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.unit
def test_importing_the_store_does_not_load_the_sdk() -> None:
    code = "import sys, datamount.storage.azure_blob; print('azure.storage.blob' in sys.modules)"
    assert run_python(code) == "False"


@pytest.mark.azurite
def test_reads_listing_stat_and_errors_never_load_the_sdk(
    azurite: Azurite, container: ContainerClient
) -> None:
    container.upload_blob("s/blob", b"0123456789")
    code = """
        import os, sys
        from datamount.storage.credentials import Credential
        from datamount.errors import AccessDenied, ObjectNotFound
        from datamount.storage.retry import RetryPolicy
        from datamount.storage.azure_blob import AzureBlobStore

        def store(key):
            return AzureBlobStore(os.environ["EP"], os.environ["CT"], Credential.account_key(key),
                                  account=os.environ["AC"], retry=RetryPolicy(retries=0))

        s = store(os.environ["KEY"])
        assert [o.key for p in s.list_pages("s/", delimiter="/") for o in p.objects] == ["s/blob"]
        assert s.stat("s/blob").size == 10 and s.read("s/blob", 2, 3) == b"234"
        s.put("s/new", b"new")
        try:
            s.stat("s/missing")
        except ObjectNotFound:
            pass
        try:
            next(store(os.environ["WRONG"]).list_pages(""))
        except AccessDenied:
            pass
        heavy = ("azure.storage.blob", "azure.core", "requests", "urllib3")
        print(sorted(m for m in heavy if m in sys.modules))
        s.delete("s/new")  # an SDK operation: imports it now
        print("azure.storage.blob" in sys.modules)
    """
    out = run_python(
        code,
        EP=azurite.endpoint,
        CT=container.container_name,
        AC=azurite.account,
        KEY=azurite.key,
        WRONG=WRONG_KEY,
    )
    assert out.splitlines() == ["[]", "True"]
    assert [b.name for b in container.list_blobs()] == ["s/blob"]


@pytest.mark.unit
def test_list_and_stat_keep_the_error_table() -> None:
    # A port nobody listens on: connection refused, transient, repeated.
    store = AzureBlobStore(
        f"http://127.0.0.1:{free_port()}/acct", "c", Credential.anonymous(), retry=fast_retry(1)
    )
    for call in (lambda: next(store.list_pages("p/")), lambda: store.stat("p/b")):
        with pytest.raises(StorageError) as info:
            call()
        assert info.value.errno == errno.EIO and "connection refused" in str(info.value)
    assert store.retry.stats.retries == 2
    store.close()
