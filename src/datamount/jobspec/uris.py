"""Parse every path form a spec may hold into one `Location` value.

Pure string work: no I/O, no workspace lookups (that is `workspace.resolve`).

Forms (docs/specs.md, paths):
  ./rel, /abs, file:///abs                          → LOCAL
  http(s)://host/...                                → HTTP (a public file)
  https://<acct>.blob.<suffix>/<container>/<p>      → BLOB
  https://<acct>.dfs.<suffix>/<fs>/<p>              → ADLS
  wasb(s)://<container>@<acct>.blob.<suffix>/<p>    → BLOB
  abfs(s)://<fs>@<acct>.dfs.<suffix>/<p>            → ADLS
  azureml://datastores/<ds>/paths/<p>               → DATASTORE
  azureml://subscriptions/<s>/resourcegroups/<rg>/workspaces/<w>/datastores/<ds>/paths/<p>
  azureml://subscriptions/.../workspaces/<w>/data/<name>/versions/<v>  → ASSET
  azureml://subscriptions/.../workspaces/<w>/models/<name>/versions/<v> → ASSET (model)
  azureml:/subscriptions/<s>/resourceGroups/<rg>/providers/
      Microsoft.MachineLearningServices/workspaces/<w>/(data|models)/<n>/versions/<v>
                                                    → ASSET (the ARM id)
  azureml://registries/<r>/(data|models)/<n>/(versions/<v>|labels/latest) → ASSET in registry <r>
  azureml://jobs/<run>/outputs/<output>[/paths/<p>] → JOB_OUTPUT (the run history)
  azureml:<name>:<version>, azureml:<name>@latest                  → ASSET
  azureml:<any URI above>                           → that URI
  runs:/..., s3://..., any other scheme             → UriError (never a local path)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import unquote, urlsplit

from datamount.errors import UnreadablePath, UriError

DEFAULT_SUFFIX = "core.windows.net"

# Azure naming rules: account 3-24 lowercase letters/digits; container 3-63
# lowercase letters/digits/hyphens (plus the special $root / $web / $logs).
_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
_CONTAINER = re.compile(r"^(?:[a-z0-9](?:[a-z0-9-]{1,61}[a-z0-9])|\$root|\$web|\$logs)$")
ASSET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,254}$")
# What an output may register as (azure-ai-ml Output._assert_name_and_version):
# letters, digits, '-' and '_', at most 255 characters; no '.'.
OUTPUT_ASSET_NAME = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
OUTPUT_ASSET_RULE = "letters, digits, '-' and '_' (no '.'), at most 255 characters"
# A scheme as RFC 3986 spells it, two characters at least (`C:` is a drive).
_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]+):")
_ARM_PREFIX = "/subscriptions/"
_AZURE_HOST = re.compile(r"^(?P<account>[^.]+)\.(?P<service>blob|dfs)\.(?P<suffix>.+)$")


class LocationKind(StrEnum):
    LOCAL = "local"
    HTTP = "http"
    BLOB = "azure_blob"
    ADLS = "azure_data_lake_gen2"
    DATASTORE = "datastore"
    ASSET = "data_asset"  # a data asset or a model (asset_kind)
    JOB_OUTPUT = "job_output"  # an earlier run's output, through the run history


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
    asset_kind: str = ""  # ASSET: 'data' or 'model' when the URI says; '' for azureml:<n>:<v>
    registry: str = ""  # ASSET: the registry named by azureml://registries/<r>/...
    job: str = ""  # JOB_OUTPUT: the run's name
    job_output: str = ""  # JOB_OUTPUT: the output's name (`path` is below it)

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
        if rest.lower().startswith(_ARM_PREFIX):
            return _arm_id(rest, raw, where)
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
    bare = _SCHEME.match(text)
    if not scheme and bare:
        scheme = bare["scheme"].lower()
    if scheme == "runs":
        raise UriError(
            f"{where}: {raw!r}: runs:/ is MLflow's run-artifact scheme, which datamount "
            "cannot read; register the model (models:) and use azureml:<model>:<version>"
        )
    if scheme:
        local = "" if "://" in text else f"a local path (./{text} if it is one), "
        raise UnreadablePath(
            f"{where}: {raw!r}: unsupported scheme {scheme!r}; use {local}http(s)://, "
            "wasb(s)://, abfs(s):// or azureml://"
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
        raise UnreadablePath(
            f"{where}: {raw!r}: {account!r} is not a storage account name "
            "(3-24 lowercase letters and digits)"
        )


def _check_container(container: str, raw: str, where: str, what: str = "container") -> None:
    if not _CONTAINER.match(container):
        raise UnreadablePath(
            f"{where}: {raw!r}: {container!r} is not a valid {what} name "
            "(3-63 lowercase letters, digits and hyphens)"
        )


def _account_uri(text: str, scheme: str, raw: str, where: str) -> Location:
    blob = scheme.startswith("wasb")
    service = "blob" if blob else "dfs"
    holder = "container" if blob else "filesystem"
    shape = f"{scheme}://<{holder}>@<account>.{service}.core.windows.net/<path>"
    parts = urlsplit(text)
    if parts.query and "@" in parts.netloc:
        raise UriError(_sas_message(raw, where))
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


def _sas_message(raw: str, where: str) -> str:
    """The URI without its query (the token stays out of errors and logs)."""
    shown = raw.split("?", 1)[0] + "?<SAS token>"
    return f"{where}: {shown!r}: put SAS tokens in the workspace credentials, not in the URI"


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
        raise UriError(_sas_message(raw, where))
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
    if lowered[:1] == ["registries"]:
        return _registry_asset(segments, raw, where)
    if lowered[:1] == ["jobs"]:
        return _job_output(segments, raw, where)
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
    if workspace and len(segments) >= 2 and lowered[0] in ("data", "models"):
        loc = _versioned(segments, lowered, raw, where)
        return Location(**{**loc.__dict__, "workspace": workspace})
    raise UriError(
        f"{where}: {raw!r} is not a valid azureml URI: expected "
        "azureml://datastores/<datastore>/paths/<path> or azureml:<asset>:<version>"
    )


def _versioned(segments: list[str], lowered: list[str], raw: str, where: str) -> Location:
    """`(data|models)/<name>[/versions/<v> | /labels/latest]` as an ASSET of that kind."""
    kind = "model" if lowered[0] == "models" else "data"
    tail = lowered[2:4]
    if len(segments) == 2 or (len(segments) == 4 and tail == ["labels", "latest"]):
        ref = f"{segments[1]}@latest"
    elif len(segments) == 4 and tail[0] == "versions" and segments[3]:
        ref = f"{segments[1]}:{segments[3]}"
    else:
        raise UriError(
            f"{where}: {raw!r}: expected .../{lowered[0]}/<name>/versions/<version> "
            "or .../labels/latest"
        )
    loc = _asset_ref(ref, raw, where)
    return Location(**{**loc.__dict__, "asset_kind": kind})


def _registry_asset(segments: list[str], raw: str, where: str) -> Location:
    lowered = [s.lower() for s in segments]
    if len(segments) < 4 or not segments[1] or lowered[2] not in ("data", "models"):
        raise UriError(
            f"{where}: {raw!r} is not a valid registry URI: expected azureml://registries/"
            "<registry>/(data|models)/<name>/versions/<version> (or labels/latest)"
        )
    loc = _versioned(segments[2:], lowered[2:], raw, where)
    return Location(**{**loc.__dict__, "registry": segments[1]})


def _job_output(segments: list[str], raw: str, where: str) -> Location:
    """azureml://jobs/<run>/outputs/<output>[/paths/<path below the output>]"""
    lowered = [s.lower() for s in segments]
    ok = len(segments) >= 4 and segments[1] and lowered[2] == "outputs" and segments[3]
    if not ok or (len(segments) > 4 and lowered[4] != "paths"):
        raise UriError(
            f"{where}: {raw!r} is not a valid job output URI: expected "
            "azureml://jobs/<job name>/outputs/<output>/paths/<path>"
        )
    return Location(
        LocationKind.JOB_OUTPUT,
        raw,
        path=_clean_path("/".join(segments[5:]), raw, where),
        job=segments[1],
        job_output=segments[3],
    )


def _arm_id(rest: str, raw: str, where: str) -> Location:
    """/subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.MachineLearningServices/
    workspaces/<w>/(data|models)/<n>/versions/<v>: an asset of workspace <w>."""
    segments = rest.strip("/").split("/")
    lowered = [s.lower() for s in segments]
    shape = (
        "azureml:/subscriptions/<sub>/resourceGroups/<rg>/providers/"
        "Microsoft.MachineLearningServices/workspaces/<ws>/data/<name>/versions/<version>"
    )
    ok = (
        len(segments) >= 10
        and lowered[2] == "resourcegroups"
        and lowered[4:6] == ["providers", "microsoft.machinelearningservices"]
        and lowered[6] == "workspaces"
        and lowered[8] in ("data", "models")
        and all(segments[i] for i in (1, 3, 7))
    )
    if not ok:
        raise UriError(f"{where}: {raw!r} is not a valid ARM id: expected {shape}")
    loc = _versioned(segments[8:], lowered[8:], raw, where)
    return Location(**{**loc.__dict__, "workspace": segments[7]})


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
