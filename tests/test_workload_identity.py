"""Workload identity (AKS) end to end: `identity: managed_identity` with
AZURE_FEDERATED_TOKEN_FILE set, against an Azurite that checks bearer
tokens (`azurite_oauth`: HTTPS + `--oauth basic`).

`EntraEndpoint` is the Entra ID token endpoint on loopback, over HTTPS with
the test CA's leaf (the CA trusted through SSL_CERT_FILE, as Azurite's is):
POST {authority}/{tenant}/oauth2/v2.0/token, the client-assertion grant
(grant_type=client_credentials, client_assertion_type jwt-bearer,
client_assertion, client_id, scope https://storage.azure.com/.default). It
checks the assertion is the token file's content at the time of the request
(so a rotated file must be read again) and a JWT for the token exchange
audience that has not expired, then mints a token Azurite accepts
(azurite.bearer_token). AZURE_AUTHORITY_HOST points at it, never at
login.microsoftonline.com.

Every minted token and every federated token is looked for in the output,
the logs, the cache and the daemon's command line and environment.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
import yaml
from azure.storage.blob import ContainerClient

from azurite import TENANT, Azurite, _b64url, bearer_token, free_port
from datamount.errors import AccessDenied
from datamount.settings import Settings
from datamount.storage.azure_auth import (
    FederatedToken,
    WorkloadIdentity,
    authority_host,
    workload_identity,
)
from fuse_helpers import Mounts, daemons_of, datamount, mounted
from test_identity import TREE, assert_no_token, cli_env, one_error_line, spec, tree_of

CLIENT_ID = "00000000-0000-0000-0000-0000000000c1"
EXCHANGE_AUDIENCE = "api://AzureADTokenExchange"
JWT_BEARER = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
LONG = 3600
SHORT = 4
DS = "azureml://datastores/store/paths/ds/"


def federated_token(lifetime: int = LONG) -> str:
    """A Kubernetes service account token as the kubelet projects it (unsigned:
    the endpoint below checks claims, as Azurite does)."""
    now = int(time.time())
    claims = {
        "aud": [EXCHANGE_AUDIENCE],
        "iss": "https://oidc.example.test/cluster/",
        "sub": "system:serviceaccount:training:datamount",
        "iat": now,
        "nbf": now,
        "exp": now + lifetime,
        "jti": uuid.uuid4().hex,
    }
    parts = [_b64url(json.dumps(p).encode()) for p in ({"alg": "RS256", "typ": "JWT"}, claims)]
    return ".".join([*parts, _b64url(os.urandom(64))])


def claims_of(jwt: str) -> dict[str, object]:
    import base64

    body = jwt.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))))


class EntraEndpoint:
    """The Entra ID token endpoint for the client-assertion grant on loopback
    HTTPS. `token_file` is what the assertion must equal (read per request);
    `fail_with` makes it refuse every request with that status."""

    def __init__(self, azurite: Azurite, token_file: Path, lifetime: int = LONG) -> None:
        assert azurite.tls is not None
        self.token_file = token_file
        self.lifetime = lifetime
        self.fail_with: int | None = None
        self.tokens: list[str] = []  # minted access tokens
        self.assertions: list[str] = []  # accepted federated tokens, in order
        self.refused: list[str] = []
        self._lock = threading.Lock()
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                endpoint._serve(self)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(azurite.tls.cert, azurite.tls.key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def authority(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"{self.authority}/{TENANT}/oauth2/v2.0/token"

    def env(self) -> dict[str, str]:
        """What the AKS webhook injects into a pod that uses workload identity."""
        return {
            "AZURE_FEDERATED_TOKEN_FILE": str(self.token_file),
            "AZURE_CLIENT_ID": CLIENT_ID,
            "AZURE_TENANT_ID": TENANT,
            "AZURE_AUTHORITY_HOST": self.authority + "/",
        }

    def _problem(self, path: str, form: dict[str, str]) -> str:
        expected = {
            "grant_type": "client_credentials",
            "client_assertion_type": JWT_BEARER,
            "client_id": CLIENT_ID,
            "scope": "https://storage.azure.com/.default",
        }
        if path != f"/{TENANT}/oauth2/v2.0/token":
            return f"path {path}"
        for name, value in expected.items():
            if form.get(name) != value:
                return f"{name} {form.get(name)!r}"
        assertion = form.get("client_assertion", "")
        if assertion != self.token_file.read_text().strip():
            return "the assertion is not the token file's current content"
        claims = claims_of(assertion)
        if claims["aud"] != [EXCHANGE_AUDIENCE] or int(str(claims["exp"])) < time.time():
            return "the assertion's audience or expiry"
        return ""

    def _serve(self, req: http.server.BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        form = {k: v[0] for k, v in parse_qs(req.rfile.read(length).decode()).items()}
        problem = self._problem(req.path, form)
        if problem or self.fail_with:
            with self._lock:
                self.refused.append(problem or f"HTTP {self.fail_with}")
            status = self.fail_with or 401
            body = {
                "error": "invalid_client",
                "error_description": "AADSTS700213: No matching federated identity record found.",
            }
        else:
            token, _ = bearer_token(self.lifetime)
            with self._lock:
                self.tokens.append(token)
                self.assertions.append(form["client_assertion"])
            status = 200
            body = {"token_type": "Bearer", "expires_in": self.lifetime,
                    "ext_expires_in": self.lifetime, "access_token": token}  # fmt: skip
        data = json.dumps(body).encode()
        req.send_response(status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    def __enter__(self) -> EntraEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@pytest.fixture
def seeded(azurite_oauth: Azurite) -> Iterator[ContainerClient]:
    client = azurite_oauth.create_container(f"wi{uuid.uuid4().hex[:20]}")
    azurite_oauth.seed(client, TREE)
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            client.delete_container()


def token_file(tmp_path: Path, lifetime: int = LONG) -> Path:
    path = tmp_path / "sa-token" / "azure-identity-token"
    path.parent.mkdir(exist_ok=True)
    path.write_text(federated_token(lifetime))
    return path


def runtime_log(tmp_path: Path) -> str:
    logs = sorted((tmp_path / "cache" / "logs").glob("*runtime*.log"))
    assert logs, "no runtime log"
    return "".join(p.read_text() for p in logs)


# -- choosing the identity, reading the file (logic, no network) ------------------------


@pytest.mark.unit
def test_the_authority_host_is_normalized_like_azure_identity() -> None:
    assert authority_host(None) == "https://login.microsoftonline.com"
    assert authority_host("login.microsoftonline.us/") == "https://login.microsoftonline.us"
    assert authority_host("https://127.0.0.1:8443/") == "https://127.0.0.1:8443"


@pytest.mark.unit
def test_workload_identity_is_chosen_by_the_token_file_and_needs_tenant_and_client(
    tmp_path: Path,
) -> None:
    made: list[int] = []

    def transport() -> None:
        made.append(1)

    assert workload_identity({"AZURE_CLIENT_ID": CLIENT_ID}, None, transport) is None
    assert not made  # no transport is built for a plain managed identity
    env = {"AZURE_FEDERATED_TOKEN_FILE": str(tmp_path / "t"), "AZURE_TENANT_ID": TENANT}
    with pytest.raises(AccessDenied) as caught:
        workload_identity(env, None, transport)
    assert str(caught.value) == (
        "workload_identity: AZURE_FEDERATED_TOKEN_FILE is set but AZURE_CLIENT_ID is not"
    )
    with pytest.raises(AccessDenied) as caught:
        workload_identity({"AZURE_FEDERATED_TOKEN_FILE": "/t"}, None, transport)
    assert str(caught.value) == ("workload_identity: AZURE_FEDERATED_TOKEN_FILE is set but "
                                 "AZURE_TENANT_ID and AZURE_CLIENT_ID are not")  # fmt: skip
    with pytest.raises(AccessDenied, match="AZURE_AUTHORITY_HOST must be an https URL"):
        workload_identity({**env, "AZURE_AUTHORITY_HOST": "http://x"}, "c", transport)

    got = workload_identity(
        {**env, "AZURE_CLIENT_ID": "from-env", "AZURE_AUTHORITY_HOST": "login.example.test"},
        "from-spec",
        transport,
    )
    assert isinstance(got, WorkloadIdentity) and made == [1] * 2
    assert got.describe() == (
        f"workload_identity(client_id=from-spec, token file {tmp_path / 't'}, "
        f"token endpoint https://login.example.test/{TENANT}/oauth2/v2.0/token)"
    )


@pytest.mark.unit
def test_the_token_file_is_read_at_each_request_and_a_bad_one_is_named(tmp_path: Path) -> None:
    path = tmp_path / "token"
    assertion = FederatedToken(str(path))
    with pytest.raises(AccessDenied) as caught:
        assertion()
    assert str(caught.value) == (f"cannot read the federated token file {path} "
                                 "(AZURE_FEDERATED_TOKEN_FILE): No such file or directory")  # fmt: skip
    path.write_text("first.jwt.token\n")
    assert assertion() == "first.jwt.token"
    path.write_text("second.jwt.token")  # the kubelet rotated it
    assert assertion() == "second.jwt.token"
    assert "second" not in repr(assertion)
    path.write_text("  \n")
    with pytest.raises(AccessDenied, match=r"federated token file .* is empty"):
        assertion()
    path.unlink()
    path.mkdir()
    with pytest.raises(AccessDenied, match="Is a directory"):
        assertion()


# -- end to end ----------------------------------------------------------------------


@pytest.mark.fuse
def test_download_upload_and_ro_mount_with_workload_identity(
    azurite_oauth: Azurite, seeded: ContainerClient, tmp_path: Path, mounts: Mounts
) -> None:
    name = seeded.container_name
    base = cli_env(azurite_oauth, tmp_path, name)
    outputs: list[str] = []
    file = token_file(tmp_path)
    with EntraEndpoint(azurite_oauth, file) as entra:
        env = {**base, **entra.env()}
        dest = tmp_path / "folder"
        folder = spec(tmp_path, "f", "uri_folder", DS, "download", "managed_identity")
        out = datamount("download", str(folder), str(dest), env=env)
        assert out.returncode == 0, out.stderr
        assert tree_of(dest) == {k[3:]: v for k, v in TREE.items()}
        outputs += [out.stdout, out.stderr]

        src = tmp_path / "src"
        (src / "deep").mkdir(parents=True)
        uploaded = {"x.bin": os.urandom(1 << 20), "deep/y.txt": b"why\n"}
        for rel, data in uploaded.items():
            (src / rel).write_bytes(data)
        up = spec(tmp_path, "up", "uri_folder", "azureml://datastores/store/paths/up/", "upload",
                  "managed_identity")  # fmt: skip
        out = datamount("upload", str(src), str(up), env=env)
        assert out.returncode == 0, out.stderr
        outputs += [out.stdout, out.stderr]
        for rel, data in uploaded.items():
            assert seeded.download_blob(f"up/{rel}").readall() == data

        mp = mounts.point(tmp_path / "mnt")
        ro = spec(tmp_path, "ro", "uri_folder", DS, "ro_mount", "managed_identity")
        out = datamount("mount", str(ro), str(mp), env=env)
        assert out.returncode == 0, out.stderr
        outputs += [out.stdout, out.stderr]
        asked = len(entra.tokens)
        assert tree_of(mp) == {k[3:]: v for k, v in TREE.items()}
        assert len(entra.tokens) > asked  # the daemon asked for its own token
        daemon = [
            Path(f"/proc/{pid}/{what}").read_bytes().decode(errors="replace")
            for pid in daemons_of(mp)
            for what in ("cmdline", "environ")
        ]
        assert daemon
        out = datamount("unmount", str(mp), env=env)
        assert out.returncode == 0, out.stderr
        outputs += [out.stdout, out.stderr]

    assert not entra.refused
    assert len(entra.tokens) >= 3 and set(entra.assertions) == {file.read_text()}
    log = runtime_log(tmp_path)
    chosen = (f"{azurite_oauth.endpoint}/{name}: credential workload_identity(client_id="
              f"{CLIENT_ID}, token file {file}, token endpoint {entra.url})")  # fmt: skip
    assert log.count(chosen) >= 3, log[-3000:]  # download, upload, mount (and its daemon)
    assert_no_token([*entra.tokens, file.read_text()], *outputs, *daemon, tmp_path / "cache")


@pytest.mark.slow
@pytest.mark.fuse
def test_a_long_mount_reads_the_rotated_token_file_at_each_renewal(
    azurite_oauth: Azurite, seeded: ContainerClient, tmp_path: Path, mounts: Mounts
) -> None:
    files = {f"long/{i:02d}.bin": os.urandom(64 << 10) for i in range(8)}
    azurite_oauth.seed(seeded, files)
    env = cli_env(azurite_oauth, tmp_path, seeded.container_name,
                  DATASET_MOUNT_ATTRIBUTE_CACHE_TTL="200")  # fmt: skip
    file = token_file(tmp_path)
    with EntraEndpoint(azurite_oauth, file, lifetime=SHORT) as entra:
        mp = mounts.point(tmp_path / "mnt")
        ro = spec(tmp_path, "ro", "uri_folder", "azureml://datastores/store/paths/long/",
                  "ro_mount", "managed_identity")  # fmt: skip
        out = datamount("mount", str(ro), str(mp), env={**env, **entra.env()})
        assert out.returncode == 0, out.stderr
        rotated = [file.read_text()]
        names = sorted(files)
        deadline = time.monotonic() + 3 * SHORT + 1
        i = 0
        while time.monotonic() < deadline:
            if i % 4 == 3:  # the kubelet rotates the projected token
                file.write_text(federated_token())
                rotated.append(file.read_text())
            rel = names[i % len(names)]
            assert (mp / rel[5:]).stat().st_size == len(files[rel])
            if i < len(names):
                assert (mp / rel[5:]).read_bytes() == files[rel]
            i += 1
            time.sleep(0.5)
        assert (mp / "07.bin").read_bytes() == files["long/07.bin"]
        out = datamount("unmount", str(mp), env=env)
        assert out.returncode == 0, out.stderr
    assert not entra.refused, entra.refused
    # Renewed tokens were asked with the file's newer contents: it was read again.
    assert len(set(entra.assertions) & set(rotated[1:])) >= 2, len(entra.assertions)
    assert_no_token([*entra.tokens, *rotated], out.stderr, tmp_path / "cache")


@pytest.mark.slow
@pytest.mark.fuse
def test_an_unreadable_token_file_or_a_refusing_endpoint_is_one_line_exit_3(
    azurite_oauth: Azurite, seeded: ContainerClient, tmp_path: Path, mounts: Mounts
) -> None:
    env = cli_env(azurite_oauth, tmp_path, seeded.container_name)
    folder = spec(tmp_path, "f", "uri_folder", DS, "download", "managed_identity")
    file = token_file(tmp_path)
    with EntraEndpoint(azurite_oauth, file) as entra:
        missing = tmp_path / "no-such-token"
        wi = {**env, **entra.env(), "AZURE_FEDERATED_TOKEN_FILE": str(missing)}
        out = datamount("download", str(folder), str(tmp_path / "d1"), env=wi)
        line = one_error_line(out, "workload_identity")
        assert line.endswith(
            ": workload_identity could not get a storage token: cannot read the federated token "
            f"file {missing} (AZURE_FEDERATED_TOKEN_FILE): No such file or directory"
        ), line
        assert not entra.tokens and not entra.refused  # the endpoint was never asked

        entra.fail_with = 401
        wi = {**env, **entra.env()}
        out = datamount("download", str(folder), str(tmp_path / "d2"), env=wi)
        refused = one_error_line(out, "workload_identity")
        assert refused.endswith(f": the token endpoint {entra.url}: HTTP 401: Microsoft Entra ID "
                                "error '(invalid_client) AADSTS700213: No matching federated "
                                "identity record found.'"), refused  # fmt: skip
        mp = mounts.point(tmp_path / "mnt")
        ro = spec(tmp_path, "ro", "uri_folder", DS, "ro_mount", "managed_identity")
        out = datamount("mount", str(ro), str(mp), env=wi)
        mount_line = one_error_line(out, "workload_identity")
        assert not mounted(mp)
        assert entra.refused and not entra.tokens

    unreachable = {**env, **entra.env(), "AZURE_AUTHORITY_HOST": f"https://127.0.0.1:{free_port()}"}
    out = datamount("download", str(folder), str(tmp_path / "d3"), env=unreachable)
    line = one_error_line(out, "workload_identity")
    assert line.endswith(f"/{TENANT}/oauth2/v2.0/token: cannot connect: Connection refused"), line
    no_tenant = {k: v for k, v in {**env, **entra.env()}.items() if k != "AZURE_TENANT_ID"}
    out = datamount("download", str(folder), str(tmp_path / "d4"), env=no_tenant)
    assert out.returncode == 3, out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("datamount: error: "), out.stderr
    assert out.stderr.endswith(": workload_identity: AZURE_FEDERATED_TOKEN_FILE is set but "
                               "AZURE_TENANT_ID is not\n"), out.stderr  # fmt: skip
    assert_no_token([file.read_text()], refused, mount_line, out.stderr, tmp_path / "cache")


# -- the pod manifests ------------------------------------------------------------------

DOCKER = Path(__file__).resolve().parent.parent / "docker" / "k8s"


def manifest(name: str) -> dict[str, list[dict[str, Any]]]:
    """The documents of a manifest, by kind."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in yaml.safe_load_all((DOCKER / name).read_text()):
        if doc:
            by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


def sidecar_and_trainer(pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    (sidecar,) = [c for c in pod["spec"]["initContainers"] if c.get("restartPolicy") == "Always"]
    (trainer,) = pod["spec"]["containers"]
    return sidecar, trainer


@pytest.mark.unit
@pytest.mark.parametrize("name", ["pod.yaml", "pod-account-key.yaml"])
def test_a_manifest_gives_the_mount_to_the_trainer_and_names_files_it_mounts(name: str) -> None:
    (pod,) = manifest(name)["Pod"]
    sidecar, trainer = sidecar_and_trainer(pod)
    env = {e["name"]: e["value"] for e in sidecar["env"] if "value" in e}
    settings = Settings.from_env(env)  # every value is valid
    user = trainer["securityContext"]
    assert settings.mount_allow_other is True
    assert (settings.mount_uid, settings.mount_gid) == (user["runAsUser"], user["runAsGroup"])
    assert user["runAsUser"] != 0 and user["runAsNonRoot"] is True
    assert settings.mount_file_mode == 0o440 and settings.mount_dir_mode == 0o550  # no "other"
    mounted_at = [m["mountPath"] for m in sidecar["volumeMounts"]]
    spec_file, mount_point = sidecar["args"][-2:]
    for path in (spec_file, env["DATAMOUNT_WORKSPACE"], mount_point):
        assert any(path.startswith(at + "/") for at in mounted_at), path
    for probe in ("startupProbe", "readinessProbe"):
        assert sidecar[probe]["exec"]["command"][-1] == mount_point


@pytest.mark.unit
def test_the_default_manifest_uses_workload_identity_and_holds_no_secret() -> None:
    docs = manifest("pod.yaml")
    assert "Secret" not in docs and "secretKeyRef" not in (DOCKER / "pod.yaml").read_text()
    (pod,) = docs["Pod"]
    (account,) = docs["ServiceAccount"]
    assert pod["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert "azure.workload.identity/client-id" in account["metadata"]["annotations"]
    assert pod["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    sidecar, trainer = sidecar_and_trainer(pod)
    skipped = pod["metadata"]["annotations"]["azure.workload.identity/skip-containers"]
    assert skipped.split(";") == [trainer["name"]]  # the trainer gets no token
    maps = {m["metadata"]["name"]: m["data"] for m in docs["ConfigMap"]}
    input_spec = yaml.safe_load(maps["datamount-spec"]["input.yaml"])
    assert input_spec["identity"] == "managed_identity"
    stores = yaml.safe_load(maps["datamount-workspace"]["workspace.yaml"])["datastores"]
    assert all("credentials" not in store for store in stores.values())
    assert not any(e["name"].startswith("AZURE_") for e in sidecar["env"])  # the webhook's

    # The key variant is the same pod but for the identity.
    keyed = manifest("pod-account-key.yaml")
    (keyed_pod,) = keyed["Pod"]
    keyed_sidecar, keyed_trainer = sidecar_and_trainer(keyed_pod)
    assert keyed_trainer == trainer
    assert [e for e in keyed_sidecar["env"] if e["name"] != "AZURE_STORAGE_KEY"] == sidecar["env"]
    assert {**keyed_sidecar, "env": None} == {**sidecar, "env": None}
    assert "${AZURE_STORAGE_KEY}" in (DOCKER / "secret.example.yaml").read_text()
