"""Which proxy a request to a URL goes through, and a connection through it.

The choice is requests' own, reused rather than re-implemented:
`requests.utils.get_environ_proxies` (HTTPS_PROXY / HTTP_PROXY / ALL_PROXY
and their lower-case forms, lower-case first; NO_PROXY as requests and
urllib read it: a host, `.suffix` or plain suffix, `*`, host:port, a CIDR
for IP hosts) and `select_proxy`. The raw path decides once per RawClient
(one endpoint); the requests sessions (the SDK's, HttpStore's) decide per
request through trust_env, with the same functions, so every path agrees.

HTTPS goes through an HTTP CONNECT tunnel (http.client's `set_tunnel`) and
TLS to the storage host inside it (server_hostname = that host, the
context of storage.tls); HTTP goes as absolute-form requests to the proxy,
as requests does. Credentials in the proxy URL become a Basic
Proxy-Authorization header and are registered with the log's masking; no
message names more than the proxy's host:port.

Failures: a proxy that cannot be reached (or drops the connection) is
transient, like an unreachable host; a refused tunnel is the error table's
answer for its status, except 407, which is AccessDenied (permanent).

Threads: pure functions and immutable values, safe anywhere.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import http.client
import os
import re
import ssl
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from datamount.errors import AccessDenied, StorageError
from datamount.log import register_secret
from datamount.storage.errormap import error_for_status

PROXY_AUTH = "Proxy-Authorization"
_TUNNEL_REFUSED = re.compile(r"Tunnel connection failed: (\d{3})\s*(.*)")
# What a failure is called, first match in the exception's chain.
_KINDS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
    (ConnectionRefusedError, "connection refused"),
    (TimeoutError, "timed out"),
    ((ConnectionResetError, http.client.RemoteDisconnected), "the proxy closed the connection"),
    (OSError, "cannot reach it"),  # e.g. its name does not resolve
)


@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy: where it listens and the header that authenticates
    to it (a secret: kept out of repr)."""

    host: str
    port: int
    authorization: str | None = field(default=None, repr=False)
    scheme: str = "http"

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"

    def headers(self) -> dict[str, str]:
        return {PROXY_AUTH: self.authorization} if self.authorization else {}


def parse(url: str) -> Proxy:
    """A Proxy from a proxy URL ('host:port' gets http://, as requests does)."""
    if "://" not in url:
        url = f"http://{url}"
    parts = urlsplit(url)
    auth = None
    if parts.username is not None or parts.password is not None:
        user, password = unquote(parts.username or ""), unquote(parts.password or "")
        register_secret(password)
        pair = f"{user}:{password}"
        try:
            raw = pair.encode("latin1")  # what requests' _basic_auth_str sends
        except UnicodeEncodeError:
            raw = pair.encode()
        auth = "Basic " + base64.b64encode(raw).decode("ascii")
        register_secret(auth)
        register_secret(base64.b64encode(raw).decode("ascii"))
    try:
        port = parts.port
    except ValueError:
        port = None
        parts = parts._replace(netloc="")  # an unreadable port: refused below
    if not parts.hostname:
        raise StorageError("the proxy setting names no host (or a bad port)")
    return Proxy(parts.hostname, port or 80, auth, parts.scheme.lower())


def proxy_url_for(url: str) -> str | None:
    """The proxy URL requests would use for `url` from the environment, or None.
    Without any *_proxy variable (urllib's test) requests is not even imported:
    the raw path's start-up stays free of it."""
    if not any(k.lower().endswith("_proxy") and v for k, v in os.environ.items()):
        return None
    from requests.utils import get_environ_proxies, select_proxy

    return select_proxy(url, get_environ_proxies(url)) or None


def for_url(url: str) -> Proxy | None:
    """The proxy requests would use for `url` (environment read now), or None."""
    chosen = proxy_url_for(url)
    if not chosen:
        return None
    proxy = parse(chosen)
    if proxy.scheme != "http":  # TLS to the proxy itself would need TLS in TLS
        raise StorageError(
            f"the proxy {proxy.name} for {url}: only http:// proxies are supported "
            f"on this path, not {proxy.scheme}://"
        )
    return proxy


def refused(proxy: Proxy, target: str, status: int, reason: str) -> StorageError:
    """The error for a proxy answering `status` instead of letting a request through."""
    message = f"the proxy {proxy.name} refused the request to {target}: HTTP {status} {reason}"
    if status == 407:
        return AccessDenied(message.strip() + " (check the proxy's user and password)", status=407)
    like = error_for_status(status, op="connect", key=target)
    return type(like)(message.strip(), transient=like.transient, status=status)


def failed(proxy: Proxy, target: str, exc: BaseException) -> StorageError:
    """The error for a connection to `target` through `proxy` that failed;
    `exc` is what the connection raised (its text is never shown: only the
    tunnel status or the kind of failure)."""
    chain = _chain(exc)
    for cause in chain:
        m = _TUNNEL_REFUSED.search(str(cause))
        if m:
            return refused(proxy, target, int(m.group(1)), m.group(2))
    why = next(
        (name for kind, name in _KINDS if any(isinstance(c, kind) for c in chain)),
        f"connection failed ({type(chain[-1]).__name__})",
    )
    return StorageError(
        f"connect to {target} through the proxy {proxy.name} failed: {why}",
        transient=True,
        err=errno.EIO,
    )


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc`, then what it wraps (urllib3's `reason`, args, causes), in order."""
    out: list[BaseException] = []
    todo = [exc]
    while todo and len(out) < 12:
        e = todo.pop(0)
        if e in out:
            continue
        out.append(e)
        linked = [getattr(e, "reason", None), *getattr(e, "args", ()), e.__cause__, e.__context__]
        todo += [x for x in linked if isinstance(x, BaseException)]
    return out


def connect(
    proxy: Proxy,
    host: str,
    port: int,
    *,
    timeout: float,
    context: ssl.SSLContext | None,
) -> http.client.HTTPConnection:
    """An open connection to `host:port` through `proxy`: a CONNECT tunnel
    with TLS to `host` inside it when `context` is given, else a plain
    connection to the proxy (requests then go in absolute form)."""
    conn: http.client.HTTPConnection
    if context is not None:
        conn = http.client.HTTPSConnection(proxy.host, proxy.port, timeout=timeout, context=context)
        conn.set_tunnel(host, port, headers=proxy.headers())
    else:
        conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=timeout)
    try:
        conn.connect()
    except ssl.SSLError:
        conn.close()
        raise  # TLS with the storage host itself: the error table names the host
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise failed(proxy, f"{host}:{port}", exc) from None
    return conn


def mask_environment() -> None:
    """Register the credentials of every proxy the environment names with
    the log's masking (the requests paths choose per request)."""
    from urllib.request import getproxies

    for url in getproxies().values():
        if "@" in url:
            with contextlib.suppress(StorageError):  # no host: its credentials are masked
                parse(url)
