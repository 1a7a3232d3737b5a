"""The `upload` output mode's records: an empty folder handed to the job,
and a record of what to upload from it when the job ends (the mode itself
is modes.upload).

`datamount mount SPEC MOUNTPOINT` for an upload output prepares MOUNTPOINT as
an empty local folder and records (in `<cache>/outputs/<hash>.json`) which
spec entry it belongs to; `datamount unmount MOUNTPOINT` finds that record,
uploads the folder's content through the transfer engine, registers the asset
when the output names one, and empties the local folder. A failed upload keeps
both the folder and the record, so the unmount can simply be run again.

Threads: none of its own. Between processes, a record is held under an
exclusive flock while its folder is uploaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from datamount import private
from datamount.errors import DataError
from datamount.mount.control import find_mount, mount_key, state_file


@dataclass(frozen=True)
class UploadOutput:
    """One prepared upload output, as recorded at mount time."""

    mountpoint: str
    spec: str
    output: str
    workspace: str | None
    file_name: str | None  # uri_file outputs: the one file the job writes
    run_name: str | None = None  # `run`'s unique name: the spec's default output paths


def record_file(cache_dir: Path, mountpoint: Path) -> Path:
    mounts = state_file(cache_dir, mountpoint)
    return cache_dir / "outputs" / mounts.name


def read_record(cache_dir: Path, mountpoint: Path) -> UploadOutput | None:
    try:
        data = json.loads(record_file(cache_dir, mountpoint).read_text())
        return UploadOutput(**data)
    except (OSError, ValueError, TypeError):
        return None


def pending_under(cache_dir: Path, folder: Path) -> list[str]:
    """Upload outputs recorded under `folder` and not uploaded yet."""
    root = mount_key(folder) + "/"
    found = []
    for path in (cache_dir / "outputs").glob("*.json"):
        try:
            record = UploadOutput(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if record.mountpoint.startswith(root):
            found.append(record.mountpoint)
    return sorted(found)


def prepare(cache_dir: Path, record: UploadOutput) -> Path:
    """Create the empty folder and the record; returns the path for the job."""
    folder = Path(record.mountpoint)
    if find_mount(folder) is not None:
        raise DataError(f"{folder} is a mount point; an upload output needs a plain folder")
    if read_record(cache_dir, folder) is not None:
        raise DataError(
            f"{folder} already holds an upload output not yet uploaded; "
            f"run `datamount unmount {folder}` first"
        )
    path = record_file(cache_dir, folder)
    try:  # the cache folder first: a bad --cache-dir creates nothing
        private.folders(path.parent)  # the cache: 0700, the record 0600
    except OSError as exc:
        raise DataError(
            f"cannot create cache folder {path.parent}: {exc.strerror or exc}"
        ) from None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if any(os.scandir(folder)):
            raise DataError(f"{folder} is not empty; an upload output starts from an empty folder")
    except OSError as exc:
        raise DataError(f"cannot create upload folder {folder}: {exc.strerror or exc}") from None
    try:
        private.write_text(path, json.dumps(asdict(record), indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        raise DataError(f"cannot write the upload record {path}: {exc.strerror or exc}") from None
    return folder / record.file_name if record.file_name else folder


@contextlib.contextmanager
def claimed(cache_dir: Path, mountpoint: Path) -> Iterator[UploadOutput | None]:
    """The record of the upload output at `mountpoint`, held exclusively
    (flock) while the caller uploads it: a second `unmount` of the same folder
    waits, then finds it done (None)."""
    path = record_file(cache_dir, mountpoint)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield None
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield read_record(cache_dir, mountpoint)  # None when the holder before us finished
    finally:
        os.close(fd)


def source(record: UploadOutput) -> Path:
    """What to upload: the folder, or the one file of a uri_file output."""
    folder = Path(record.mountpoint)
    return folder / record.file_name if record.file_name else folder


def finish(cache_dir: Path, record: UploadOutput) -> None:
    """After a successful upload: remove the local copy (the folder stays,
    empty, like a mount point after an unmount) and the record."""
    with contextlib.suppress(FileNotFoundError), os.scandir(record.mountpoint) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                Path(entry.path).unlink(missing_ok=True)
    record_file(cache_dir, Path(mount_key(Path(record.mountpoint)))).unlink(missing_ok=True)
