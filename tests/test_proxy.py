"""Proxies for real: a proxy.py (PyPI) subprocess on loopback in front of the
session's Azurites. The CLI (download, a FUSE ro_mount) and the stores run
with HTTPS_PROXY / HTTP_PROXY / NO_PROXY in their environment; the proxy's
access log (one line per request or CONNECT tunnel, written when the
connection closes) shows what crossed it. Credentials in the proxy URL work
and appear nowhere; a refusing or absent proxy is one line, exit 3, naming
the proxy's host:port. Unit tests pin the NO_PROXY decision (requests' own).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.storage.blob import ContainerClient

from azurite import Azurite
from datamount.errors import AccessDenied, StorageError
from datamount.log import clear_secrets, redact
from datamount.storage import ObjectStore, open_store
from datamount.storage import proxy as proxies
from datamount.storage.credentials import Credential
from datamount.storage.http import HttpStore
from datamount.storage.location import StorageKind, StorageLocation
from datamount.storage.retry import RetryPolicy
from fuse_helpers import Mounts, datamount, mount_env, mounted, spec_file

TREE = {"ds/a.txt": b"alpha\n", "ds/sub/b.bin": os.urandom(300_000)}
PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY")
TRUST_VARS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
PASSWORD = "pr0xy-s3cret-Pw"
FAST = {"AZUREML_DATASET_HTTP_RETRY_COUNT": "0", "DATAMOUNT_RETRY_MIN_SECONDS": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ProxyServer:
    """proxy.py on 127.0.0.1 (one worker), its log in `log`."""

    def __init__(self, folder: Path, basic_auth: str | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.log = folder / "proxy.log"
        port_file = folder / "port"
        argv = [sys.executable, "-m", "proxy", "--hostname", "127.0.0.1", "--port", "0"]
        argv += ["--port-file", str(port_file), "--num-workers", "1", "--num-acceptors", "1"]
        argv += ["--log-file", str(self.log)]
        if basic_auth:
            argv += ["--basic-auth", basic_auth]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=folder
        )
        deadline = time.monotonic() + 20
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("proxy.py did not start")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        self._wait_listening()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def url(self, userinfo: str = "") -> str:
        return f"http://{userinfo + '@' if userinfo else ''}127.0.0.1:{self.port}"

    def access(self) -> list[str]:
        """The access log lines so far, one per client connection, naming its
        first request ('CONNECT host:port', 'HEAD host:port/path')."""
        if not self.log.exists():
            return []
        text = self.log.read_text(errors="replace")
        return [m.group(1) for m in re.finditer(r"access_log:\d+ - [\d.:]+ - (\S+ \S+)", text)]

    def wait_for(self, prefix: str, timeout: float = 10.0) -> list[str]:
        """The access lines starting with `prefix`, waiting for at least one."""
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.access() if line.startswith(prefix)]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def http_proxy(tmp_path: Path) -> Iterator[ProxyServer]:
    server = ProxyServer(tmp_path / "proxy")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def auth_proxy(tmp_path: Path) -> Iterator[ProxyServer]:
    server = ProxyServer(tmp_path / "auth-proxy", basic_auth=f"user:{PASSWORD}")
    try:
        yield server
    finally:
        server.stop()


def seeded(azurite: Azurite) -> Iterator[ContainerClient]:
    client = azurite.create_container(f"px{uuid.uuid4().hex[:20]}")
    azurite.seed(client, TREE)
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            client.delete_container()


@pytest.fixture
def https_container(azurite_https: Azurite) -> Iterator[ContainerClient]:
    yield from seeded(azurite_https)


@pytest.fixture
def http_container(azurite: Azurite) -> Iterator[ContainerClient]:
    yield from seeded(azurite)


def cli_env(azurite: Azurite, tmp_path: Path, container: str, **extra: str) -> dict[str, str]:
    """The CLI's environment: no ambient proxy or trust variable, the test
    CA trusted for an HTTPS Azurite, then `extra`."""
    env = mount_env(azurite, tmp_path, container)
    for name in (*PROXY_VARS, *TRUST_VARS):
        env.pop(name, None)
        env.pop(name.lower(), None)
    if azurite.tls is not None:
        env["SSL_CERT_FILE"] = str(azurite.tls.ca)
    return {**env, **extra}


def tree_of(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def expected() -> dict[str, bytes]:
    return {k[3:]: v for k, v in TREE.items()}


def one_error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 3, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("datamount: error:")]
    assert len(errors) == 1, out.stderr
    assert "unexpected" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    return errors[0]


def written_text(root: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


# -- the CLI through the proxy ------------------------------------------------


def test_download_over_https_crosses_the_proxy_in_a_connect_tunnel(
    azurite_https: Azurite, https_container: ContainerClient, tmp_path: Path,
    http_proxy: ProxyServer,
) -> None:  # fmt: skip
    env = cli_env(
        azurite_https, tmp_path, https_container.container_name, HTTPS_PROXY=http_proxy.url()
    )
    dest = tmp_path / "dest"
    out = datamount("download", "azureml://datastores/store/paths/ds/", str(dest), env=env)
    assert out.returncode == 0, out.stderr
    assert tree_of(dest) == expected()
    assert http_proxy.wait_for(f"CONNECT 127.0.0.1:{azurite_https.port}")
    assert not [line for line in http_proxy.access() if not line.startswith("CONNECT")]


def test_download_over_http_goes_to_the_proxy_in_absolute_form(
    azurite: Azurite, http_container: ContainerClient, tmp_path: Path, http_proxy: ProxyServer
) -> None:
    env = cli_env(azurite, tmp_path, http_container.container_name, http_proxy=http_proxy.url())
    dest = tmp_path / "dest"
    out = datamount("download", "azureml://datastores/store/paths/ds/sub/b.bin", str(dest), env=env)
    assert out.returncode == 0, out.stderr
    assert tree_of(dest) == {"b.bin": TREE["ds/sub/b.bin"]}
    blob = (
        f"127.0.0.1:{azurite.port}/{azurite.account}/{http_container.container_name}/ds/sub/b.bin"
    )
    # proxy.py writes one line per client connection, naming its first request.
    assert any(line.endswith(blob) for line in http_proxy.wait_for("")), http_proxy.access()
    assert not http_proxy.wait_for("CONNECT", timeout=0)


@pytest.mark.parametrize(
    ("no_proxy", "host"),
    [("127.0.0.1", "127.0.0.1"), ("10.0.0.0/8,127.0.0.0/8", "127.0.0.1"),
     ("example.com, .localhost", "localhost")],
)  # fmt: skip
def test_no_proxy_bypasses_the_proxy(
    azurite: Azurite, http_container: ContainerClient, tmp_path: Path, http_proxy: ProxyServer,
    no_proxy: str, host: str,
) -> None:  # fmt: skip
    env = cli_env(
        azurite, tmp_path, http_container.container_name,
        HTTP_PROXY=http_proxy.url(), HTTPS_PROXY=http_proxy.url(), NO_PROXY=no_proxy,
    )  # fmt: skip
    ws = Path(env["DATAMOUNT_WORKSPACE"])
    ws.write_text(ws.read_text().replace("127.0.0.1", host))
    dest = tmp_path / "dest"
    out = datamount("download", "azureml://datastores/store/paths/ds/", str(dest), env=env)
    assert out.returncode == 0, out.stderr
    assert tree_of(dest) == expected()
    time.sleep(0.3)  # a line the proxy would write at close has had time
    assert http_proxy.access() == []


def test_proxy_credentials_work_and_appear_nowhere(
    azurite_https: Azurite, https_container: ContainerClient, tmp_path: Path,
    auth_proxy: ProxyServer,
) -> None:  # fmt: skip
    env = cli_env(
        azurite_https, tmp_path, https_container.container_name,
        HTTPS_PROXY=auth_proxy.url(f"user:{PASSWORD}"), DATAMOUNT_LOG_LEVEL="DEBUG",
    )  # fmt: skip
    dest = tmp_path / "dest"
    out = datamount("download", "azureml://datastores/store/paths/ds/", str(dest), env=env)
    assert out.returncode == 0, out.stderr
    assert tree_of(dest) == expected()
    assert auth_proxy.wait_for(f"CONNECT 127.0.0.1:{azurite_https.port}")
    logs = written_text(tmp_path / "cache")
    assert logs, "the runtime log is written"
    for text in (out.stderr, out.stdout, logs):
        assert PASSWORD not in text


def test_a_wrong_proxy_password_is_one_line_exit_3_without_the_password(
    azurite_https: Azurite, https_container: ContainerClient, tmp_path: Path,
    auth_proxy: ProxyServer,
) -> None:  # fmt: skip
    wrong = "not-the-Pa55word"
    env = cli_env(
        azurite_https, tmp_path, https_container.container_name,
        HTTPS_PROXY=auth_proxy.url(f"user:{wrong}"), **FAST,
    )  # fmt: skip
    dest = tmp_path / "dest"
    out = datamount("download", "azureml://datastores/store/paths/ds/", str(dest), env=env)
    line = one_error(out)
    assert f"127.0.0.1:{auth_proxy.port}" in line and "407" in line, line
    for text in (out.stderr, written_text(tmp_path / "cache")):
        assert wrong not in text and PASSWORD not in text
    assert not dest.exists() or not any(dest.rglob("*"))


def test_a_wrong_proxy_password_over_http_is_the_same_line(
    azurite: Azurite, http_container: ContainerClient, tmp_path: Path, auth_proxy: ProxyServer
) -> None:
    wrong = "not-the-Pa55word"
    env = cli_env(
        azurite, tmp_path, http_container.container_name,
        HTTP_PROXY=auth_proxy.url(f"user:{wrong}"), **FAST,
    )  # fmt: skip
    out = datamount(
        "download", "azureml://datastores/store/paths/ds/", str(tmp_path / "d"), env=env
    )
    line = one_error(out)
    assert f"the proxy 127.0.0.1:{auth_proxy.port} refused" in line and "407" in line, line
    assert wrong not in out.stderr


def test_a_proxy_that_is_not_listening_is_one_line_exit_3_quickly(
    azurite_https: Azurite, https_container: ContainerClient, tmp_path: Path
) -> None:
    port = free_port()
    env = cli_env(
        azurite_https, tmp_path, https_container.container_name,
        HTTPS_PROXY=f"http://user:{PASSWORD}@127.0.0.1:{port}", **FAST,
    )  # fmt: skip
    started = time.monotonic()
    out = datamount(
        "download", "azureml://datastores/store/paths/ds/", str(tmp_path / "d"), env=env
    )
    elapsed = time.monotonic() - started
    line = one_error(out)
    assert f"proxy 127.0.0.1:{port}" in line and "connection refused" in line, line
    assert PASSWORD not in out.stderr
    assert elapsed < 8, elapsed


@pytest.mark.fuse
def test_ro_mount_reads_cross_the_proxy(
    azurite_https: Azurite, https_container: ContainerClient, tmp_path: Path,
    mounts: Mounts, http_proxy: ProxyServer,
) -> None:  # fmt: skip
    env = cli_env(
        azurite_https, tmp_path, https_container.container_name, HTTPS_PROXY=http_proxy.url()
    )
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/ds/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert mounted(mp)
    before = len(http_proxy.access())
    assert tree_of(mp) == expected()
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert not mounted(mp)
    # The daemon's tunnels close when it exits: then the proxy logs them.
    deadline = time.monotonic() + 10
    while len(http_proxy.access()) <= before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert http_proxy.access(), "the daemon's requests crossed the proxy"
    assert all(line == f"CONNECT 127.0.0.1:{azurite_https.port}" for line in http_proxy.access())


# -- the requests path (https sources, the SDK) agrees --------------------------


@pytest.fixture
def no_ambient_proxy(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def test_an_https_source_crosses_the_proxy_and_fails_like_the_raw_path(
    azurite_https: Azurite, https_site: str, auth_proxy: ProxyServer,
    no_ambient_proxy: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    assert azurite_https.tls is not None
    site_port = https_site.rsplit(":", 1)[1]
    no_ambient_proxy.setenv("HTTPS_PROXY", auth_proxy.url(f"user:{PASSWORD}"))
    store = HttpStore(https_site, retry=RetryPolicy(retries=0), ca_bundle=azurite_https.tls.ca)
    try:
        assert store.read("f.txt", 2, 3) == b"234"
    finally:
        store.close()
    assert auth_proxy.wait_for(f"CONNECT 127.0.0.1:{site_port}")

    no_ambient_proxy.setenv("HTTPS_PROXY", auth_proxy.url("user:wrong-Passw0rd"))
    store = HttpStore(https_site, retry=RetryPolicy(retries=0), ca_bundle=azurite_https.tls.ca)
    try:
        with pytest.raises(AccessDenied) as caught:
            store.read("f.txt", 2, 3)
    finally:
        store.close()
    message = str(caught.value)
    assert f"proxy 127.0.0.1:{auth_proxy.port}" in message and "407" in message, message
    assert "wrong-Passw0rd" not in message and not caught.value.transient

    port = free_port()
    no_ambient_proxy.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    store = HttpStore(https_site, retry=RetryPolicy(retries=0), ca_bundle=azurite_https.tls.ca)
    try:
        with pytest.raises(StorageError) as failed:
            store.read("f.txt", 2, 3)
    finally:
        store.close()
    assert f"through the proxy 127.0.0.1:{port} failed: connection refused" in str(failed.value)


def test_the_raw_and_sdk_paths_cross_the_proxy_and_fail_alike(
    azurite_https: Azurite, https_container: ContainerClient, auth_proxy: ProxyServer,
    no_ambient_proxy: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    assert azurite_https.tls is not None
    loc = StorageLocation(
        StorageKind.BLOB, "", account=azurite_https.account,
        container=https_container.container_name, endpoint=azurite_https.endpoint,
        credential=Credential.account_key(azurite_https.key),
    )  # fmt: skip

    def store() -> ObjectStore:
        return open_store(loc, retry=RetryPolicy(retries=0), ca_bundle=azurite_https.tls.ca)

    no_ambient_proxy.setenv("HTTPS_PROXY", auth_proxy.url(f"user:{PASSWORD}"))
    s = store()
    try:
        assert s.read("ds/a.txt", 0, 100) == b"alpha\n"  # the raw path
        s.copy("ds/a.txt", "copied.txt")  # the SDK path
        s.delete("copied.txt")
    finally:
        s.close()  # the last user: both pools close, the proxy logs the tunnels
    deadline = time.monotonic() + 10
    while len(auth_proxy.access()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert auth_proxy.access().count(f"CONNECT 127.0.0.1:{azurite_https.port}") >= 2

    no_ambient_proxy.setenv("HTTPS_PROXY", auth_proxy.url("user:wrong-Passw0rd"))
    s = store()
    try:
        for attempt in (lambda: s.read("ds/a.txt", 0, 100), lambda: s.delete("ds/a.txt")):
            with pytest.raises(AccessDenied) as caught:
                attempt()
            message = str(caught.value)
            assert f"the proxy 127.0.0.1:{auth_proxy.port} refused" in message, message
            assert "407" in message and "wrong-Passw0rd" not in message
            assert not caught.value.transient
    finally:
        s.close()

    port = free_port()
    no_ambient_proxy.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    s = store()
    try:
        for attempt in (lambda: s.read("ds/a.txt", 0, 100), lambda: s.delete("ds/a.txt")):
            with pytest.raises(StorageError) as failed:
                attempt()
            message = str(failed.value)
            assert f"through the proxy 127.0.0.1:{port} failed: connection refused" in message
    finally:
        s.close()
    no_ambient_proxy.delenv("HTTPS_PROXY")  # the fixture's own client goes direct
    assert https_container.get_blob_client("ds/a.txt").exists()


# -- the decision (requests' rules) and the secret ------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("no_proxy", "url", "bypass"),
    [
        ("127.0.0.1", "https://127.0.0.1:10000/a", True),
        # host:port: for names only; requests compares an IP host with IPs and CIDRs
        ("127.0.0.1:10000", "https://127.0.0.1:10000/a", False),
        ("acct.blob.core.windows.net:443", "https://acct.blob.core.windows.net:443/c", True),
        ("acct.blob.core.windows.net:444", "https://acct.blob.core.windows.net:443/c", False),
        ("10.0.0.0/8", "https://10.1.2.3/a", True),
        ("10.0.0.0/8", "https://11.1.2.3/a", False),
        (".core.windows.net", "https://acct.blob.core.windows.net/c", True),
        ("core.windows.net", "https://acct.blob.core.windows.net/c", True),
        (".localhost", "http://localhost:10000/a", True),
        ("*", "https://acct.blob.core.windows.net/c", True),
        ("other.net, example.com", "https://acct.blob.core.windows.net/c", False),
        ("", "https://acct.blob.core.windows.net/c", False),
    ],
)
def test_no_proxy_decides_as_requests_does(
    no_ambient_proxy: pytest.MonkeyPatch, no_proxy: str, url: str, bypass: bool
) -> None:
    import requests.utils

    no_ambient_proxy.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    no_ambient_proxy.setenv("HTTP_PROXY", "http://proxy.example:3128")
    no_ambient_proxy.setenv("NO_PROXY", no_proxy)
    chosen = proxies.for_url(url)
    assert (chosen is None) is bypass
    assert requests.utils.should_bypass_proxies(url, None) is bypass
    if chosen is not None:
        assert (chosen.host, chosen.port) == ("proxy.example", 3128)


@pytest.mark.unit
def test_scheme_and_case_choose_the_proxy(no_ambient_proxy: pytest.MonkeyPatch) -> None:
    no_ambient_proxy.setenv("HTTPS_PROXY", "http://upper.example:1")
    no_ambient_proxy.setenv("https_proxy", "lower.example:2")  # no scheme: http://
    no_ambient_proxy.setenv("HTTP_PROXY", "http://plain.example:3")
    chosen = proxies.for_url("https://acct.blob.core.windows.net/c")
    assert chosen is not None and chosen.name == "lower.example:2"
    chosen = proxies.for_url("http://127.0.0.1:10000/devstoreaccount1")
    assert chosen is not None and chosen.name == "plain.example:3"
    no_ambient_proxy.setenv("https_proxy", "https://tls.example:4")
    with pytest.raises(StorageError, match="only http:// proxies"):
        proxies.for_url("https://acct.blob.core.windows.net/c")


@pytest.mark.unit
def test_proxy_credentials_become_a_masked_basic_header(
    no_ambient_proxy: pytest.MonkeyPatch,
) -> None:
    clear_secrets()
    try:
        no_ambient_proxy.setenv("HTTPS_PROXY", "http://us%40er:p%3Ass-w0rd@proxy.example:3128")
        chosen = proxies.for_url("https://acct.blob.core.windows.net/c")
        assert chosen is not None
        assert chosen.headers() == {"Proxy-Authorization": "Basic dXNAZXI6cDpzcy13MHJk"}
        assert "w0rd" not in repr(chosen) and chosen.name == "proxy.example:3128"
        assert redact("p:ss-w0rd and Basic dXNAZXI6cDpzcy13MHJk") == "*** and ***"
    finally:
        clear_secrets()
