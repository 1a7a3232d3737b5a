"""Authorization of raw Blob REST requests (azure_raw), the SDK's way.

Shared Key: the 'SharedKey account:signature' header, HMAC-SHA256 over the
same canonical string as azure-storage-blob's SharedKeyCredentialPolicy
(_shared/authentication.py): verb, eleven standard headers (Content-Length
empty when 0; Range empty, the range travels in x-ms-range), the x-ms-*
headers in the service's collation order, '/account' + URL path, and the
query parameters sorted, one 'name:value' line each. SAS: the token is
appended to the query, nothing is signed. Bearer: a token from an
azure-identity credential (scope https://storage.azure.com/.default),
cached until 5 minutes before it expires, sent over https only. Anonymous:
nothing.

Each auth object sees the request's path (already percent-encoded, as sent),
its query parameters (unencoded) and its headers, and may add headers.

Threads: shared by every request thread. SharedKeyAuth and SasAuth hold
immutable state; BearerAuth replaces its (token, expiry) tuple under a lock.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import functools
import hmac
import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol

from datamount.errors import AccessDenied

TOKEN_SCOPE = "https://storage.azure.com/.default"
TOKEN_REFRESH = 300.0  # renew 5 minutes before expiry, as azure-core's policy does

_SIGNED = (
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "date",
    "if-modified-since",
    "if-match",
    "if-none-match",
    "if-unmodified-since",
    "range",
)
# The service sorts x-ms-* names by a collation table (the SDK's
# authentication.table_lv0): case-insensitive, '-' and most punctuation
# ignored, the rest in this order. (Its second level only separates names
# that differ in '-' alone, which request headers never do.)
_COLLATION = {c: i for i, c in enumerate("!#$%&*.^_`|~+0123456789abcdefghijklmnopqrstuvwxyz")}


@functools.lru_cache(maxsize=256)
def header_order(name: str) -> tuple[int, ...]:
    """The sort key of an x-ms-* header name in the string to sign."""
    return tuple(_COLLATION[c] for c in name.lower() if c in _COLLATION)


_date_cache: tuple[int, str] = (0, "")


def http_date() -> str:
    """Now, as an RFC 1123 date (the x-ms-date header); formatted once a second."""
    global _date_cache
    now = int(time.time())
    second, text = _date_cache
    if second != now:
        text = email.utils.formatdate(now, usegmt=True)
        _date_cache = (now, text)  # one tuple store: readers see a consistent pair
    return text


class Auth(Protocol):
    """Authorizes one request: adds headers, or gives a query suffix."""

    query: str  # appended to every URL: '' or a SAS token

    def sign(
        self, method: str, path: str, params: Iterable[tuple[str, str]], headers: dict[str, str]
    ) -> None: ...


class Anonymous:
    query = ""

    def sign(
        self, method: str, path: str, params: Iterable[tuple[str, str]], headers: dict[str, str]
    ) -> None:
        pass


class SasAuth:
    def __init__(self, token: str) -> None:
        self.query = token.lstrip("?")

    def __repr__(self) -> str:
        return "SasAuth(***)"

    def sign(
        self, method: str, path: str, params: Iterable[tuple[str, str]], headers: dict[str, str]
    ) -> None:
        pass


class SharedKeyAuth:
    query = ""

    def __init__(self, account: str, key: str) -> None:
        self.account = account
        try:
            self._key: bytes | None = base64.b64decode(key, validate=True)
        except (binascii.Error, ValueError):
            self._key = None  # refused per request, as the SDK's AzureSigningError is

    def __repr__(self) -> str:
        return f"SharedKeyAuth({self.account!r}, ***)"

    def string_to_sign(
        self, method: str, path: str, params: Iterable[tuple[str, str]], headers: dict[str, str]
    ) -> str:
        lower = {k.lower(): v for k, v in headers.items() if v}
        if lower.get("content-length") == "0":
            del lower["content-length"]
        standard = "\n".join(lower.get(h, "") for h in _SIGNED)
        ms = sorted((k for k in lower if k.startswith("x-ms-")), key=header_order)
        canonical_headers = "".join(f"{k}:{lower[k]}\n" for k in ms)
        query = "".join(f"\n{k.lower()}:{v}" for k, v in sorted(params))
        return f"{method}\n{standard}\n{canonical_headers}/{self.account}{path}{query}"

    def sign(
        self, method: str, path: str, params: Iterable[tuple[str, str]], headers: dict[str, str]
    ) -> None:
        if self._key is None:
            raise AccessDenied("the account key is not valid base64")
        text = self.string_to_sign(method, path, params, headers)
        digest = hmac.digest(self._key, text.encode(), "sha256")
        headers["Authorization"] = f"SharedKey {self.account}:{base64.b64encode(digest).decode()}"


class BearerAuth:
    query = ""

    def __init__(self, credential: Any, *, https: bool) -> None:
        self._credential = credential
        self._https = https
        self._lock = threading.Lock()
        self._cached: tuple[str, float] = ("", 0.0)  # (token, expires_on), replaced whole

    def __repr__(self) -> str:
        return f"BearerAuth({type(self._credential).__name__})"

    def sign(
        self, method: str, path: str, params: Iterable[tuple[str, str]], headers: dict[str, str]
    ) -> None:
        if not self._https:  # the SDK refuses this too: a token never travels in clear
            raise AccessDenied("a token credential needs an https endpoint")
        token, expires = self._cached
        if time.time() > expires - TOKEN_REFRESH:
            with self._lock:  # one refresh at a time; the others reuse its result
                token, expires = self._cached
                if time.time() > expires - TOKEN_REFRESH:
                    got = self._credential.get_token(TOKEN_SCOPE)
                    token, expires = got.token, float(got.expires_on)
                    self._cached = (token, expires)
        headers["Authorization"] = f"Bearer {token}"
