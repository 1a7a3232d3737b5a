"""The Azure ML type × mode × direction table, and the spelling and defaults
of a data entry's `type`, `mode` and output `path` as the Azure ML SDK
(`azure-ai-ml`) reads them: values are case-insensitive, a missing `type` is
uri_folder, the legacy output `mode: mount` is rw_mount, and an output without
a path gets one on the default datastore.

Also the expressions Azure ML expands in output paths (`${{name}}`...).

And the checks of an entry that are about its type: its `replicas:` (an
extension of the spec: other copies of the same data, each a path of the same
kind as `path`), a model path given to a
data-typed entry (or the reverse), and what an output may register as.

Pure: no I/O. No threads.
"""

from __future__ import annotations

import logging
import re
from enum import StrEnum
from typing import Any, Literal

from datamount.errors import UriError
from datamount.jobspec.uris import (
    OUTPUT_ASSET_NAME,
    OUTPUT_ASSET_RULE,
    Location,
    LocationKind,
    parse,
)

log = logging.getLogger("datamount.app")


class DataType(StrEnum):
    URI_FILE = "uri_file"
    URI_FOLDER = "uri_folder"
    MLTABLE = "mltable"
    MLFLOW_MODEL = "mlflow_model"
    CUSTOM_MODEL = "custom_model"
    TRITON_MODEL = "triton_model"


# Model types are folders (an MLflow model is a folder with an MLmodel file;
# custom and Triton models are folders too) and resolve `azureml:<name>:<v>`
# through the workspace's `models:` section, not `data_assets:`.
MODEL_TYPES = frozenset({DataType.MLFLOW_MODEL, DataType.CUSTOM_MODEL, DataType.TRITON_MODEL})


def asset_kind(kind: DataType) -> str:
    """'model' for a model type, 'data' for the others: which registry section it uses."""
    return "model" if kind in MODEL_TYPES else "data"


class Mode(StrEnum):
    RO_MOUNT = "ro_mount"
    RW_MOUNT = "rw_mount"
    DOWNLOAD = "download"
    UPLOAD = "upload"
    DIRECT = "direct"
    EVAL_MOUNT = "eval_mount"
    EVAL_DOWNLOAD = "eval_download"


Direction = Literal["input", "output"]

_OUTPUT_MODES = (Mode.UPLOAD, Mode.RW_MOUNT, Mode.DIRECT)
# Model inputs: download, ro_mount and direct, as azure-ai-ml's ModelInputSchema
# (_schema/job/input_output_entry.py) allows; no eval_* (those read an MLTable).
_MODEL_INPUT_MODES = (Mode.DOWNLOAD, Mode.RO_MOUNT, Mode.DIRECT)
# The Azure ML table (docs/specs.md), as the SDK has it: every output type may
# be direct (the command receives the resolved URI; azure-ai-ml's OutputSchema
# allows upload, rw_mount, direct and the legacy mount for every type).
ALLOWED_MODES: dict[tuple[Direction, DataType], tuple[Mode, ...]] = {
    ("input", DataType.URI_FILE): (Mode.DOWNLOAD, Mode.RO_MOUNT, Mode.DIRECT),
    ("input", DataType.URI_FOLDER): (Mode.DOWNLOAD, Mode.RO_MOUNT, Mode.DIRECT),
    ("input", DataType.MLTABLE): (
        Mode.DOWNLOAD,
        Mode.RO_MOUNT,
        Mode.DIRECT,
        Mode.EVAL_DOWNLOAD,
        Mode.EVAL_MOUNT,
    ),
    ("output", DataType.URI_FILE): _OUTPUT_MODES,
    ("output", DataType.URI_FOLDER): _OUTPUT_MODES,
    ("output", DataType.MLTABLE): _OUTPUT_MODES,
    **{("input", t): _MODEL_INPUT_MODES for t in MODEL_TYPES},
    **{("output", t): _OUTPUT_MODES for t in MODEL_TYPES},
}
DEFAULT_MODE: dict[Direction, Mode] = {"input": Mode.RO_MOUNT, "output": Mode.RW_MOUNT}
DEFAULT_TYPE = DataType.URI_FOLDER  # the SDK's Input/Output default
DEFAULT_DATASTORE = "workspaceblobstore"
# The SDK's legacy output mode: azure-ai-ml maps `mount` to READ_WRITE_MOUNT
# (entities/_job/_input_output_helpers.py, OUTPUT_MOUNT_MAPPING_TO_REST).
LEGACY_OUTPUT_MODES = {"mount": Mode.RW_MOUNT}


def data_type(raw: object) -> DataType | None:
    """`raw` as a data type, whatever its case (`URI_FOLDER`, `MLTable`); None if it is none."""
    if not isinstance(raw, str):
        return None
    text = raw.lower()
    return DataType(text) if text in DataType.__members__.values() else None


def mode(raw: object, direction: Direction, where: str) -> Mode | None:
    """`raw` as a mode, whatever its case; an output's legacy `mount` is
    rw_mount, said in the log. None if it is no mode."""
    if not isinstance(raw, str):
        return None
    text = raw.lower()
    if direction == "output" and text in LEGACY_OUTPUT_MODES:
        mapped = LEGACY_OUTPUT_MODES[text]
        log.info("%s: mode %r is the legacy name of %s, as in Azure ML", where, raw, mapped.value)
        return mapped
    return Mode(text) if text in Mode.__members__.values() else None


def default_output_path(
    run_name: str, output: str, kind: DataType, datastore: str = DEFAULT_DATASTORE
) -> str:
    """Where an output without a `path` goes: `<run>/<output>/` on the default
    datastore; a uri_file output is the file `<run>/<output>/<output>` there."""
    folder = f"azureml://datastores/{datastore}/paths/{run_name}/{output}/"
    return folder + output if kind is DataType.URI_FILE else folder


# The expressions Azure ML expands in an output path (`${{name}}` is the job's,
# here the run's, unique name).
_EXPRESSION = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")
OUTPUT_PATH_EXPRESSIONS = ("name", "output_name", "default_datastore")


def expand_output_path(
    path: str, where: str, *, run_name: str, output: str, datastore: str, problems: list[str]
) -> str:
    """`path` with `${{name}}`, `${{output_name}}` and `${{default_datastore}}`
    expanded; an unknown expression is one problem naming it."""
    values = {"name": run_name, "output_name": output, "default_datastore": datastore}
    allowed = ", ".join(f"${{{{{e}}}}}" for e in OUTPUT_PATH_EXPRESSIONS)
    unknown = [e for e in _EXPRESSION.findall(path) if e not in values]
    for expression in unknown:
        problems.append(f"{where}: unknown expression ${{{{{expression}}}}}; allowed: {allowed}")
    if unknown:
        return path
    return _EXPRESSION.sub(lambda m: values[m.group(1)], path)


def check_path_kind(location: Location, kind: DataType, where: str, problems: list[str]) -> None:
    """A path that names a model (`.../models/...`) cannot feed a data-typed
    entry, nor a data asset (`.../data/...`) a model-typed one."""
    if location.kind is not LocationKind.ASSET or not location.asset_kind:
        return
    wanted = asset_kind(kind)
    if location.asset_kind != wanted:
        problems.append(
            f"{where}: {location.raw!r} is a {location.asset_kind} asset, but the entry is a "
            f"{kind.value} (a {wanted} type); declare a matching type"
        )


def check_asset(
    raw: dict[str, Any], kind: DataType | None, where: str, problems: list[str]
) -> None:
    """An output's `name`/`version` (the asset it registers) can be registered."""
    name, version = raw.get("name"), raw.get("version")
    what = "model" if kind in MODEL_TYPES else "data asset"
    if name is not None and not OUTPUT_ASSET_NAME.fullmatch(str(name)):
        problems.append(f"{where}.name: {name!r} is not a {what} name ({OUTPUT_ASSET_RULE})")
    if version is not None and name is None:
        problems.append(f"{where}.version: a version needs a `name` (the {what})")
    if isinstance(version, float):
        problems.append(
            f"{where}.version: {version!r} is a number in YAML: quote the version "
            "(e.g. '1.10') so it stays as written"
        )


def replica_locations(
    raw: object, path: Location, kind: DataType, direction: Direction, where: str,
    problems: list[str],
) -> tuple[Location, ...]:  # fmt: skip
    """The `replicas:` of an entry (an extension of the spec): a list of
    paths to copies of the same data as `path`, of the entry's type (a
    uri_file's replicas are files); inputs only. Resolved with the workspace later."""
    if raw is None:
        return ()
    if direction != "input":
        problems.append(f"{where}: replicas are for inputs (copies to read from), not outputs")
        return ()
    if not isinstance(raw, list) or not raw:
        problems.append(f"{where}: expected a non-empty list of paths to copies of `path`")
        return ()
    found: list[Location] = []
    for i, item in enumerate(raw):
        here = f"{where}[{i}]"
        try:
            location = parse(item, here)
        except UriError as exc:
            problems += exc.problems
            continue
        check_path_kind(location, kind, here, problems)
        if location.raw.strip() == path.raw.strip() or location in found:
            problems.append(f"{here}: {item!r} repeats a path already given")
        elif kind is DataType.URI_FILE and location.is_folder:
            problems.append(f"{here}: {item!r} names a folder; a uri_file's replicas are files")
        found.append(location)
    return tuple(found)


DATASTORE_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def upload_datastore(
    raw: object, direction: Direction, where: str, problems: list[str]
) -> str | None:
    """An input's `datastore:` as the SDK has it: the datastore Azure ML
    uploads a local `path` to on submission (`azureml:` prefix allowed;
    ignored for any other path). One node reads a local path where it is, so
    nothing is uploaded; outputs have no such key (the SDK refuses it)."""
    if direction != "input":
        problems.append(
            f"{where}.datastore: only inputs have `datastore:` (where a local path is "
            "uploaded); put an output on a datastore with its `path`"
        )
        return None
    name = raw.removeprefix("azureml:") if isinstance(raw, str) else None
    if name is None or not DATASTORE_NAME.fullmatch(name):
        problems.append(f"{where}.datastore: {raw!r} is not a datastore name")
        return None
    return name
