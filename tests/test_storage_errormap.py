"""The one error table: statuses, transport errors, Retry-After, no secrets."""

from __future__ import annotations

import email.utils
import errno
import http.client
import ssl
import subprocess
import sys
import textwrap

import pytest
import requests
import urllib3.exceptions
from azure.core.exceptions import (
    ClientAuthenticationError,
    IncompleteReadError,
    ServiceRequestError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)

from datamount.errors import (
    AccessDenied,
    BadRequest,
    Conflict,
    ObjectNotFound,
    StorageError,
    VersionChanged,
)
from datamount.storage.errormap import error_for_status, map_error, parse_retry_after, translate

pytestmark = pytest.mark.unit

SECRET_URL = "https://acct.blob.core.windows.net/c/b?sv=2021&sig=TOPSECRET%3D"


@pytest.mark.parametrize(
    ("status", "cls", "code", "transient"),
    [
        (400, BadRequest, errno.EINVAL, False),
        (401, AccessDenied, errno.EACCES, False),
        (403, AccessDenied, errno.EACCES, False),
        (404, ObjectNotFound, errno.ENOENT, False),
        (409, Conflict, errno.EEXIST, False),
        (412, VersionChanged, errno.ESTALE, False),
        (416, BadRequest, errno.EINVAL, False),
        (408, StorageError, errno.EIO, True),
        (429, StorageError, errno.EIO, True),
        (500, StorageError, errno.EIO, True),
        (502, StorageError, errno.EIO, True),
        (503, StorageError, errno.EIO, True),
        (504, StorageError, errno.EIO, True),
        (405, StorageError, errno.EIO, False),
        (501, StorageError, errno.EIO, False),
    ],
)
def test_status_table(status: int, cls: type[StorageError], code: int, transient: bool) -> None:
    err = error_for_status(status, op="read", key="a/b", store="https://x/c", code="Code")
    assert type(err) is cls
    assert (err.errno, err.transient, err.status) == (code, transient, status)
    assert str(err) == f"read 'https://x/c/a/b' failed: HTTP {status} Code"


def test_retry_after_seconds_date_and_ms() -> None:
    assert parse_retry_after({"Retry-After": "12"}) == 12.0
    assert parse_retry_after({"x-ms-retry-after-ms": "1500"}) == 1.5
    when = email.utils.formatdate(1_000_030, usegmt=True)
    assert parse_retry_after({"Retry-After": when}, now=1_000_000) == pytest.approx(30)
    assert parse_retry_after({"Retry-After": "soon"}) is None
    assert parse_retry_after({}) is None
    err = error_for_status(503, op="read", key="k", headers={"Retry-After": "4"})
    assert err.retry_after == 4.0


@pytest.mark.parametrize(
    "exc",
    [
        ServiceRequestError(f"Connection refused: {SECRET_URL}"),
        ServiceResponseError(f"Connection reset: {SECRET_URL}"),
        IncompleteReadError(f"body cut short: {SECRET_URL}"),
        requests.ConnectionError(f"Max retries exceeded with url: {SECRET_URL}"),
        requests.ReadTimeout(f"read timed out: {SECRET_URL}"),
        urllib3.exceptions.ProtocolError(f"Connection aborted: {SECRET_URL}"),
        ConnectionResetError(errno.ECONNRESET, SECRET_URL),
        TimeoutError(SECRET_URL),
        ServiceResponseTimeoutError(f"read timed out: {SECRET_URL}"),
        http.client.IncompleteRead(b"partial", 100),  # the raw path's body cut short
        http.client.RemoteDisconnected(SECRET_URL),
        ssl.SSLEOFError(8, SECRET_URL),
    ],
)
def test_transport_errors_are_transient_eio_without_secrets(exc: BaseException) -> None:
    err = map_error(exc, op="read", key="c/b")
    assert type(err) is StorageError
    assert err.transient and err.errno == errno.EIO
    assert "TOPSECRET" not in str(err) and "sig=" not in str(err)
    assert "'c/b'" in str(err)


def test_timeouts_and_short_bodies_say_so() -> None:
    assert "timed out" in str(map_error(ServiceResponseTimeoutError("x"), op="stat", key="k"))
    assert "timed out" in str(map_error(TimeoutError(), op="read", key="k"))
    short = map_error(http.client.IncompleteRead(b"", 5), op="read", key="k")
    assert "body cut short" in str(short) and short.transient


def test_authentication_failure_is_access_denied() -> None:
    err = map_error(ClientAuthenticationError(f"token for {SECRET_URL}"), op="stat", key="k")
    assert isinstance(err, AccessDenied) and not err.transient
    assert "TOPSECRET" not in str(err)


def test_translate_raises_mapped_errors_and_lets_bugs_through() -> None:
    with pytest.raises(StorageError) as info, translate("read", "k"):
        raise requests.ConnectionError(SECRET_URL)
    assert info.value.transient
    assert info.value.__suppress_context__  # the SDK text (with its URL) is not chained
    with pytest.raises(ObjectNotFound), translate("stat", "k"):
        raise FileNotFoundError(errno.ENOENT, "gone")
    with pytest.raises(StorageError) as info, translate("put", "k"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert info.value.errno == errno.ENOSPC and not info.value.transient
    with pytest.raises(KeyError), translate("read", "k"):
        raise KeyError("a bug stays a bug")
    original = VersionChanged("kept as is")
    with pytest.raises(VersionChanged) as kept, translate("read", "k"):
        raise original
    assert kept.value is original


def test_the_table_needs_no_http_library_loaded() -> None:
    # The classes of azure-core, requests and urllib3 are looked up only if
    # something imported them: a raw-path process never does.
    code = textwrap.dedent(
        """
        import errno, http.client, sys
        from datamount.storage.errormap import map_error, translate
        assert map_error(ConnectionRefusedError(), op="read", key="k").transient
        short = map_error(http.client.IncompleteRead(b"", 3), op="read", key="k")
        assert "body cut short" in str(short) and short.transient
        assert map_error(FileNotFoundError(), op="stat", key="k").errno == errno.ENOENT
        try:
            with translate("read", "k"):
                raise TimeoutError()
        except OSError as e:
            assert "timed out" in str(e) and e.transient, e
        try:
            with translate("read", "k"):
                raise KeyError("a bug")
        except KeyError:
            pass
        print(sorted(m for m in ("azure.core", "requests", "urllib3") if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
