"""The one table from service and transport errors to `datamount.errors`.

Every store wraps each request in `translate(op, key)`; nothing else in the
project sees an SDK or `requests` exception. Messages are built from the
operation, the object name, the HTTP status and the service error code, never
from the SDK's own text (which can hold a URL with a SAS token or a header).

The exception classes of azure-core, requests and urllib3 are looked up in
`sys.modules`, not imported: an exception of a library that was never
imported cannot be raised, and importing them here would cost a process
that only uses the raw request path (docs/design/storage.md).

Threads: pure functions, safe anywhere.
"""

from __future__ import annotations

import email.utils
import errno
import http.client
import ssl
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from datamount.errors import (
    AccessDenied,
    BadRequest,
    Conflict,
    ObjectNotFound,
    StorageError,
    VersionChanged,
)

# status → (class, transient). 408/429/5xx may succeed when repeated; the rest
# is an answer about the request itself and repeating it changes nothing.
_TABLE: dict[int, tuple[type[StorageError], bool]] = {
    400: (BadRequest, False),
    401: (AccessDenied, False),
    403: (AccessDenied, False),
    404: (ObjectNotFound, False),
    409: (Conflict, False),
    412: (VersionChanged, False),
    416: (BadRequest, False),
    408: (StorageError, True),
    429: (StorageError, True),
    500: (StorageError, True),
    502: (StorageError, True),
    503: (StorageError, True),
    504: (StorageError, True),
}


def _target(key: str, store: str) -> str:
    return f"{store.rstrip('/')}/{key}" if store else key


def error_for_status(
    status: int,
    *,
    op: str,
    key: str,
    store: str = "",
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> StorageError:
    """The StorageError for an HTTP answer `status` (with service error `code`)."""
    cls, transient = _TABLE.get(status, (StorageError, False))
    detail = f"HTTP {status}" + (f" {code}" if code else "")
    retry_after = parse_retry_after(headers) if headers is not None and transient else None
    return cls(
        f"{op} {_target(key, store)!r} failed: {detail}",
        transient=transient,
        retry_after=retry_after,
        status=status,
    )


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait from Retry-After (delta-seconds or HTTP-date) or *-ms headers."""
    for name in ("x-ms-retry-after-ms", "retry-after-ms"):
        value = headers.get(name)
        if value:
            try:
                return max(0.0, float(value) / 1000.0)
            except ValueError:
                pass
    value = headers.get("Retry-After") or headers.get("retry-after")
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


AZURE = "azure.core.exceptions"


def _types(module: str, *names: str) -> tuple[type[BaseException], ...]:
    """The exception classes `names` of `module` if something imported it
    already, else (). (getattr: a module another thread is importing may
    not define them all yet; no instance of a missing class exists.)"""
    loaded = sys.modules.get(module)
    if loaded is None:
        return ()
    return tuple(c for c in (getattr(loaded, n, None) for n in names) if c is not None)


def _azure_code(exc: Any) -> str | None:
    # azure-storage sets `error_code` (a StorageErrorCode) on the errors it raises.
    code = getattr(exc, "error_code", None)
    if code is None:
        code = (_headers(exc) or {}).get("x-ms-error-code")
    if code is None:
        return None
    return str(getattr(code, "value", code))


def _headers(exc: Any) -> Mapping[str, str] | None:
    headers = getattr(exc.response, "headers", None)
    return headers if isinstance(headers, Mapping) else None


def _cert_failure(exc: BaseException, depth: int = 0) -> ssl.SSLCertVerificationError | None:
    """The certificate verification error behind `exc`, if that is what it is:
    searched through __cause__/__context__, args and urllib3's `reason`
    (MaxRetryError(reason=SSLError(SSLCertVerificationError)))."""
    if depth > 6:
        return None
    if isinstance(exc, ssl.SSLCertVerificationError):
        return exc
    linked = [*getattr(exc, "args", ()), getattr(exc, "reason", None)]
    linked.append(getattr(exc, "inner_exception", None))  # azure-core's wrapped error
    linked += [exc.__cause__, exc.__context__]
    for inner in linked:
        if isinstance(inner, BaseException) and inner is not exc:
            found = _cert_failure(inner, depth + 1)
            if found is not None:
                return found
    return None


def _cert_error(exc: BaseException, op: str, target: str) -> StorageError:
    """'… failed: TLS certificate verification failed for HOST (why; trusted: …)'.
    Not transient: repeating the handshake meets the same certificate."""
    from datamount.storage import tls

    cert = _cert_failure(exc)
    why = (getattr(cert, "verify_message", "") or "") if cert is not None else ""
    host = urlsplit(target).hostname if "://" in target else None
    where = f" for {host}" if host else ""
    detail = f"{why}; " if why else ""
    return StorageError(
        f"{op} {target!r} failed: TLS certificate verification failed{where} "
        f"({detail}trusted: {tls.sources()})"
    )


def map_error(
    exc: BaseException, *, op: str = "request", key: str = "", store: str = ""
) -> StorageError:
    """The StorageError for `exc` (a service, transport or local error)."""
    if isinstance(exc, StorageError):
        return exc
    target = _target(key, store)
    if isinstance(exc, _types(AZURE, "AzureError")):
        return _from_azure(exc, op=op, key=key, store=store)
    if isinstance(exc, _types("requests", "RequestException")):
        return _from_requests(exc, op=op, key=key, store=store)
    if _cert_failure(exc):
        return _cert_error(exc, op, target)
    if isinstance(
        exc,
        (
            http.client.HTTPException,  # the raw path: a body cut short, a bad status line
            ssl.SSLError,  # a TLS record cut short (certificate failures are handled above)
            ConnectionError,
            TimeoutError,
            *_types("urllib3.exceptions", "HTTPError"),
        ),
    ):
        return _transient(exc, target, op)
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return ObjectNotFound(f"{op} {target!r} failed: no such file")
    if isinstance(exc, PermissionError):
        return AccessDenied(f"{op} {target!r} failed: permission denied")
    if isinstance(exc, OSError):
        return StorageError(
            f"{op} {target!r} failed: {exc.strerror or type(exc).__name__}",
            err=exc.errno if exc.errno is not None else errno.EIO,
        )
    return StorageError(f"{op} {target!r} failed: {type(exc).__name__}")


def _from_azure(exc: Any, *, op: str, key: str, store: str) -> StorageError:
    target = _target(key, store)
    status = getattr(exc, "status_code", None)  # HttpResponseError and its subclasses
    if isinstance(exc, _types(AZURE, "ClientAuthenticationError")) and status in (None, 401, 403):
        detail = f"HTTP {status} {_azure_code(exc) or ''}".strip() if status else "no token"
        return AccessDenied(
            f"{op} {target!r} failed: authentication failed ({detail})", status=status
        )
    if status is not None and status >= 300:
        return error_for_status(
            status, op=op, key=key, store=store, code=_azure_code(exc), headers=_headers(exc)
        )
    if _cert_failure(exc):
        return _cert_error(exc, op, target)
    # HttpResponseError below 300: a body cut short (IncompleteReadError, DecodeError).
    if isinstance(
        exc, _types(AZURE, "ServiceRequestError", "ServiceResponseError", "HttpResponseError")
    ):
        return _transient(exc, target, op)
    return StorageError(f"{op} {target!r} failed: {type(exc).__name__}")


def _from_requests(exc: Any, *, op: str, key: str, store: str) -> StorageError:
    target = _target(key, store)
    r = getattr(exc, "response", None)
    if isinstance(exc, _types("requests", "HTTPError")) and r is not None:
        return error_for_status(r.status_code, op=op, key=key, store=store, headers=r.headers)
    if _cert_failure(exc):
        return _cert_error(exc, op, target)
    if isinstance(
        exc,
        _types(
            "requests.exceptions",
            "ConnectionError",
            "Timeout",
            "ChunkedEncodingError",
            "ContentDecodingError",
        ),
    ):
        return _transient(exc, target, op)
    # Bad URL, too many redirects, unsupported schema: not worth repeating.
    return StorageError(f"{op} {target!r} failed: {type(exc).__name__}")


def _transient(exc: BaseException, target: str, op: str) -> StorageError:
    return StorageError(
        f"{op} {target!r} failed: {_connection_detail(_root_cause(exc))}",
        transient=True,
        err=errno.EIO,
    )


def _root_cause(exc: BaseException) -> BaseException:
    seen = exc
    for _ in range(10):
        nxt = seen.__cause__ or seen.__context__
        if nxt is None:
            break
        seen = nxt
    return seen


def _connection_detail(cause: BaseException) -> str:
    if isinstance(cause, ConnectionResetError):
        return "connection reset"
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused"
    if isinstance(cause, http.client.IncompleteRead):
        return "body cut short"
    if isinstance(
        cause,
        (
            TimeoutError,
            *_types("requests.exceptions", "Timeout"),
            *_types("urllib3.exceptions", "TimeoutError"),
            *_types(AZURE, "ServiceRequestTimeoutError", "ServiceResponseTimeoutError"),
        ),
    ):
        return "timed out"
    return f"connection failed ({type(cause).__name__})"


def _library_errors() -> tuple[type[BaseException], ...]:
    """The root exception classes that `translate` maps, of the libraries
    loaded so far (requests' are OSErrors already)."""
    return (
        http.client.HTTPException,
        OSError,
        *_types(AZURE, "AzureError"),
        *_types("urllib3.exceptions", "HTTPError"),
    )


@contextmanager
def translate(op: str, key: str, *, store: str = "") -> Iterator[None]:
    """Run a request body; raise any failure as a StorageError from the table.

    Local OSErrors that are not about the object (ENOSPC, EMFILE…) keep their
    errno but become StorageErrors; programming errors (TypeError…) pass
    through untouched so bugs stay loud.
    """
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        if not isinstance(exc, _library_errors()):
            raise
        raise map_error(exc, op=op, key=key, store=store) from None
