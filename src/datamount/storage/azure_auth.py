"""Authorization of raw Blob REST requests (azure_raw), the SDK's way.

Shared Key: the 'SharedKey account:signature' header, HMAC-SHA256 over the
same canonical string as azure-storage-blob's SharedKeyCredentialPolicy
(_shared/authentication.py): verb, eleven standard headers (Content-Length
empty when 0; Range empty, the range travels in x-ms-range), the x-ms-*
headers in the service's collation order, '/account' + URL path, and the
query parameters sorted, one 'name:value' line each. SAS: the token is
appended to the query, nothing is signed. Bearer: a token from an
azure-identity credential (scope https://storage.azure.com/.default),
cached until 5 minutes before it expires (halfway through a token that
lives less than 10 minutes), sent over https only; a credential that cannot
give one is an AccessDenied naming the identity kind (a failed renewal
while the current token is still valid only logs a warning and is retried).
Anonymous: nothing.

Workload identity (AKS): `WorkloadIdentity`, azure-identity's
ClientAssertionCredential whose assertion is the federated token file
(AZURE_FEDERATED_TOKEN_FILE), read again at each token request (the kubelet
rotates it); its failures name the file or the token endpoint, never a token.

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
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from datamount.errors import AccessDenied
from datamount.log import register_secret

TOKEN_SCOPE = "https://storage.azure.com/.default"
TOKEN_REFRESH = 300.0  # renew 5 minutes before expiry, as azure-core's policy does
log = logging.getLogger(__name__)
REASON_MAX = 300  # characters of a credential's error kept in the one-line message
# azure-identity's variables for workload identity (what the AKS webhook injects)
FEDERATED_TOKEN_FILE = "AZURE_FEDERATED_TOKEN_FILE"
WORKLOAD_IDENTITY = "workload_identity"
PUBLIC_AUTHORITY = "https://login.microsoftonline.com"

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


# A request's header names, in order -> where each signed value is: per
# standard header its index in the request's values (-1: absent), the index of
# Content-Length (signed empty when "0"), and the x-ms-* names in signing order
# with their indexes. The raw client sends a few fixed name sets, so the
# lowering, the lookups and the sort run once per set, not once per request.
# Why: docs/design/storage.md ("Per-request Python costs").
_Layout = tuple[tuple[int, ...], int, tuple[tuple[str, int], ...]]
_CONTENT_LENGTH = 1 + _SIGNED.index("content-length")  # its line, after the verb's


@functools.lru_cache(maxsize=64)
def _layout(names: tuple[str, ...]) -> _Layout | None:
    lower = [name.lower() for name in names]
    if len(set(lower)) != len(lower):
        return None
    where = {name: i for i, name in enumerate(lower)}
    standard = tuple(where.get(h, -1) for h in _SIGNED)
    ms = sorted((name for name in lower if name.startswith("x-ms-")), key=header_order)
    return standard, where.get("content-length", -1), tuple((name, where[name]) for name in ms)


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
        layout = _layout(tuple(headers))
        if layout is None:  # two names differing in case only: the general way
            return self._string_to_sign(method, path, params, headers)
        standard, length, ms = layout
        values = tuple(headers.values())
        lines = [method, *[values[i] if i >= 0 else "" for i in standard]]
        if length >= 0 and values[length] == "0":
            lines[_CONTENT_LENGTH] = ""
        canonical_headers = "".join([f"{name}:{values[i]}\n" for name, i in ms if values[i]])
        query = "".join([f"\n{k.lower()}:{v}" for k, v in sorted(params)]) if params else ""
        standard_text = "\n".join(lines)
        return f"{standard_text}\n{canonical_headers}/{self.account}{path}{query}"

    def _string_to_sign(
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


def refresh_at(expires_on: float, now: float) -> float:
    """When to ask again for a token that expires at `expires_on`, got at
    `now`: TOKEN_REFRESH before it expires, or halfway through what is left
    of it when that is shorter (a token living less than twice the margin
    would otherwise be renewed on every request). A credential that hands
    back the same cached token is thus asked again after half, a quarter...
    of its remaining life: a few calls, not one per request."""
    return expires_on - max(0.0, min(TOKEN_REFRESH, (expires_on - now) / 2))


# Lines of azure-identity's messages that say nothing about this failure: a
# chain's header ('... failed to retrieve a token from the included
# credentials.', 'Attempted credentials:') and its troubleshooting links.
_NOISE = re.compile(
    r"failed to retrieve a token from the included credentials|^Attempted credentials:"
    r"|^To mitigate|^Visit https?://|troubleshoot"
)


def _reason(exc: BaseException) -> str:
    """A credential's error as one bounded line: for a chain, each credential
    and why it failed. (azure-identity masks tokens in its messages.)"""
    text = str(getattr(exc, "message", "") or exc).strip() or type(exc).__name__
    parts = [part.strip() for part in text.splitlines() if part.strip()]
    kept = [part for part in parts if not _NOISE.search(part)] or parts[:1]
    line = "; ".join(kept)
    status = getattr(exc, "status_code", None)  # a token endpoint's HTTP answer
    if status:
        line = f"HTTP {status}: {line}"
    return line if len(line) <= REASON_MAX else line[: REASON_MAX - 3] + "..."


class BearerAuth:
    query = ""

    def __init__(self, credential: Any, *, https: bool, kind: str = "token credential") -> None:
        self._credential = credential
        self._https = https
        self._kind = kind  # 'managed_identity', 'user_identity': named in errors
        self._lock = threading.Lock()
        # (token, refresh_at, expires_on), replaced whole
        self._cached: tuple[str, float, float] = ("", 0.0, 0.0)

    def __repr__(self) -> str:
        return f"BearerAuth({type(self._credential).__name__})"

    def sign(
        self, method: str, path: str, params: Iterable[tuple[str, str]], headers: dict[str, str]
    ) -> None:
        if not self._https:  # the SDK refuses this too: a token never travels in clear
            raise AccessDenied(f"{self._kind} needs an https endpoint")
        token, due, _ = self._cached
        if time.time() >= due:
            with self._lock:  # one refresh at a time; the others reuse its result
                token, due, _ = self._cached
                if time.time() >= due:
                    self._cached = self._fetch()
                    token = self._cached[0]
        headers["Authorization"] = f"Bearer {token}"

    def _fetch(self) -> tuple[str, float, float]:
        try:
            got = self._credential.get_token(TOKEN_SCOPE)
        except Exception as exc:  # azure-identity's errors, the transport's, a bad reply
            reason = _reason(exc)
            token, _, expires = self._cached
            now = time.time()
            if token and now < expires:  # a renewal failed: the current token still serves
                log.warning(
                    "%s: renewing the storage token failed (%s); the current one lasts %.0f s",
                    self._kind,
                    reason,
                    expires - now,
                )
                return token, refresh_at(expires, now), expires
            raise AccessDenied(f"{self._kind} could not get a storage token: {reason}") from None
        expires = float(got.expires_on)
        return got.token, refresh_at(expires, time.time()), expires


class FederatedToken:
    """The client assertion: the federated token file's content, read at each
    call (azure-identity's own WorkloadIdentityCredential keeps it 10 minutes).
    A file that cannot be read, or is empty, is an AccessDenied naming it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.last = ""  # the last assertion read: scrubbed from error messages

    def __repr__(self) -> str:
        return f"FederatedToken({self.path!r})"

    def __call__(self) -> str:
        try:
            text = Path(self.path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeError) as exc:
            why = getattr(exc, "strerror", None) or type(exc).__name__
            raise AccessDenied(
                f"cannot read the federated token file {self.path} ({FEDERATED_TOKEN_FILE}): {why}"
            ) from None
        if not text:
            raise AccessDenied(
                f"the federated token file {self.path} ({FEDERATED_TOKEN_FILE}) is empty"
            )
        if text != self.last:
            register_secret(text)  # masked in every log line from now on
            self.last = text
        return text


def authority_host(value: str | None) -> str:
    """AZURE_AUTHORITY_HOST as azure-identity reads it: https:// when no
    scheme is given, no trailing '/'; the public cloud's when unset."""
    host = (value or PUBLIC_AUTHORITY).strip().rstrip("/")
    return host if "://" in host else f"https://{host}"


class WorkloadIdentity:
    """A TokenCredential for AKS workload identity: the client-assertion grant
    (POST {authority}/{tenant}/oauth2/v2.0/token, grant_type
    client_credentials, the federated token as a jwt-bearer assertion) by
    azure-identity's ClientAssertionCredential over `transport` (the
    project's TLS). Failures are AccessDenied naming the file or the endpoint."""

    def __init__(
        self, token_file: str, tenant_id: str, client_id: str, authority: str, transport: Any
    ) -> None:
        from azure.identity import ClientAssertionCredential

        if not authority.startswith("https://"):
            raise AccessDenied(
                f"{WORKLOAD_IDENTITY}: AZURE_AUTHORITY_HOST must be an https URL, not {authority}"
            )
        self.kind = WORKLOAD_IDENTITY  # what errors name (BearerAuth)
        self.client_id = client_id
        self.endpoint = f"{authority}/{tenant_id}/oauth2/v2.0/token"
        self.assertion = FederatedToken(token_file)
        self._inner = ClientAssertionCredential(
            tenant_id, client_id, self.assertion, authority=authority, transport=transport
        )

    def __repr__(self) -> str:
        return f"WorkloadIdentity({self.describe()})"

    def describe(self) -> str:
        """The identity, its client id, the file and the endpoint: no secret."""
        return (
            f"{WORKLOAD_IDENTITY}(client_id={self.client_id}, token file "
            f"{self.assertion.path}, token endpoint {self.endpoint})"
        )

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        try:
            return self._inner.get_token(*scopes, **kwargs)
        except AccessDenied:  # the token file's: already one line naming it
            raise
        except Exception as exc:  # the endpoint refused, or could not be reached
            reason = _unreachable(exc) or _reason(exc)
            if self.assertion.last:
                reason = reason.replace(self.assertion.last, "***")
            raise AccessDenied(f"the token endpoint {self.endpoint}: {reason}") from None


def _unreachable(exc: BaseException) -> str:
    """Why a request never got an answer (the innermost OSError's reason:
    'Connection refused', a TLS verification failure), or '' for an answer."""
    if getattr(exc, "status_code", None):
        return ""
    seen: BaseException | None = exc
    for _ in range(12):  # azure-core -> requests -> urllib3 -> the socket's error
        if seen is None:
            break
        if isinstance(seen, OSError) and isinstance(seen.strerror, str) and seen.strerror:
            return f"cannot connect: {seen.strerror}"
        seen = getattr(seen, "inner_exception", None) or seen.__cause__ or seen.__context__
    return ""


def workload_identity(
    environ: Mapping[str, str], client_id: str | None, transport: Callable[[], Any]
) -> WorkloadIdentity | None:
    """The workload identity the environment configures (AZURE_FEDERATED_TOKEN_FILE
    set), or None; its requests go through `transport()`. `client_id` (the
    spec's) wins over AZURE_CLIENT_ID."""
    token_file = environ.get(FEDERATED_TOKEN_FILE)
    if not token_file:
        return None
    tenant = environ.get("AZURE_TENANT_ID", "")
    client = client_id or environ.get("AZURE_CLIENT_ID", "")
    missing = [name for name, value in (("AZURE_TENANT_ID", tenant), ("AZURE_CLIENT_ID", client))
               if not value]  # fmt: skip
    if missing:
        names = " and ".join(missing) + (" is" if len(missing) == 1 else " are")
        raise AccessDenied(f"{WORKLOAD_IDENTITY}: {FEDERATED_TOKEN_FILE} is set but {names} not")
    authority = authority_host(environ.get("AZURE_AUTHORITY_HOST"))
    return WorkloadIdentity(token_file, tenant, client, authority, transport())
