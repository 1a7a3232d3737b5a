"""Authorization of the raw request path (azure_auth): the Shared Key
signature equals the SDK's byte for byte, bearer tokens are cached, and each
credential kind gets its auth. No network."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import pytest
from azure.core.pipeline import PipelineContext, PipelineRequest
from azure.core.pipeline.transport import HttpRequest
from azure.storage.blob._shared.authentication import (
    SharedKeyCredentialPolicy,
    _storage_header_sort,
)
from hypothesis import given
from hypothesis import strategies as st

from azurite import ACCOUNT, KEY
from datamount.errors import AccessDenied
from datamount.storage.azure_auth import (
    Anonymous,
    BearerAuth,
    SasAuth,
    SharedKeyAuth,
    header_order,
)
from datamount.storage.azure_clients import raw_auth
from datamount.storage.azure_list import list_params
from datamount.storage.azure_raw import RawClient
from datamount.storage.credentials import Credential, CredentialKind

pytestmark = pytest.mark.unit


def test_header_order_matches_the_sdk_collation() -> None:
    rng = random.Random(5)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789_"
    for _ in range(300):
        names = {
            "x-ms-" + "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
            for _ in range(rng.randint(2, 8))
        }
        names |= {"x-ms-date", "x-ms-version", "x-ms-range", "x-ms-blob-type", "x-ms-meta-a_b"}
        pairs = [(n, "v") for n in names]
        assert sorted(names, key=header_order) == [n for n, _ in _storage_header_sort(pairs)]


@pytest.mark.parametrize(
    ("method", "path", "params", "headers"),
    [
        (
            "GET",
            "/devstoreaccount1/c/dir%20x/na%C3%AFve~.bin",
            [],
            {"x-ms-range": "bytes=5-1000", "If-Match": '"0x8D"', "x-ms-version": "2026-10-06"},
        ),
        (
            "PUT",
            "/c/blob",
            [("comp", "block"), ("blockid", "MDAwMQ==")],
            {"Content-Length": "4", "x-ms-version": "2026-10-06"},
        ),
        (
            "PUT",
            "/c/empty",
            [],
            {
                "Content-Length": "0",
                "Content-Type": "application/octet-stream",
                "x-ms-blob-type": "BlockBlob",
                "x-ms-meta-zeta": "1",
                "x-ms-meta-alpha": "2",
                "x-ms-blob-content-md5": "AAAA",
            },
        ),
        (  # List Blobs: every query parameter is signed, decoded, names sorted
            "GET",
            "/devstoreaccount1/c",
            list_params("dir with space/naïve#50%off+=&;", "/", "2!88!MDAw/+=-"),
            {"x-ms-version": "2026-10-06"},
        ),
        (
            "GET",
            "/c",
            [("restype", "container"), ("comp", "list"), ("include", "metadata")],
            {"x-ms-version": "2026-10-06", "x-ms-client-request-id": "1"},
        ),
    ],
)
def test_shared_key_signature_equals_the_sdk_policy(
    method: str, path: str, params: list[tuple[str, str]], headers: dict[str, str]
) -> None:
    headers = {**headers, "x-ms-date": "Sun, 01 Mar 2026 10:00:00 GMT"}
    # The URL exactly as the raw path sends it: the SDK's policy parses and
    # decodes its query as the service does.
    raw = RawClient(
        "http://127.0.0.1:1/devstoreaccount1", "c", Anonymous(), api_version="", pool_size=1
    )
    request = HttpRequest(method, "http://127.0.0.1:1" + raw._url(path, params))
    request.headers.update(headers)
    SharedKeyCredentialPolicy(ACCOUNT, KEY).on_request(
        PipelineRequest(request, PipelineContext(None))
    )
    ours = dict(headers)
    SharedKeyAuth(ACCOUNT, KEY).sign(method, path, params, ours)
    assert ours["Authorization"] == request.headers["Authorization"]


_NAMES = st.sampled_from(
    ["x-ms-version", "X-MS-Date", "x-ms-range", "x-ms-meta-a_b", "x-ms-blob-type", "If-Match",
     "if-match", "Content-Length", "content-length", "Content-Type", "Range", "User-Agent", "Date"]
)  # fmt: skip


@given(
    st.lists(st.tuples(_NAMES, st.sampled_from(["", "0", "7", "v"])), max_size=8),
    st.lists(st.tuples(st.sampled_from(["comp", "Restype", "prefix"]), st.text(max_size=3))),
)
def test_the_cached_layout_signs_what_the_general_way_signs(
    pairs: list[tuple[str, str]], params: list[tuple[str, str]]
) -> None:
    # Any header set (names differing in case only, empty values, Content-Length
    # "0"), every time, also once its layout is cached.
    auth, headers = SharedKeyAuth(ACCOUNT, KEY), dict(pairs)
    expected = auth._string_to_sign("GET", "/c/b", params, headers)
    for _ in range(2):
        assert auth.string_to_sign("GET", "/c/b", params, headers) == expected


def test_an_invalid_key_is_access_denied_without_the_key() -> None:
    with pytest.raises(AccessDenied) as info:
        SharedKeyAuth(ACCOUNT, "not base64!").sign("GET", "/c/b", [], {})
    assert "not base64!" not in str(info.value)
    assert "***" in repr(SharedKeyAuth(ACCOUNT, KEY)) and KEY not in repr(
        SharedKeyAuth(ACCOUNT, KEY)
    )


@dataclass
class FakeToken:
    token: str
    expires_on: int


class FakeCredential:
    def __init__(self, lifetime: float) -> None:
        self.calls: list[str] = []
        self.lifetime = lifetime

    def get_token(self, *scopes: str, **kwargs: Any) -> FakeToken:
        self.calls.append(scopes[0])
        return FakeToken(f"t{len(self.calls)}", int(time.time() + self.lifetime))


def test_bearer_tokens_are_cached_until_near_expiry_and_need_https() -> None:
    cred = FakeCredential(lifetime=3600)
    auth = BearerAuth(cred, https=True)
    for _ in range(3):
        headers: dict[str, str] = {}
        auth.sign("GET", "/c/b", [], headers)
        assert headers["Authorization"] == "Bearer t1"
    assert cred.calls == ["https://storage.azure.com/.default"]
    # Shorter than twice the 5-minute margin: kept for half its life, not
    # asked again at every request (issue 17).
    short = FakeCredential(lifetime=60)
    auth = BearerAuth(short, https=True)
    auth.sign("GET", "/c/b", [], {})
    auth.sign("GET", "/c/b", [], {})
    assert len(short.calls) == 1
    expired = FakeCredential(lifetime=-1)  # already expired: asked again each time
    auth = BearerAuth(expired, https=True)
    auth.sign("GET", "/c/b", [], {})
    auth.sign("GET", "/c/b", [], {})
    assert len(expired.calls) == 2
    with pytest.raises(AccessDenied):
        BearerAuth(cred, https=False).sign("GET", "/c/b", [], {})


def test_each_credential_kind_has_its_raw_auth() -> None:
    cred = FakeCredential(lifetime=3600)
    assert isinstance(
        raw_auth(Credential.account_key(KEY), ACCOUNT, None, https=True), SharedKeyAuth
    )
    sas = raw_auth(Credential.sas("?sv=1&sig=abc"), ACCOUNT, None, https=True)
    assert isinstance(sas, SasAuth) and sas.query == "sv=1&sig=abc"
    managed = Credential(CredentialKind.MANAGED_IDENTITY, client_id="1")
    assert isinstance(raw_auth(managed, ACCOUNT, cred, https=True), BearerAuth)
    assert isinstance(raw_auth(Credential.anonymous(), ACCOUNT, None, https=True), Anonymous)
