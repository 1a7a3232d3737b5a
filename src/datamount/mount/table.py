"""The kernel's mount table and fusermount3: find a mount, tell a stale one
(its daemon gone), unmount with `fusermount3 -u` (retried while busy) or
detach with `-uz`. Used from outside the daemon (control) and inside it
(daemon), so there is one unmount loop.

No threads.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from datamount.mountinfo import split_lines, unescape

POLL = 0.1


@dataclass(frozen=True)
class MountEntry:
    mountpoint: str
    fstype: str
    source: str
    device: str  # "major:minor"


def mounts(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[MountEntry]:
    entries = []
    text = mountinfo.read_text(encoding="utf-8", errors="surrogateescape")
    for fields, tail in split_lines(text):
        if len(fields) >= 5 and len(tail) >= 2:
            entries.append(MountEntry(unescape(fields[4]), tail[0], unescape(tail[1]), fields[2]))
    return entries


def mount_key(mountpoint: Path) -> str:
    """The absolute, normalised form of a mount point (no stat: it may be stale)."""
    return os.path.normpath(os.path.abspath(mountpoint))


def find_mount(mountpoint: Path) -> MountEntry | None:
    key = mount_key(mountpoint)
    found = [m for m in mounts() if m.mountpoint == key]
    return found[-1] if found else None  # the topmost of stacked mounts


def is_stale(mountpoint: Path) -> bool:
    """A FUSE mount whose daemon is gone (ENOTCONN). statfs always reaches the
    daemon; a stat may be answered from the kernel's attribute cache."""
    try:
        os.statvfs(mountpoint)
    except OSError as exc:
        return exc.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


def fusermount(mountpoint: Path, *, lazy: bool = False) -> tuple[bool, str]:
    """`fusermount3 -u` (lazy: `-uz`, detach now, release when unused).
    Returns (success, fusermount's message)."""
    import shutil
    import subprocess  # here: `download` imports this module, and never unmounts

    exe = shutil.which("fusermount3") or "/usr/bin/fusermount3"
    flags = "-uz" if lazy else "-u"
    try:
        done = subprocess.run(
            [exe, flags, mount_key(mountpoint)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return done.returncode == 0, done.stderr.strip()


def unmount_while_busy(mountpoint: Path, deadline: float) -> tuple[bool, str]:
    """`fusermount3 -u`, retried every POLL seconds while the mount is busy,
    until it is gone or `deadline` (time.monotonic()) passes. Returns (gone,
    fusermount's last message); the caller decides how to force it."""
    while True:
        ok, message = fusermount(mountpoint)
        if ok or find_mount(mountpoint) is None:
            return True, message
        if time.monotonic() >= deadline or "busy" not in message.lower():
            return False, message
        time.sleep(POLL)
