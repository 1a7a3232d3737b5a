"""Parse every path form a spec may hold into one `Location` value.

Pure string work: no I/O, no workspace lookups (that is `workspace.resolve`).

Forms (DESIGN.md §1):
  ./rel, /abs, file:///abs                          → LOCAL
  http(s)://host/...                                → HTTP (a public file)
  https://<acct>.blob.<suffix>/<container>/<p>      → BLOB
  https://<acct>.dfs.<suffix>/<fs>/<p>              → ADLS
  wasb(s)://<container>@<acct>.blob.<suffix>/<p>    → BLOB
  abfs(s)://<fs>@<acct>.dfs.<suffix>/<p>            → ADLS
  azureml://datastores/<ds>/paths/<p>               → DATASTORE
  azureml://subscriptions/<s>/resourcegroups/<rg>/workspaces/<w>/datastores/<ds>/paths/<p>
  azureml://subscriptions/.../workspaces/<w>/data/<name>/versions/<v>  → ASSET
  azureml:<name>:<version>, azureml:<name>@latest                  → ASSET
  azureml:<any URI above>                           → that URI
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import unquote, urlsplit

from datamount.errors import UriError

DEFAULT_SUFFIX = "core.windows.net"

# Azure naming rules: account 3-24 lowercase letters/digits; container 3-63
# lowercase letters/digits/hyphens (plus the special $root / $web / $logs).
_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
_CONTAINER = re.compile(r"^(?:[a-z0-9](?:[a-z0-9-]{1,61}[a-z0-9])|\$root|\$web|\$logs)$")
ASSET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,254}$")
_AZURE_HOST = re.compile(r"^(?P<account>[^.]+)\.(?P<service>blob|dfs)\.(?P<suffix>.+)$")


class LocationKind(StrEnum):
    LOCAL = "local"
    HTTP = "http"
    BLOB = "azure_blob"
    ADLS = "azure_data_lake_gen2"
    DATASTORE = "datastore"
    ASSET = "data_asset"


@dataclass(frozen=True)
class Location:
    """A parsed path. Fields that do not apply to `kind` stay empty.

    `path` is percent-decoded and has no leading '/', except for LOCAL (the
    path as written, absolute or relative) and HTTP (the whole URL). A
    trailing '/' is kept: it marks a folder.
    """

    kind: LocationKind
    raw: str
    path: str = ""
    account: str = ""
    container: str = ""
    endpoint_suffix: str = DEFAULT_SUFFIX
    secure: bool = True
    datastore: str = ""
    asset_name: str = ""
    asset_version: str | None = None  # None: the latest version
    workspace: str = ""  # workspace named by a long azureml:// URI, informational

    @property
    def is_folder(self) -> bool:
        return self.path.endswith("/")


def parse(raw: object, where: str = "path") -> Location:
    """Parse `raw`; a malformed value raises UriError naming `where`."""
    if not isinstance(raw, str) or not raw.strip():
        raise UriError(f"{where}: expected a path or URI, got {raw!r}")
    text = raw.strip()
    if text.startswith("azureml:") and not text.startswith("azureml://"):
        rest = text[len("azureml:") :]
        if "://" in rest:  # azureml:wasbs://... → the URI itself
            return _with_raw(parse(rest, where), raw)
        return _asset_ref(rest, raw, where)
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if scheme in ("wasb", "wasbs", "abfs", "abfss"):
        return _account_uri(text, scheme, raw, where)
    if scheme in ("http", "https"):
        return _http(text, scheme, raw, where)
    if scheme == "azureml":
        return _azureml(text, raw, where)
    if scheme == "file":
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise UriError(f"{where}: {raw!r}: file URIs must be local (file:///abs/path)")
        return Location(LocationKind.LOCAL, raw, path=unquote(parts.path))
    if scheme:
        raise UriError(
            f"{where}: {raw!r}: unsupported scheme {scheme!r}; use a local path, "
            "http(s)://, wasb(s)://, abfs(s):// or azureml://"
        )
    return Location(LocationKind.LOCAL, raw, path=text)


def _with_raw(loc: Location, raw: str) -> Location:
    return Location(**{**loc.__dict__, "raw": raw})


def _clean_path(path: str, raw: str, where: str) -> str:
    """Decode percent-escapes, drop leading and doubled slashes, keep a trailing '/'."""
    decoded = unquote(path)
    trailing = decoded.endswith("/")
    parts = [p for p in decoded.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UriError(f"{where}: {raw!r}: '..' is not allowed in a storage path")
    cleaned = "/".join(parts)
    return cleaned + "/" if trailing and cleaned else cleaned


def _check_account(account: str, raw: str, where: str) -> None:
    if not _ACCOUNT.match(account):
        raise UriError(
            f"{where}: {raw!r}: {account!r} is not a storage account name "
            "(3-24 lowercase letters and digits)"
        )


def _check_container(container: str, raw: str, where: str, what: str = "container") -> None:
    if not _CONTAINER.match(container):
        raise UriError(
            f"{where}: {raw!r}: {container!r} is not a valid {what} name "
            "(3-63 lowercase letters, digits and hyphens)"
        )


def _account_uri(text: str, scheme: str, raw: str, where: str) -> Location:
    blob = scheme.startswith("wasb")
    service = "blob" if blob else "dfs"
    holder = "container" if blob else "filesystem"
    shape = f"{scheme}://<{holder}>@<account>.{service}.core.windows.net/<path>"
    parts = urlsplit(text)
    if "@" not in parts.netloc or parts.query or parts.fragment:
        raise UriError(f"{where}: {raw!r} is not a valid {scheme} URI: expected {shape}")
    container, host = parts.netloc.rsplit("@", 1)
    m = _AZURE_HOST.match(host.lower())
    if not m or m["service"] != service:
        raise UriError(f"{where}: {raw!r} is not a valid {scheme} URI: expected {shape}")
    _check_account(m["account"], raw, where)
    _check_container(container, raw, where, "container" if blob else "filesystem")
    return Location(
        LocationKind.BLOB if blob else LocationKind.ADLS,
        raw,
        path=_clean_path(parts.path, raw, where),
        account=m["account"],
        container=container,
        endpoint_suffix=m["suffix"],
        secure=scheme in ("wasbs", "abfss"),
    )


def _http(text: str, scheme: str, raw: str, where: str) -> Location:
    parts = urlsplit(text)
    if not parts.hostname:
        raise UriError(f"{where}: {raw!r} is not a valid URL: no host")
    m = _AZURE_HOST.match(parts.hostname.lower())
    if not m or parts.port is not None:
        return Location(LocationKind.HTTP, raw, path=text, secure=scheme == "https")
    # https://<account>.blob.<suffix>/<container>/<path>: a storage URL, not a public file.
    _check_account(m["account"], raw, where)
    container, _, rest = parts.path.lstrip("/").partition("/")
    if not container:
        raise UriError(
            f"{where}: {raw!r}: no container; expected "
            f"https://<account>.{m['service']}.core.windows.net/<container>/<path>"
        )
    _check_container(container, raw, where)
    if parts.query:
        raise UriError(
            f"{where}: {raw!r}: put SAS tokens in the workspace credentials, not in the URI"
        )
    return Location(
        LocationKind.BLOB if m["service"] == "blob" else LocationKind.ADLS,
        raw,
        path=_clean_path(rest, raw, where),
        account=m["account"],
        container=container,
        endpoint_suffix=m["suffix"],
        secure=scheme == "https",
    )


def _azureml(text: str, raw: str, where: str) -> Location:
    body = text[len("azureml://") :]
    segments = body.split("/")
    lowered = [s.lower() for s in segments]
    workspace = ""
    if lowered[:1] == ["subscriptions"]:
        # subscriptions/<s>/resourcegroups/<rg>/workspaces/<w>/<rest...>
        if (
            len(segments) < 7
            or lowered[2] != "resourcegroups"
            or lowered[4] != "workspaces"
            or not all(segments[i] for i in (1, 3, 5))
        ):
            raise UriError(
                f"{where}: {raw!r} is not a valid azureml URI: expected azureml://subscriptions/"
                "<sub>/resourcegroups/<rg>/workspaces/<ws>/datastores/<ds>/paths/<path>"
            )
        workspace = segments[5]
        segments, lowered = segments[6:], lowered[6:]
    if len(segments) >= 3 and lowered[0] == "datastores" and lowered[2] == "paths":
        name = segments[1]
        if not name:
            raise UriError(f"{where}: {raw!r}: empty datastore name")
        return Location(
            LocationKind.DATASTORE,
            raw,
            path=_clean_path("/".join(segments[3:]), raw, where),
            datastore=name,
            workspace=workspace,
        )
    if workspace and len(segments) >= 2 and lowered[0] == "data":
        version = segments[3] if len(segments) >= 4 and lowered[2] == "versions" else None
        loc = _asset_ref(segments[1] + (f":{version}" if version else ""), raw, where)
        return Location(**{**loc.__dict__, "workspace": workspace})
    raise UriError(
        f"{where}: {raw!r} is not a valid azureml URI: expected "
        "azureml://datastores/<datastore>/paths/<path> or azureml:<asset>:<version>"
    )


def _asset_ref(rest: str, raw: str, where: str) -> Location:
    name, version = rest, None
    if "@" in rest:
        name, label = rest.split("@", 1)
        if label != "latest":
            raise UriError(f"{where}: {raw!r}: unknown label {label!r}; only @latest exists")
    elif ":" in rest:
        name, version = rest.split(":", 1)
        if not version or ":" in version:
            raise UriError(f"{where}: {raw!r}: expected azureml:<name>:<version>")
    else:
        raise UriError(
            f"{where}: {raw!r}: a data asset needs a version: azureml:{rest}:<version> "
            f"or azureml:{rest}@latest"
        )
    if not ASSET_NAME.match(name):
        raise UriError(
            f"{where}: {raw!r}: {name!r} is not a data asset name "
            "(letters, digits, '_', '-', '.'; expected azureml:<name>:<version> or @latest)"
        )
    return Location(LocationKind.ASSET, raw, asset_name=name, asset_version=version)
