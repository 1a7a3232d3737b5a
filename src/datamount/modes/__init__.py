"""The mode table: every mode of the Azure ML table (jobspec/typemode.py ALLOWED_MODES says
which type and direction may use which) mapped to one handler with `prepare`
(before the job: make the entry's data appear at a local path) and `finish`
(after it: upload, unmount). `datamount mount` / `unmount`, `run` and the
library API all go through `prepare` and `finish` here.

- download, eval_download: a parallel download into the folder; nothing to finish.
- ro_mount, eval_mount, rw_mount: resolved and checked in this process, then
  served by a FUSE daemon; finish drains and unmounts (rw: uploads done).
- upload: an empty local folder and its record; finish uploads it and
  registers the asset.
- direct: the resolved URI; nothing to finish.

No threads.
"""

from __future__ import annotations

from pathlib import Path

from datamount.errors import DataError, SpecError
from datamount.jobspec.job import DataInput, JobSpec, Mode
from datamount.modes.context import Context
from datamount.modes.handler import Handler, How
from datamount.mount.table import mount_key

__all__ = ["Handler", "How", "finish", "handler", "modes_for", "prepare"]


class _Direct:
    directions: tuple[str, ...] = ("input", "output")
    keeps_folder: bool = False

    def prepare(
        self, ctx: Context, spec: JobSpec, entry: DataInput, folder: Path, how: How
    ) -> Path | str:
        return ctx.resolve(spec, entry).uri()

    def finish(self, ctx: Context, folder: Path, *, timeout: float | None, register: bool) -> str:
        raise DataError(f"{folder} is not mounted")


def _table() -> dict[Mode, Handler]:
    from datamount.modes import download, mounts, upload

    mount = mounts.MountHandler()
    return {
        Mode.DOWNLOAD: download.DownloadHandler(evaluated=False),
        Mode.EVAL_DOWNLOAD: download.DownloadHandler(evaluated=True),
        Mode.RO_MOUNT: mount,
        Mode.EVAL_MOUNT: mount,
        Mode.RW_MOUNT: mount,
        Mode.UPLOAD: upload.UploadHandler(),
        Mode.DIRECT: _Direct(),
    }


_HANDLERS: dict[Mode, Handler] = {}


def handler(mode: Mode) -> Handler:
    if not _HANDLERS:
        _HANDLERS.update(_table())
    return _HANDLERS[mode]


def modes_for(direction: str) -> tuple[Mode, ...]:
    """The modes an input (or output) may have, in the Azure ML table's order."""
    order = (Mode.DOWNLOAD, Mode.RO_MOUNT, Mode.UPLOAD, Mode.RW_MOUNT, Mode.DIRECT,
             Mode.EVAL_DOWNLOAD, Mode.EVAL_MOUNT)  # fmt: skip
    return tuple(m for m in order if direction in handler(m).directions)


def prepare(
    ctx: Context, spec: JobSpec, entry: DataInput, folder: Path, how: How = How()
) -> Path | str:
    """Make `entry` ready at `folder` as its mode says; what the job uses."""
    folder = Path(mount_key(folder))  # every mode prints an absolute path
    chosen = handler(entry.mode)
    if entry.direction not in chosen.directions:
        other = "an input" if entry.direction == "output" else "an output"
        raise SpecError(f"{entry.direction}s.{entry.name}: {entry.mode.value} is {other} mode")
    return chosen.prepare(ctx, spec, entry, folder, how)


def finish(
    ctx: Context, folder: Path, *, timeout: float | None = None, register: bool = True
) -> str:
    """Undo what `prepare` left at `folder`: upload an upload output (registering
    its asset unless `register` is False), or drain and unmount a mount."""
    from datamount.modes.upload_records import read_record  # `download` starts faster without it

    folder = Path(mount_key(folder))
    recorded = read_record(ctx.settings.cache_dir, folder) is not None
    mode = Mode.UPLOAD if recorded else Mode.RO_MOUNT
    return handler(mode).finish(ctx, folder, timeout=timeout, register=register)
