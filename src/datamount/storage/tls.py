"""The one TLS client context of the process: whom datamount trusts.

Trust like the platform: `ssl.create_default_context()` (the system store;
OpenSSL itself honours SSL_CERT_FILE / SSL_CERT_DIR), plus the CA bundle
named by REQUESTS_CA_BUNDLE (what Azure SDK users set; it reaches here as
`Settings.ca_bundle`, this module never reads the environment), plus
certifi's bundle only when the system store holds no CA at all (a slim
container image). Every raw-path ConnectionPool and every requests session
(`adapter()`: the SDK's and HttpStore's) uses the same context, so a CA
that one path trusts the other trusts too; so does TLS inside a proxy's
CONNECT tunnel, and the adapter turns a failing proxy into storage.proxy's
errors, as the raw path does.

Cost (measured on this 2-core box; loop of 300 TLS 1.3 handshakes to a
loopback HTTPS server with an EC P-256 leaf, client and server CPU together):
building the context loads the system bundle once, 26 ms (certifi's bundle
alone, the old choice: 21 ms); a connection with the shared context costs
1.2 ms of handshake, the same as before, while building a context per
connection (what requests does when `verify=` names a file) costs 24.5 ms.
So the context is built once per process per bundle and shared. truststore
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
from typing import Any
from urllib.parse import urlsplit

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


def adapter(ca_bundle: Path | None = None, **kwargs: Any) -> Any:
    """A requests HTTPAdapter (`kwargs` as HTTPAdapter's) whose https
    connections use `context(ca_bundle)`. requests is imported here, not at
    module level: the raw path never needs it. The credentials of the
    environment's proxies are registered with the log's masking now."""
    from datamount.storage import proxy

    proxy.mask_environment()
    return _adapter_class()(context(ca_bundle), **kwargs)


_ADAPTER: Any = None


def _adapter_class() -> Any:
    global _ADAPTER
    if _ADAPTER is not None:
        return _ADAPTER

    from requests.adapters import HTTPAdapter
    from requests.exceptions import ProxyError
    from requests.utils import select_proxy

    from datamount.storage import proxy as proxies

    class TrustAdapter(HTTPAdapter):
        """requests on its own trusts certifi (or a `verify=` /
        REQUESTS_CA_BUNDLE path, loaded again for every new connection), never
        the system store. Here both the pool key and the connection get the
        shared context and no CA path; verify=False still turns checks off.
        A CONNECT tunnel's TLS (proxy_manager_for) gets the same context, and
        a proxy that is unreachable or refuses is the raw path's error
        (storage.proxy), naming the proxy's host:port only."""

        def __init__(self, ssl_context: ssl.SSLContext, **kwargs: Any) -> None:
            self.ssl_context = ssl_context
            super().__init__(**kwargs)

        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            kwargs["ssl_context"] = self.ssl_context
            super().init_poolmanager(*args, **kwargs)

        def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
            kwargs["ssl_context"] = self.ssl_context
            return super().proxy_manager_for(proxy, **kwargs)

        def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                response = super().send(request, *args, **kwargs)
            except ProxyError as exc:
                via = select_proxy(request.url, kwargs.get("proxies") or {})
                if not via:
                    raise
                raise proxies.failed(proxies.parse(via), _host_port(request.url), exc) from None
            if response.status_code == 407:  # only a proxy answers 407
                via = select_proxy(request.url, kwargs.get("proxies") or {})
                if via:
                    response.close()
                    target = _host_port(request.url)
                    raise proxies.refused(proxies.parse(via), target, 407, response.reason or "")
            return response

        def build_connection_pool_key_attributes(
            self, request: Any, verify: Any, cert: Any = None
        ) -> Any:
            host, pool = super().build_connection_pool_key_attributes(request, verify, cert)
            if verify is not False:
                pool.pop("ca_certs", None)
                pool.pop("ca_cert_dir", None)
                pool["ssl_context"] = self.ssl_context
            return host, pool

        def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
            super().cert_verify(conn, url, verify, cert)
            if verify is not False:
                conn.ca_certs = None
                conn.ca_cert_dir = None

    _ADAPTER = TrustAdapter
    return _ADAPTER


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
