"""The clients behind AzureBlobStore, shared per (endpoint, container,
credential) and reference counted: the RawClient (azure_raw: reads, writes,
stat and listing) over its own connection pool, and, created on first use
only, the SDK's ContainerClient (commit, copy, delete) over one requests
Session.

Why lazily: a download or a mount never needs the SDK, and importing it costs
more than a small download spends on requests (docs/design/storage.md,
"Why the raw path").

Both pools hold `pool_size` keep-alive connections (the largest size any
user asked for; the composition root sizes it to the thread counts). The
SDK's retries are off (retry_total=0) and urllib3's too: every request goes
once through the store's `RetryPolicy.call`. One azure-identity credential
object serves both clients, so its token cache is shared. `managed_identity`
is AKS workload identity when AZURE_FEDERATED_TOKEN_FILE is set (azure_auth.
WorkloadIdentity, its token endpoint reached with the project's TLS); one
log line per client set says which identity was chosen.

Threads: `acquire`, `release` and `Shared.sdk` take a module lock; the
clients themselves are thread-safe.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from datamount.errors import AccessDenied
from datamount.storage.azure_auth import (
    Anonymous,
    Auth,
    BearerAuth,
    SasAuth,
    SharedKeyAuth,
    WorkloadIdentity,
    workload_identity,
)
from datamount.storage.azure_raw import RawClient
from datamount.storage.credentials import Credential, CredentialKind

if TYPE_CHECKING:
    import requests
    from azure.storage.blob import ContainerClient
    from requests.adapters import HTTPAdapter

# The x-ms-version azure-storage-blob 12.31 sends (a test keeps them equal):
# the raw path must speak the same service version without importing it.
API_VERSION = "2026-10-06"
# Larger than any block a reader or downloader asks for (blocks are 2-64 MiB),
# so a download_blob of one range is answered by its first and only GET.
MAX_SINGLE_GET = 256 << 20
MAX_SINGLE_PUT = 64 << 20  # an SDK upload_blob of up to 64 MiB is one Put Blob
DATA_BLOCK = 256 << 10
CONNECT_TIMEOUT = 10.0
DEFAULT_READ_TIMEOUT = 30.0  # seconds without a byte before a request is abandoned
TOKEN_KINDS = (CredentialKind.USER_IDENTITY, CredentialKind.MANAGED_IDENTITY)
log = logging.getLogger(__name__)


def _quiet_identity_log() -> None:
    """azure-identity logs a WARNING (several lines) when get_token fails; with
    no handler anywhere, Python's last-resort handler would print it on a
    command's stderr beside datamount's own one-line error, which already
    gives the reason. A NullHandler (what a library's logger should have)
    stops only that fallback: handlers an application installs still get it."""
    logger = logging.getLogger("azure.identity")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())


def token_transport(ca_bundle: Path | None) -> Any:
    """The transport of a token endpoint's requests: a requests Session whose
    https trusts what the storage requests trust (storage.tls)."""
    import requests
    from azure.core.pipeline.transport import RequestsTransport

    from datamount.storage import sessions

    session = requests.Session()
    adapter = sessions.adapter(ca_bundle, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return RequestsTransport(
        session=session, connection_timeout=CONNECT_TIMEOUT, read_timeout=DEFAULT_READ_TIMEOUT
    )


def sdk_credential(credential: Credential, account: str, ca_bundle: Path | None = None) -> Any:
    kind = credential.kind
    if kind in TOKEN_KINDS:
        _quiet_identity_log()
    secret = credential.secret.reveal() if credential.secret else ""
    if kind is CredentialKind.ACCOUNT_KEY:
        from azure.core.credentials import AzureNamedKeyCredential

        return AzureNamedKeyCredential(account, secret)
    if kind is CredentialKind.SAS:
        from azure.core.credentials import AzureSasCredential

        return AzureSasCredential(secret)
    if kind is CredentialKind.USER_IDENTITY:
        from azure.identity import (
            AzureCliCredential,
            ChainedTokenCredential,
            DefaultAzureCredential,
        )

        return ChainedTokenCredential(AzureCliCredential(), DefaultAzureCredential())
    if kind is CredentialKind.MANAGED_IDENTITY:
        from azure.identity import ManagedIdentityCredential

        federated = workload_identity(
            os.environ, credential.client_id, lambda: token_transport(ca_bundle)
        )
        return federated or ManagedIdentityCredential(client_id=credential.client_id)
    return None


def raw_auth(credential: Credential, account: str, sdk_cred: Any, *, https: bool) -> Auth:
    """The RawClient's authorization for `credential` (sharing `sdk_cred`'s tokens)."""
    secret = credential.secret.reveal() if credential.secret else ""
    if credential.kind is CredentialKind.ACCOUNT_KEY:
        return SharedKeyAuth(account, secret)
    if credential.kind is CredentialKind.SAS:
        return SasAuth(secret)
    if sdk_cred is not None:
        kind = sdk_cred.kind if isinstance(sdk_cred, WorkloadIdentity) else credential.describe()
        return BearerAuth(sdk_cred, https=https, kind=kind)
    return Anonymous()


def identity_line(credential: Credential, token_credential: Any) -> str:
    """Which identity a client set uses, for the log: never a secret."""
    if isinstance(token_credential, WorkloadIdentity):
        return token_credential.describe()
    if credential.kind is CredentialKind.MANAGED_IDENTITY:
        return f"{credential.describe()} (azure-identity ManagedIdentityCredential)"
    if credential.kind is CredentialKind.USER_IDENTITY:
        return f"{credential.describe()} (az CLI, then DefaultAzureCredential)"
    return credential.describe()


def account_of(endpoint: str) -> str:
    """The account name of a blob endpoint: the first label of the host, or
    the first path segment for path-style endpoints (Azurite, IP addresses)."""
    parts = urlsplit(endpoint)
    path = parts.path.strip("/")
    if path:
        return path.split("/", 1)[0]
    return (parts.hostname or "").split(".", 1)[0]


@dataclass
class SdkClients:
    client: ContainerClient
    session: requests.Session
    adapter: HTTPAdapter


@dataclass
class Shared:
    endpoint: str
    container: str
    account: str
    credential: Credential
    token_credential: Any  # the azure-identity object of identity credentials, else None
    raw: RawClient
    pool_size: int
    ca_bundle: Path | None = None  # REQUESTS_CA_BUNDLE, trusted beside the system store
    users: int = 0
    sdk_clients: SdkClients | None = None

    def sdk(self) -> SdkClients:
        """The SDK's clients, created (and the SDK imported) on first use."""
        clients = self.sdk_clients
        if clients is None:
            with _CLIENTS_LOCK:
                if self.sdk_clients is None:
                    self.sdk_clients = _create_sdk(self)
                clients = self.sdk_clients
        return clients


_CLIENTS: dict[tuple[str, Credential], Shared] = {}
_CLIENTS_LOCK = threading.Lock()


def _create(
    endpoint: str,
    container: str,
    credential: Credential,
    account: str,
    pool_size: int,
    ca_bundle: Path | None,
) -> Shared:
    account = account or account_of(endpoint)
    https = endpoint.startswith("https:")
    if credential.kind in TOKEN_KINDS and not https:
        # The SDK refuses too (with a ValueError): a token never travels in clear.
        raise AccessDenied(f"{credential.describe()} needs an https endpoint, not {endpoint}")
    token_credential = (
        sdk_credential(credential, account, ca_bundle) if credential.kind in TOKEN_KINDS else None
    )
    log.info(
        "%s/%s: credential %s", endpoint, container, identity_line(credential, token_credential)
    )
    auth = raw_auth(credential, account, token_credential, https=https)
    raw = RawClient(
        endpoint,
        container,
        auth,
        api_version=API_VERSION,
        pool_size=pool_size,
        ca_bundle=ca_bundle,
    )
    return Shared(
        endpoint, container, account, credential, token_credential, raw, pool_size, ca_bundle
    )


def _create_sdk(shared: Shared) -> SdkClients:
    import requests
    from azure.core.pipeline.transport import RequestsTransport
    from azure.storage.blob import ContainerClient

    from datamount.storage import sessions

    session = requests.Session()
    # The raw path's TLS context: both paths trust the same CAs.
    adapter = sessions.adapter(
        shared.ca_bundle, pool_connections=4, pool_maxsize=shared.pool_size, max_retries=0
    )
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    transport = RequestsTransport(
        session=session,
        session_owner=False,
        connection_timeout=CONNECT_TIMEOUT,
        read_timeout=DEFAULT_READ_TIMEOUT,  # each store passes its own per call
        # The SDK uses 256 KiB when it builds its own transport; one we pass in
        # would default to 4 KiB chunks. Why: docs/design/storage.md
        # ("The SDK's transport chunk").
        connection_data_block_size=DATA_BLOCK,
    )
    credential = shared.token_credential or sdk_credential(
        shared.credential, shared.account, shared.ca_bundle
    )
    client = ContainerClient(
        account_url=shared.endpoint,
        container_name=shared.container,
        credential=credential,
        transport=transport,
        retry_total=0,
        max_single_get_size=MAX_SINGLE_GET,
        max_single_put_size=MAX_SINGLE_PUT,
        api_version=API_VERSION,
    )
    return SdkClients(client, session, adapter)


def acquire(
    endpoint: str,
    container: str,
    credential: Credential,
    account: str,
    pool_size: int,
    ca_bundle: Path | None = None,
) -> Shared:
    """The shared clients (one process has one `ca_bundle`: the first user's holds)."""
    key = (f"{endpoint}/{container}", credential)
    with _CLIENTS_LOCK:
        shared = _CLIENTS.get(key)
        if shared is None:
            shared = _CLIENTS[key] = _create(
                endpoint, container, credential, account, pool_size, ca_bundle
            )
        elif pool_size > shared.pool_size:
            # A larger pool for the new user. Swapping the adapter's pool
            # manager is one attribute store (re-mounting would mutate the
            # adapter dict other threads iterate); requests in flight finish
            # on connections of the old manager.
            if shared.sdk_clients is not None:
                shared.sdk_clients.adapter.init_poolmanager(4, pool_size)
            shared.raw.pool.maxsize = pool_size
            shared.pool_size = pool_size
        shared.users += 1
        return shared


def release(endpoint: str, container: str, credential: Credential) -> None:
    key = (f"{endpoint}/{container}", credential)
    with _CLIENTS_LOCK:
        shared = _CLIENTS.get(key)
        if shared is None:
            return
        shared.users -= 1
        if shared.users <= 0:
            del _CLIENTS[key]
            if shared.sdk_clients is not None:
                shared.sdk_clients.client.close()
                shared.sdk_clients.session.close()
            shared.raw.close()
