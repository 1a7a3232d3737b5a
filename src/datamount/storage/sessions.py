"""The adapter of every requests session (the Azure SDK's, HttpStore's): its
https connections, and TLS inside a proxy's CONNECT tunnel, use the one TLS
context of storage.tls, and a proxy that is unreachable or refuses is the raw
path's error (storage.proxy), naming the proxy's host:port only.

Threads: `adapter()` may be called from any thread; the adapter class is
made once.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from datamount.storage import proxy as proxies
from datamount.storage import tls


def adapter(ca_bundle: Path | None = None, **kwargs: Any) -> Any:
    """A requests HTTPAdapter (`kwargs` as HTTPAdapter's) whose https
    connections use `context(ca_bundle)`. requests is imported here, not at
    module level: the raw path never needs it. The credentials of the
    environment's proxies are registered with the log's masking now."""
    proxies.mask_environment()
    return _adapter_class()(tls.context(ca_bundle), **kwargs)


_ADAPTER: Any = None


def _adapter_class() -> Any:
    global _ADAPTER
    if _ADAPTER is not None:
        return _ADAPTER

    from requests.adapters import HTTPAdapter
    from requests.exceptions import ProxyError
    from requests.utils import select_proxy

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
