"""Test harness: run a real Azurite blob service on a free loopback port.

One `Azurite` per pytest session (see conftest.py). The process runs in its
own process group so `stop()` can kill node and anything it spawned; an atexit
hook stops it when pytest is interrupted, and the kernel sends it SIGTERM
if pytest is killed outright (PR_SET_PDEATHSIG). Imports the Azure SDK only to
create and seed containers for tests.

`Azurite(workdir, tls=make_certs(folder))` serves HTTPS (Azurite's --cert /
--key) with a leaf certificate for 127.0.0.1 and localhost signed by a
throwaway CA the harness makes with `cryptography`; nothing is installed on
the host: a client trusts it only through SSL_CERT_FILE / REQUESTS_CA_BUNDLE
naming `certs.ca`.

`Azurite(workdir, tls=certs, oauth=True)` adds `--oauth basic` (Azurite
allows it over HTTPS only): a request may then carry `Authorization: Bearer
<JWT>`, and Azurite checks the JWT's claims, not its signature
(BlobTokenAuthenticator.authenticateBasic in Azurite 3.35): iat, nbf and exp
present, nbf <= now <= exp, iss starting with https://sts.windows.net/ (or
another Entra authority), aud https://storage.azure.com (or the account's
blob host). A token failing any of them is answered 403 AuthenticationFailed.
`bearer_token(lifetime)` makes one that passes. Shared Key requests still
work, so seeding is unchanged.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import datetime
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when first used: a stand-in `az` imports bearer_token only
    from azure.storage.blob import BlobServiceClient, ContainerClient

REPO = Path(__file__).resolve().parent.parent
AZURITE_BIN = REPO / "node_modules" / ".bin" / "azurite-blob"
ACCOUNT = "devstoreaccount1"
# The well-known Azurite development key (public, documented by Microsoft).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
# A second account for tests spanning accounts (an Azurite started with
# AZURITE_ACCOUNTS serving both: the `two_accounts` fixture).
SECOND = "mlsecond"
SECOND_KEY = "c2Vjb25kLWFjY291bnQta2V5LWZvci1henVyaXRlLXRlc3RzLW9ubHktMDEyMzQ1Njc4OQ=="
PR_SET_PDEATHSIG = 1  # linux/prctl.h
START_TIMEOUT = 30.0  # node + Azurite start in ~1 s here; a loaded CI box is slower
TENANT = "72f988bf-0000-4000-8000-00000000d47a"  # any GUID: Azurite checks the issuer's prefix
# Azure Storage accepts a token a few minutes past its exp (clock skew);
# Azurite accepts none, so a token's JWT exp is this far past the expiry its
# issuer announces: a client that uses a token until the announced expiry
# (as azure-identity does) is never refused for a request in flight.
TOKEN_SKEW = 1


class AzuriteMissing(RuntimeError):
    pass


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when pytest dies, even by SIGKILL
    (where neither atexit nor fixture teardown runs)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Certs:
    ca: Path  # the throwaway CA certificate (PEM): what a client must trust
    cert: Path  # the leaf for 127.0.0.1 / localhost, signed by the CA
    key: Path  # the leaf's private key (unencrypted PEM)


def make_certs(folder: Path, *, name: str = "datamount test CA") -> Certs:
    """A throwaway CA and a leaf certificate for 127.0.0.1 and localhost (EC P-256:
    generated in milliseconds), written under `folder`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=30)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    certs = Certs(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    certs.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    certs.cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    certs.key.write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return certs


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def bearer_token(lifetime: float, *, now: float | None = None) -> tuple[str, int]:
    """A JWT Azurite's `--oauth basic` accepts for `lifetime` seconds (an
    unsigned RS256-shaped token: Azurite does not verify signatures), and the
    expiry to announce for it (epoch seconds, TOKEN_SKEW before the JWT's exp).
    Each token is unique (a random jti), so tests can look for it in logs.
    A negative lifetime makes a token that has already expired."""
    now = time.time() if now is None else now
    expires_on = int(now + lifetime)
    claims = {
        "aud": "https://storage.azure.com",
        "iss": f"https://sts.windows.net/{TENANT}/",
        "iat": int(now) - 1,
        "nbf": int(now) - 1,
        "exp": expires_on + TOKEN_SKEW,
        "tid": TENANT,
        "oid": str(uuid.uuid4()),
        "jti": uuid.uuid4().hex,
    }
    header = {"alg": "RS256", "typ": "JWT"}
    parts = [_b64url(json.dumps(part).encode()) for part in (header, claims)]
    token = ".".join([*parts, _b64url(os.urandom(64))])
    return token, expires_on


class Azurite:
    """A running Azurite blob service. Use `start()` / `stop()` or a `with` block.
    With `tls`, it serves HTTPS with that certificate; with `oauth` too, it
    accepts bearer tokens (`bearer_token`)."""

    def __init__(self, workdir: Path, *, tls: Certs | None = None, oauth: bool = False) -> None:
        if oauth and tls is None:
            raise ValueError("Azurite accepts --oauth only over HTTPS: pass tls too")
        self.workdir = workdir
        self.tls = tls
        self.oauth = oauth
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._service: BlobServiceClient | None = None

    @property
    def account(self) -> str:
        return ACCOUNT

    @property
    def key(self) -> str:
        return KEY

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        scheme = "https" if self.tls else "http"
        return (
            f"DefaultEndpointsProtocol={scheme};AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={self.endpoint};"
        )

    @property
    def service(self) -> BlobServiceClient:
        if self._service is None:
            from azure.storage.blob import BlobServiceClient

            extra = {"connection_verify": str(self.tls.ca)} if self.tls else {}
            self._service = BlobServiceClient.from_connection_string(
                self.connection_string, retry_total=2, **extra
            )
        return self._service

    def start(self, port: int | None = None) -> Azurite:
        """Start on `port` (the demo's fixed 10000) or on a free loopback port."""
        if not AZURITE_BIN.exists():
            raise AzuriteMissing(
                f"{AZURITE_BIN} is missing: run `make test` (it runs `npm install`), "
                "or `npm install` in the repository root"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        last_error = ""
        for _ in range(1 if port else 3):  # a port taken between free_port() and bind: retry
            self.port = port or free_port()
            log = open(self.workdir / f"azurite-{self.port}.log", "wb")  # noqa: SIM115
            tls = ["--cert", str(self.tls.cert), "--key", str(self.tls.key)] if self.tls else []
            if self.oauth:
                tls += ["--oauth", "basic"]
            self._proc = subprocess.Popen(
                [
                    str(AZURITE_BIN),
                    *tls,
                    "--blobHost",
                    "127.0.0.1",
                    "--blobPort",
                    str(self.port),
                    "--inMemoryPersistence",
                    "--skipApiVersionCheck",
                    "--loose",
                    "--silent",
                    "--disableTelemetry",
                ],
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stop() kills node's children too
                preexec_fn=_die_with_parent,
            )
            log.close()
            atexit.register(self.stop)
            if self._wait_ready():
                return self
            last_error = (self.workdir / f"azurite-{self.port}.log").read_text(errors="replace")
            self.stop()
        raise RuntimeError(f"Azurite did not start:\n{last_error[-2000:]}")

    def _wait_ready(self) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as raw:
                    s = raw
                    if self.tls:
                        ctx = ssl.create_default_context(cafile=str(self.tls.ca))
                        s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
                    # Any HTTP answer means the service is up (400 for this bare request).
                    s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                    if s.recv(16).startswith(b"HTTP/"):
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if self._service is not None:
            self._service.close()
            self._service = None
        if proc is None:
            return
        atexit.unregister(self.stop)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        # Children that outlived node (none expected) share the group: make sure.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def __enter__(self) -> Azurite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers for tests -------------------------------------------------

    def create_container(self, name: str | None = None) -> ContainerClient:
        name = name or f"c{uuid.uuid4().hex[:20]}"
        return self.service.create_container(name)

    def seed(
        self, container: ContainerClient | str, blobs: Mapping[str, bytes], *, threads: int = 16
    ) -> None:
        """Upload `blobs` (name → bytes) in parallel."""
        client = (
            self.service.get_container_client(container)
            if isinstance(container, str)
            else container
        )

        def put(item: tuple[str, bytes]) -> None:
            client.upload_blob(item[0], item[1], overwrite=True)

        with ThreadPoolExecutor(threads) as pool:
            for _ in pool.map(put, blobs.items()):
                pass
