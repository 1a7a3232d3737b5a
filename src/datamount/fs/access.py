"""Who may use a mount: the owner, group and modes its files and folders show,
and whether users other than the one who mounted it reach it at all.

By default a mount is for the mounting user only, as blobfuse2's,
mountpoint-s3's, rclone's and gcsfuse's are: without FUSE's `allow_other`
the kernel refuses every other user (root included) before a request reaches
the daemon. DATAMOUNT_MOUNT_ALLOW_OTHER opens it, always together with
`default_permissions`, so the kernel checks the owner, group and modes shown
here on every access; the daemon itself checks none. DATAMOUNT_MOUNT_UID /
_GID / _FILE_MODE / _DIR_MODE set what is shown (unset: the mounting user,
0444 / 0555 read-only, 0755 / 0755 rw_mount: a script written to an
output runs from it, as before these settings).

No threads, no state: an `Access` is a frozen value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from datamount.settings import Settings

RO_FILE_MODE, RO_DIR_MODE = 0o444, 0o555
RW_FILE_MODE, RW_DIR_MODE = 0o755, 0o755


@dataclass(frozen=True)
class Access:
    """What a mount shows and lets through; modes are permission bits only."""

    uid: int
    gid: int
    file_mode: int
    dir_mode: int
    allow_other: bool = False

    def fuse_options(self) -> dict[str, bool]:
        """libfuse's mount options for this access."""
        if not self.allow_other:
            return {}
        return {"allow_other": True, "default_permissions": True}

    def describe(self) -> str:
        """One line for the daemon's start log."""
        who = "allow_other (default_permissions)" if self.allow_other else "only the mounting user"
        return (
            f"owner {self.uid}:{self.gid}, files {self.file_mode:04o}, "
            f"folders {self.dir_mode:04o}, {who}"
        )


def mount_access(
    *,
    writable: bool,
    allow_other: bool = False,
    uid: int | None = None,
    gid: int | None = None,
    file_mode: int | None = None,
    dir_mode: int | None = None,
) -> Access:
    """The access of a mount; what is None takes its default (the mounting
    user, and the modes of a read-only or a writable mount)."""
    default_file, default_dir = (
        (RW_FILE_MODE, RW_DIR_MODE) if writable else (RO_FILE_MODE, RO_DIR_MODE)
    )
    return Access(
        uid=os.geteuid() if uid is None else uid,
        gid=os.getegid() if gid is None else gid,
        file_mode=default_file if file_mode is None else file_mode,
        dir_mode=default_dir if dir_mode is None else dir_mode,
        allow_other=allow_other,
    )


def access_from(settings: Settings, *, writable: bool) -> Access:
    """The access DATAMOUNT_MOUNT_ALLOW_OTHER, _UID, _GID, _FILE_MODE and
    _DIR_MODE ask for."""
    return mount_access(
        writable=writable,
        allow_other=settings.mount_allow_other,
        uid=settings.mount_uid,
        gid=settings.mount_gid,
        file_mode=settings.mount_file_mode,
        dir_mode=settings.mount_dir_mode,
    )
