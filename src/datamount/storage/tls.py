"""The one TLS client context of the process: whom datamount trusts.

Trust like the platform: `ssl.create_default_context()` (the system store;
OpenSSL itself honours SSL_CERT_FILE / SSL_CERT_DIR), plus the CA bundle
named by REQUESTS_CA_BUNDLE (what Azure SDK users set; it reaches here as
`Settings.ca_bundle`, this module never reads the environment), plus
certifi's bundle only when the system store holds no CA at all (a slim
container image). Every raw-path ConnectionPool and every requests session
(storage.sessions: the SDK's and HttpStore's) uses the same context, so a
CA that one path trusts the other trusts too; so does TLS inside a proxy's
CONNECT tunnel.

The context is built once per process per bundle and shared: building one
per connection (what requests does when `verify=` names a file) costs far
more than the handshake (docs/design/storage.md, "TLS"). truststore
(PyPI) was not adopted: on Linux it reads the same OpenSSL store, and it
would add a dependency for no change in what is trusted.

Threads: `context()` is safe to call from any thread (a lock guards the
cache); an SSLContext is safe to share between threads.
"""

from __future__ import annotations

import os
import ssl
import threading
from pathlib import Path

import certifi

_LOCK = threading.Lock()
_CONTEXTS: dict[Path | None, tuple[ssl.SSLContext, str]] = {}
_LAST_SOURCES = ""


def _build(ca_bundle: Path | None) -> tuple[ssl.SSLContext, str]:
    ctx = ssl.create_default_context()
    paths = ssl.get_default_verify_paths()
    system = [p for p in (paths.cafile, paths.capath) if p and os.path.exists(p)]
    sources = [f"the system store ({', '.join(system)})" if system else "the system store"]
    if ctx.cert_store_stats()["x509_ca"] == 0:
        ctx.load_verify_locations(cafile=certifi.where())
        sources = [f"certifi ({certifi.where()}; the system store holds no CA)"]
    if ca_bundle is not None:
        if ca_bundle.is_dir():
            ctx.load_verify_locations(capath=str(ca_bundle))
        else:
            ctx.load_verify_locations(cafile=str(ca_bundle))
        sources.append(f"REQUESTS_CA_BUNDLE ({ca_bundle})")
    return ctx, " and ".join(sources)


def context(ca_bundle: Path | None = None) -> ssl.SSLContext:
    """The shared client context trusting the system store (+ `ca_bundle`)."""
    global _LAST_SOURCES
    with _LOCK:
        entry = _CONTEXTS.get(ca_bundle)
        if entry is None:
            entry = _CONTEXTS[ca_bundle] = _build(ca_bundle)
        _LAST_SOURCES = entry[1]
        return entry[0]


def sources() -> str:
    """The trust sources of the context built last, for error messages
    ('the system store (/etc/ssl/certs) and REQUESTS_CA_BUNDLE (/x.pem)')."""
    if not _LAST_SOURCES:
        context()
    return _LAST_SOURCES
