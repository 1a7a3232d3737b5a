"""HTTPS end to end: the one TLS context of storage.tls against an Azurite
serving HTTPS with a throwaway CA (the `azurite_https` fixture), through the
raw path, the SDK path, an https source and the CLI (download, upload, and
real FUSE ro_mount and rw_mount). The CA is trusted only through SSL_CERT_FILE or
REQUESTS_CA_BUNDLE; without either, a command fails with one line naming the
host and the certificate problem, and writes nothing.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.storage.blob import ContainerClient

from azurite import Azurite
from datamount.errors import SettingsError, StorageError
from datamount.settings import Settings
from datamount.storage import open_store, store_for, tls
from datamount.storage.credentials import Credential
from datamount.storage.http import HttpStore
from datamount.storage.location import StorageKind, StorageLocation
from datamount.storage.retry import RetryPolicy
from fuse_helpers import Mounts, datamount, mount_env, mounted, spec_file

TREE = {
    "ds/a.txt": b"alpha\n",
    "ds/sub/b.bin": os.urandom(300_000),
    "ds/sub/deeper/c.txt": b"c" * 1000,
}
TRUST_VARS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


@pytest.fixture
def https_container(azurite_https: Azurite) -> Iterator[ContainerClient]:
    client = azurite_https.create_container(f"tls{uuid.uuid4().hex[:20]}")
    azurite_https.seed(client, TREE)
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            client.delete_container()


def location(azurite: Azurite, container: str) -> StorageLocation:
    return StorageLocation(
        StorageKind.BLOB,
        "",
        account=azurite.account,
        container=container,
        endpoint=azurite.endpoint,
        credential=Credential.account_key(azurite.key),
    )


def cli_env(azurite: Azurite, tmp_path: Path, container: str, **trust: str) -> dict[str, str]:
    env = mount_env(azurite, tmp_path, container)
    for name in TRUST_VARS:
        env.pop(name, None)
    return {**env, **trust}


def tree_of(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


# -- the context and the setting ---------------------------------------------


@pytest.mark.unit
def test_a_missing_or_bad_ca_bundle_is_a_settings_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"REQUESTS_CA_BUNDLE": str(tmp_path / "nope.pem")})
    assert "REQUESTS_CA_BUNDLE=" in str(caught.value) and "no such file" in str(caught.value)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"REQUESTS_CA_BUNDLE": str(junk)})
    assert "REQUESTS_CA_BUNDLE=" in str(caught.value) and "PEM" in str(caught.value)


def test_the_context_adds_the_bundle_and_falls_back_to_certifi_only_without_a_store(
    azurite_https: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert azurite_https.tls is not None
    ca = azurite_https.tls.ca
    ctx, sources = tls._build(ca)
    assert "the system store" in sources and f"REQUESTS_CA_BUNDLE ({ca})" in sources
    assert "certifi (" not in sources
    # OpenSSL reads SSL_CERT_FILE / SSL_CERT_DIR itself: point both at nothing.
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("SSL_CERT_FILE", str(empty / "none.pem"))
    monkeypatch.setenv("SSL_CERT_DIR", str(empty))
    ctx, sources = tls._build(None)
    assert sources.startswith("certifi (") and ctx.cert_store_stats()["x509_ca"] > 0
    # SSL_CERT_FILE naming the test CA: the system store is that CA alone.
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    ctx, sources = tls._build(None)
    assert ctx.cert_store_stats()["x509_ca"] == 1 and "certifi (" not in sources


# -- the stores ----------------------------------------------------------------


def test_raw_and_sdk_paths_trust_the_bundle_and_name_the_host_when_they_do_not(
    azurite_https: Azurite, https_container: ContainerClient, tmp_path: Path
) -> None:
    assert azurite_https.tls is not None
    loc = location(azurite_https, https_container.container_name)
    settings = Settings.from_env({"REQUESTS_CA_BUNDLE": str(azurite_https.tls.ca)})
    store = store_for(settings, loc, RetryPolicy(retries=0))
    try:
        assert store.read("ds/a.txt", 0, 100) == b"alpha\n"  # the raw path
        store.copy("ds/a.txt", "copied.txt")  # the SDK path
        assert store.read("copied.txt", 0, 100) == b"alpha\n"
        store.delete("copied.txt")
    finally:
        store.close()

    store = open_store(loc, retry=RetryPolicy(retries=0))  # the system store only
    try:
        for attempt in (
            lambda: store.read("ds/a.txt", 0, 100),
            lambda: store.copy("ds/a.txt", "copied.txt"),
        ):
            with pytest.raises(StorageError) as caught:
                attempt()
            message = str(caught.value)
            assert "TLS certificate verification failed for 127.0.0.1" in message
            assert "trusted: the system store" in message and "unexpected" not in message
            assert not caught.value.transient
    finally:
        store.close()


def test_an_https_source_trusts_the_bundle(azurite_https: Azurite, https_site: str) -> None:
    assert azurite_https.tls is not None
    store = HttpStore(https_site, retry=RetryPolicy(retries=0), ca_bundle=azurite_https.tls.ca)
    assert store.read("f.txt", 2, 3) == b"234"
    buffer = memoryview(bytearray(4))
    assert store.read_into("f.txt", 1, buffer) == 4 and bytes(buffer) == b"1234"
    store.close()
    store = HttpStore(https_site, retry=RetryPolicy(retries=0))
    with pytest.raises(StorageError, match="certificate verification failed for 127.0.0.1"):
        store.read("f.txt", 2, 3)
    store.close()


# -- the CLI ------------------------------------------------------------------


def test_download_over_https_with_the_ca_in_ssl_cert_file_or_requests_ca_bundle(
    azurite_https: Azurite, https_container: ContainerClient, tmp_path: Path
) -> None:
    assert azurite_https.tls is not None
    ca = str(azurite_https.tls.ca)
    name = https_container.container_name
    env = cli_env(azurite_https, tmp_path, name, SSL_CERT_FILE=ca)
    dest = tmp_path / "folder"
    out = datamount("download", "azureml://datastores/store/paths/ds/", str(dest), env=env)
    assert out.returncode == 0, out.stderr
    assert tree_of(dest) == {k[3:]: v for k, v in TREE.items()}

    env = cli_env(azurite_https, tmp_path, name, REQUESTS_CA_BUNDLE=ca)
    dest = tmp_path / "file"
    out = datamount("download", "azureml://datastores/store/paths/ds/sub/b.bin", str(dest), env=env)
    assert out.returncode == 0, out.stderr
    assert tree_of(dest) == {"b.bin": TREE["ds/sub/b.bin"]}


def test_download_without_trust_of_the_ca_is_one_line_exit_3_nothing_written(
    azurite_https: Azurite, https_container: ContainerClient, tmp_path: Path
) -> None:
    env = cli_env(azurite_https, tmp_path, https_container.container_name)
    dest = tmp_path / "dest"
    out = datamount("download", "azureml://datastores/store/paths/ds/", str(dest), env=env)
    assert out.returncode == 3, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("datamount: error:")]
    assert len(errors) == 1, out.stderr
    assert "127.0.0.1" in errors[0] and "certificate" in errors[0], errors[0]
    assert "unexpected" not in out.stderr and "Traceback" not in out.stderr
    assert not dest.exists() or not any(dest.rglob("*"))


@pytest.mark.fuse
def test_ro_mount_over_https_reads_the_bytes(
    azurite_https: Azurite, https_container: ContainerClient, tmp_path: Path, mounts: Mounts
) -> None:
    assert azurite_https.tls is not None
    env = cli_env(
        azurite_https,
        tmp_path,
        https_container.container_name,
        SSL_CERT_FILE=str(azurite_https.tls.ca),
    )
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/ds/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert mounted(mp)
    assert tree_of(mp) == {k[3:]: v for k, v in TREE.items()}
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert not mounted(mp)


def blobs_of(container: ContainerClient, prefix: str) -> dict[str, bytes]:
    return {
        b.name[len(prefix) :]: container.download_blob(b.name).readall()
        for b in container.list_blobs(name_starts_with=prefix)
    }


def test_upload_over_https_writes_every_byte(
    azurite_https: Azurite, https_container: ContainerClient, tmp_path: Path
) -> None:
    assert azurite_https.tls is not None
    src = tmp_path / "src"
    files = {"a.txt": b"uploaded\n", "sub/big.bin": os.urandom(5 * 1024 * 1024 + 17)}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    name = https_container.container_name
    env = cli_env(azurite_https, tmp_path, name, SSL_CERT_FILE=str(azurite_https.tls.ca))
    out = datamount("upload", str(src), "azureml://datastores/store/paths/up/", env=env)
    assert out.returncode == 0, out.stderr
    assert blobs_of(https_container, "up/") == files


@pytest.mark.fuse
def test_rw_mount_over_https_uploads_what_was_written(
    azurite_https: Azurite, https_container: ContainerClient, tmp_path: Path, mounts: Mounts
) -> None:
    assert azurite_https.tls is not None
    name = https_container.container_name
    env = cli_env(azurite_https, tmp_path, name, REQUESTS_CA_BUNDLE=str(azurite_https.tls.ca))
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "outputs:\n"
        "  model: {type: uri_folder, path: 'azureml://datastores/store/paths/rw/', "
        "mode: rw_mount}\n"
    )
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    data = os.urandom(3 * 1024 * 1024 + 5)
    (mp / "ckpt").mkdir()
    (mp / "ckpt" / "model.bin").write_bytes(data)
    (mp / "note.txt").write_text("done\n")
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert not mounted(mp)
    want = {"ckpt/": b"", "ckpt/model.bin": data, "note.txt": b"done\n"}  # mkdir: a marker
    assert blobs_of(https_container, "rw/") == want
