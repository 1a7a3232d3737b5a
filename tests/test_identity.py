"""Identities end to end: bearer tokens from azure-identity against an
Azurite that checks them (`azurite_oauth`: HTTPS + `--oauth basic`).

- managed_identity: ManagedIdentityCredential finds IDENTITY_ENDPOINT and
  IDENTITY_HEADER (azure-identity 1.17: App Service when there is no
  IDENTITY_SERVER_THUMBPRINT) and asks `TokenEndpoint`, an http.server on
  loopback speaking the App Service protocol (GET ?api-version=2019-08-01
  &resource=https://storage.azure.com, header X-IDENTITY-HEADER; JSON
  access_token / expires_on / resource / token_type). Never the IMDS address.
- user_identity: AzureCliCredential (first in datamount's chain) runs
  `az account get-access-token --output json --resource ...` through
  /bin/sh; a stand-in `az` first on PATH prints what the CLI prints
  (azure-identity 1.17 reads accessToken and expires_on, else expiresOn).
- A service principal: the workspace has no such credential (datastore
  credentials are account_key / sas_token; identities come from the spec),
  so there is none to test.

The workspace's datastore has no credentials at all: without a token a
request is anonymous, and this Azurite refuses it, as it refuses an
expired token (asserted once, so the tests prove tokens are checked).
Every minted token is recorded and looked for in logs, output and the
daemon's command line.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from azure.core.credentials import AccessToken
from azure.storage.blob import ContainerClient

from azurite import TOKEN_SKEW, Azurite, bearer_token, free_port
from datamount.errors import AccessDenied
from datamount.storage.azure_auth import TOKEN_REFRESH, BearerAuth, refresh_at
from fuse_helpers import Mounts, daemons_of, datamount, mounted

TESTS = Path(__file__).resolve().parent
TREE = {
    "ds/a.txt": b"alpha\n",
    "ds/sub/b.bin": os.urandom(300_000),
    "ds/sub/deeper/c.txt": b"c" * 1000,
}
LONG = 3600  # seconds: a token that outlives the test
SHORT = 4  # seconds: a token that expires several times during one mount


# -- the identity providers ------------------------------------------------------


class TokenEndpoint:
    """The App Service managed-identity token endpoint on loopback: mints a
    JWT living `lifetime` seconds per request, or answers `fail_with`."""

    def __init__(self, lifetime: int = LONG) -> None:
        self.lifetime = lifetime
        self.secret = uuid.uuid4().hex  # IDENTITY_HEADER
        self.fail_with: int | None = None
        self.tokens: list[str] = []
        self.refused: list[str] = []  # why a request was not served
        self._lock = threading.Lock()
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                endpoint._serve(self)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/msi/token"

    @property
    def requests(self) -> int:
        return len(self.tokens)

    def env(self) -> dict[str, str]:
        return {"IDENTITY_ENDPOINT": self.url, "IDENTITY_HEADER": self.secret}

    def _serve(self, req: http.server.BaseHTTPRequestHandler) -> None:
        parts = urlsplit(req.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        problem = ""
        if parts.path != "/msi/token":
            problem = f"path {parts.path}"
        elif req.headers.get("X-IDENTITY-HEADER") != self.secret:
            problem = "no X-IDENTITY-HEADER"
        elif query.get("api-version") != "2019-08-01":
            problem = f"api-version {query.get('api-version')}"
        elif query.get("resource") != "https://storage.azure.com":
            problem = f"resource {query.get('resource')}"
        if problem or self.fail_with:
            with self._lock:
                self.refused.append(problem or f"HTTP {self.fail_with}")
            body = json.dumps({"error": "unavailable", "error_description": "test"}).encode()
            req.send_response(self.fail_with or 400)
        else:
            token, expires_on = bearer_token(self.lifetime)
            with self._lock:
                self.tokens.append(token)
            body = json.dumps(
                {
                    "access_token": token,
                    "expires_on": str(expires_on),
                    "resource": query["resource"],
                    "token_type": "Bearer",
                    "client_id": "00000000-0000-0000-0000-000000000001",
                }
            ).encode()
            req.send_response(200)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    def __enter__(self) -> TokenEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


AZ = """#!{python}
# A stand-in for the Azure CLI: `az account get-access-token` prints a token
# for the resource asked (a fresh JWT each call, as the CLI does near expiry).
import datetime, json, sys
sys.path.insert(0, {tests!r})
from azurite import TENANT, bearer_token

args = sys.argv[1:]
if args[:2] != ["account", "get-access-token"] or "--resource" not in args:
    sys.exit("az stand-in: unexpected arguments")
if {fail!r}:
    sys.exit("ERROR: Please run 'az login' to setup account.")
token, expires_on = bearer_token({lifetime})
with open({log!r}, "a") as log:
    log.write(args[args.index("--resource") + 1] + " " + token + "\\n")
local = datetime.datetime.fromtimestamp(expires_on)
print(json.dumps({{
    "accessToken": token,
    "expiresOn": local.strftime("%Y-%m-%d %H:%M:%S.%f"),
    "expires_on": expires_on,
    "subscription": "00000000-0000-0000-0000-0000000000aa",
    "tenant": TENANT,
    "tokenType": "Bearer",
}}, indent=2))
"""


class FakeAz:
    """A folder holding the stand-in `az`, to put first on PATH; the tokens it
    printed are in `log`, one line a call."""

    def __init__(self, folder: Path, lifetime: int = LONG, *, fail: bool = False) -> None:
        self.bin = folder / "bin"
        self.bin.mkdir(parents=True)
        self.log = folder / "az-calls.txt"
        script = self.bin / "az"
        script.write_text(
            AZ.format(
                python=sys.executable, tests=str(TESTS), lifetime=lifetime, log=str(self.log),
                fail=fail,
            )
        )  # fmt: skip
        script.chmod(0o755)

    @property
    def calls(self) -> list[tuple[str, str]]:
        if not self.log.exists():
            return []
        lines = self.log.read_text().splitlines()
        return [(line.partition(" ")[0], line.partition(" ")[2]) for line in lines]

    @property
    def tokens(self) -> list[str]:
        return [token for _, token in self.calls]

    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}"}


# -- the environment of a CLI run ------------------------------------------------


def cli_env(azurite: Azurite, tmp_path: Path, container: str, **extra: str) -> dict[str, str]:
    """A workspace whose datastore `store` has no credentials (the spec's
    identity is the only way in), the CA trusted through SSL_CERT_FILE, no
    ambient identity or knob."""
    assert azurite.tls is not None
    ws = tmp_path / "ws.yaml"
    ws.write_text(
        "datastores:\n"
        f"  store: {{account_name: {azurite.account}, container_name: {container}, "
        f"endpoint: '{azurite.endpoint}'}}\n"
    )
    ambient = ("DATASET_", "RSLEX_", "DATAMOUNT_", "IDENTITY_", "MSI_", "IMDS_", "AZURE_")
    keep = {k: v for k, v in os.environ.items() if not k.startswith(ambient)}
    keep.pop("REQUESTS_CA_BUNDLE", None)
    return {
        **keep,
        "SSL_CERT_FILE": str(azurite.tls.ca),
        "DATAMOUNT_WORKSPACE": str(ws),
        "DATAMOUNT_CACHE_DIR": str(tmp_path / "cache"),
        "AZURE_CONFIG_DIR": str(tmp_path / "azure-config"),  # never the user's real az login
        **extra,
    }


def spec(tmp_path: Path, name: str, type_: str, path: str, mode: str, identity: str) -> Path:
    file = tmp_path / f"{name}.yaml"
    if mode == "upload":
        file.write_text(
            f"outputs:\n  out:\n    type: {type_}\n    path: {path}\n    mode: upload\n"
            f"    identity: {identity}\n"
        )
    else:
        file.write_text(f"type: {type_}\npath: {path}\nmode: {mode}\nidentity: {identity}\n")
    return file


def tree_of(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def assert_no_token(tokens: list[str], *places: str | Path) -> None:
    """None of `tokens` (or other secrets) in any of `places` (texts, or files
    and folders read whole)."""
    assert tokens
    for place in places:
        if isinstance(place, Path):
            files = [place] if place.is_file() else [p for p in place.rglob("*") if p.is_file()]
            texts = [(str(f), f.read_bytes().decode(errors="replace")) for f in files]
        else:
            texts = [("text", place)]
        for where, text in texts:
            for token in tokens:
                assert token not in text, f"a secret in {where}"
                if token.count(".") == 2:  # a JWT: its claims alone are telling too
                    assert token.split(".")[1] not in text, f"a token's claims in {where}"


@pytest.fixture
def oauth_container(azurite_oauth: Azurite) -> Iterator[ContainerClient]:
    client = azurite_oauth.create_container(f"id{uuid.uuid4().hex[:20]}")
    azurite_oauth.seed(client, TREE)
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            client.delete_container()


@contextlib.contextmanager
def identity_provider(kind: str, tmp_path: Path, lifetime: int) -> Iterator[TokenEndpoint | FakeAz]:
    """The provider of `kind`'s tokens, serving for the block (its `env()`
    points azure-identity at it; its `tokens` are what it minted)."""
    if kind == "managed_identity":
        with TokenEndpoint(lifetime) as endpoint:
            yield endpoint
    else:
        yield FakeAz(tmp_path / "az", lifetime)


# -- the token's life (logic, no network) -----------------------------------------


class Counting:
    """A TokenCredential handing out tokens of `lifetime` seconds; with
    `cached`, the same token until it expires (as azure-identity's managed
    identity cache does within 30 s of its last request)."""

    def __init__(self, lifetime: int, *, cached: bool = False) -> None:
        self.lifetime, self.cached, self.calls = lifetime, cached, 0
        self.current = AccessToken("", 0)

    def get_token(self, *scopes: str, **kwargs: object) -> AccessToken:
        self.calls += 1
        if not self.cached or self.current.expires_on <= time.time():
            self.current = AccessToken(f"t{self.calls}", int(time.time()) + self.lifetime)
        return self.current


@pytest.mark.unit
def test_refresh_margin_is_five_minutes_or_half_of_a_short_token() -> None:
    assert refresh_at(10_000.0, 0.0) == 10_000.0 - TOKEN_REFRESH
    assert refresh_at(600.0, 0.0) == 300.0
    assert refresh_at(4.0, 0.0) == 2.0  # a 4 s token: asked again after 2 s
    assert refresh_at(5.0, 10.0) == 5.0  # already expired: ask at the next request


@pytest.mark.slow
def test_a_short_token_is_renewed_halfway_and_a_cached_one_is_not_asked_per_request() -> None:
    cred = Counting(2)  # lives 1-2 s: whole seconds
    auth = BearerAuth(cred, https=True, kind="user_identity")
    seen = set()
    deadline = time.time() + 3.0
    while time.time() < deadline:
        headers: dict[str, str] = {}
        auth.sign("GET", "/a", [], headers)
        seen.add(headers["Authorization"])
        time.sleep(0.01)
    assert 3 <= cred.calls <= 8 and len(seen) == cred.calls  # every 0.5-1 s, not per request

    cached = Counting(2, cached=True)
    auth = BearerAuth(cached, https=True, kind="managed_identity")
    requests = 0
    deadline = time.time() + 3.0
    while time.time() < deadline:
        auth.sign("GET", "/a", [], {})
        requests += 1
        time.sleep(0.005)
    assert cached.calls < 40 < requests  # halving what is left: a few calls per token


@pytest.mark.unit
def test_a_credential_failure_names_the_identity_kind() -> None:
    class Broken:
        def get_token(self, *scopes: str, **kwargs: object) -> AccessToken:
            raise RuntimeError("endpoint said no\nsecond line")

    with pytest.raises(AccessDenied) as caught:
        BearerAuth(Broken(), https=True, kind="managed_identity").sign("GET", "/a", [], {})
    assert str(caught.value) == (
        "managed_identity could not get a storage token: endpoint said no; second line"
    )


@pytest.mark.unit
def test_a_failed_renewal_keeps_the_valid_token_and_is_retried() -> None:
    class Flaky(Counting):
        fail = False

        def get_token(self, *scopes: str, **kwargs: object) -> AccessToken:
            if self.fail:
                self.calls += 1
                raise RuntimeError("token endpoint down")
            return super().get_token(*scopes, **kwargs)

    cred = Flaky(60)
    auth = BearerAuth(cred, https=True, kind="managed_identity")
    auth.sign("GET", "/a", [], {})
    token, _, expires = auth._cached
    auth._cached = (token, 0.0, expires)  # renewal due now
    cred.fail = True
    headers: dict[str, str] = {}
    auth.sign("GET", "/a", [], headers)  # served by the current token
    assert headers["Authorization"] == "Bearer t1" and cred.calls == 2
    auth.sign("GET", "/a", [], headers)  # not asked again at once
    assert cred.calls == 2
    auth._cached = (token, 0.0, time.time() - 1)  # and once it has expired: the error
    with pytest.raises(AccessDenied, match="managed_identity could not get a storage token"):
        auth.sign("GET", "/a", [], {})


# -- Azurite checks tokens ----------------------------------------------------------


def test_this_azurite_refuses_no_token_and_an_expired_one(
    azurite_oauth: Azurite, oauth_container: ContainerClient
) -> None:
    assert azurite_oauth.tls is not None
    ctx = ssl.create_default_context(cafile=str(azurite_oauth.tls.ca))
    path = f"/{azurite_oauth.account}/{oauth_container.container_name}/ds/a.txt"

    def get(token: str | None) -> tuple[int, str]:
        conn = http.client.HTTPSConnection("127.0.0.1", azurite_oauth.port, context=ctx)
        headers = {"x-ms-version": "2025-11-05"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read().decode(errors="replace")
        finally:
            conn.close()

    assert get(bearer_token(60)[0]) == (200, "alpha\n")
    status, body = get(None)
    assert status == 403, body
    status, body = get(bearer_token(-TOKEN_SKEW - 5)[0])
    assert status == 403 and "AuthenticationFailed" in body, body


# -- download, upload and ro_mount with each identity -------------------------------


@pytest.mark.fuse
@pytest.mark.parametrize("kind", ["managed_identity", "user_identity"])
def test_download_upload_and_ro_mount_with_an_identity(
    kind: str,
    azurite_oauth: Azurite,
    oauth_container: ContainerClient,
    tmp_path: Path,
    mounts: Mounts,
) -> None:
    name = oauth_container.container_name
    ds = "azureml://datastores/store/paths/ds/"
    base = cli_env(azurite_oauth, tmp_path, name)
    outputs: list[str] = []

    # Without an identity the datastore is anonymous: refused.
    anonymous = tmp_path / "anonymous.yaml"
    anonymous.write_text(f"type: uri_folder\npath: {ds}\nmode: download\n")
    out = datamount("download", str(anonymous), str(tmp_path / "none"), env=base)
    assert out.returncode == 3, out.stderr

    with identity_provider(kind, tmp_path, LONG) as provider:
        env = {**base, **provider.env()}
        dest = tmp_path / "folder"
        out = datamount("download", str(spec(tmp_path, "f", "uri_folder", ds, "download", kind)),
                        str(dest), env=env)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert tree_of(dest) == {k[3:]: v for k, v in TREE.items()}
        outputs += [out.stdout, out.stderr]

        dest = tmp_path / "file"
        one = spec(tmp_path, "one", "uri_file", ds + "sub/b.bin", "download", kind)
        out = datamount("download", str(one), str(dest), env=env)
        assert out.returncode == 0, out.stderr
        assert tree_of(dest) == {"b.bin": TREE["ds/sub/b.bin"]}
        outputs += [out.stdout, out.stderr]

        src = tmp_path / "src"
        (src / "deep").mkdir(parents=True)
        uploaded = {"x.bin": os.urandom(1 << 20), "deep/y.txt": b"why\n"}
        for rel, data in uploaded.items():
            (src / rel).write_bytes(data)
        up = spec(tmp_path, "up", "uri_folder", "azureml://datastores/store/paths/up/", "upload",
                  kind)  # fmt: skip
        out = datamount("upload", str(src), str(up), env=env)
        assert out.returncode == 0, out.stderr
        outputs += [out.stdout, out.stderr]
        for rel, data in uploaded.items():
            assert oauth_container.download_blob(f"up/{rel}").readall() == data

        mp = mounts.point(tmp_path / "mnt")
        ro = spec(tmp_path, "ro", "uri_folder", ds, "ro_mount", kind)
        out = datamount("mount", str(ro), str(mp), env=env)
        assert out.returncode == 0, out.stderr
        outputs += [out.stdout, out.stderr]
        assert mounted(mp)
        asked = len(provider.tokens)
        assert tree_of(mp) == {k[3:]: v for k, v in TREE.items()}
        # The daemon got its own token: the identity, not a token, is in its plan.
        assert len(provider.tokens) > asked
        daemon = [
            Path(f"/proc/{pid}/{what}").read_bytes().decode(errors="replace")
            for pid in daemons_of(mp)
            for what in ("cmdline", "environ")
        ]
        assert daemon
        out = datamount("unmount", str(mp), env=env)
        assert out.returncode == 0, out.stderr
        outputs += [out.stdout, out.stderr]

        tokens = list(provider.tokens)
        if isinstance(provider, TokenEndpoint):
            assert not provider.refused
            # IDENTITY_HEADER is a secret too (the daemon's environment has it, by design).
            assert_no_token([provider.secret], *outputs, daemon[0], tmp_path / "cache")
        else:
            assert {resource for resource, _ in provider.calls} == {"https://storage.azure.com"}
    # Each command (the daemon too) asked the provider at least once.
    assert len(tokens) >= 5
    assert_no_token(tokens, *outputs, *daemon, tmp_path / "cache")


# -- a long mount: tokens expire and are renewed --------------------------------------


@pytest.mark.slow
@pytest.mark.fuse
@pytest.mark.parametrize("kind", ["managed_identity", "user_identity"])
def test_a_long_mount_renews_short_lived_tokens(
    kind: str,
    azurite_oauth: Azurite,
    oauth_container: ContainerClient,
    tmp_path: Path,
    mounts: Mounts,
) -> None:
    files = {f"long/{i:02d}.bin": os.urandom(64 << 10) for i in range(8)}
    azurite_oauth.seed(oauth_container, files)
    env = cli_env(
        azurite_oauth,
        tmp_path,
        oauth_container.container_name,
        DATASET_MOUNT_ATTRIBUTE_CACHE_TTL="200",  # each stat below asks the service again
    )
    with identity_provider(kind, tmp_path, SHORT) as provider:
        mp = mounts.point(tmp_path / "mnt")
        ro = spec(tmp_path, "ro", "uri_folder", "azureml://datastores/store/paths/long/",
                  "ro_mount", kind)  # fmt: skip
        out = datamount("mount", str(ro), str(mp), env={**env, **provider.env()})
        assert out.returncode == 0, out.stderr
        started = len(provider.tokens)
        deadline = time.monotonic() + 3 * SHORT + 1  # across three expiries at least
        names = sorted(files)
        i = 0
        while time.monotonic() < deadline:
            rel = names[i % len(names)]
            assert (mp / rel[5:]).stat().st_size == len(files[rel])
            if i < len(names):  # each file read once, through a request with a token
                assert (mp / rel[5:]).read_bytes() == files[rel]
            i += 1
            time.sleep(0.5)
        assert (mp / "07.bin").read_bytes() == files["long/07.bin"]
        renewed = len(provider.tokens) - started
        assert renewed >= 3, renewed
        out = datamount("unmount", str(mp), env=env)
        assert out.returncode == 0, out.stderr
        assert_no_token(provider.tokens, out.stderr, tmp_path / "cache")


# -- a provider that fails ------------------------------------------------------------


def one_error_line(out: subprocess.CompletedProcess[str], kind: str) -> str:
    stderr = out.stderr
    assert out.returncode == 3, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("datamount: error:"), stderr
    assert f"{kind} could not get a storage token" in lines[0], lines[0]
    assert "unexpected" not in stderr
    return lines[0]


@pytest.mark.slow
@pytest.mark.fuse
def test_a_token_endpoint_that_fails_or_is_unreachable_is_one_line_exit_3(
    azurite_oauth: Azurite, oauth_container: ContainerClient, tmp_path: Path, mounts: Mounts
) -> None:
    env = cli_env(azurite_oauth, tmp_path, oauth_container.container_name)
    ds = "azureml://datastores/store/paths/ds/"
    folder = spec(tmp_path, "f", "uri_folder", ds, "download", "managed_identity")
    with TokenEndpoint() as endpoint:
        endpoint.fail_with = 500
        dest = tmp_path / "dest"
        out = datamount("download", str(folder), str(dest), env={**env, **endpoint.env()})
        assert "HTTP 500" in one_error_line(out, "managed_identity")
        assert endpoint.refused and not endpoint.tokens
        assert not dest.exists() or not any(dest.rglob("*"))

        mp = mounts.point(tmp_path / "mnt")
        ro = spec(tmp_path, "ro", "uri_folder", ds, "ro_mount", "managed_identity")
        out = datamount("mount", str(ro), str(mp), env={**env, **endpoint.env()})
        one_error_line(out, "managed_identity")
        assert not mounted(mp)

    unreachable = {"IDENTITY_ENDPOINT": f"http://127.0.0.1:{free_port()}/msi/token",
                   "IDENTITY_HEADER": "x"}  # fmt: skip
    out = datamount("download", str(folder), str(tmp_path / "dest2"), env={**env, **unreachable})
    assert "Connection refused" in one_error_line(out, "managed_identity")


@pytest.mark.slow
def test_an_az_that_is_not_logged_in_is_one_line_exit_3(
    azurite_oauth: Azurite, oauth_container: ContainerClient, tmp_path: Path
) -> None:
    az = FakeAz(tmp_path / "az", fail=True)
    # DefaultAzureCredential, second in the chain, tries managed identity
    # next: point it at a closed loopback port, never at IMDS.
    env = cli_env(
        azurite_oauth,
        tmp_path,
        oauth_container.container_name,
        IDENTITY_ENDPOINT=f"http://127.0.0.1:{free_port()}/msi/token",
        IDENTITY_HEADER="x",
        **az.env(),
    )
    ds = "azureml://datastores/store/paths/ds/"
    folder = spec(tmp_path, "f", "uri_folder", ds, "download", "user_identity")
    out = datamount("download", str(folder), str(tmp_path / "dest"), env=env)
    line = one_error_line(out, "user_identity")
    assert "AzureCliCredential" in line, line
