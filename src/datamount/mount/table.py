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

FSTYPE = "fuse.datamount"
POLL = 0.1


@dataclass(frozen=True)
class MountEntry:
    mountpoint: str
    fstype: str
    source: str
    device: str  # "major:minor"


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    out = bytearray()
    raw = field.encode("utf-8", "surrogateescape")
    i = 0
    while i < len(raw):
        if raw[i : i + 1] == b"\\" and raw[i + 1 : i + 4].isdigit():
            out.append(int(raw[i + 1 : i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode("utf-8", "surrogateescape")


def mounts(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[MountEntry]:
    entries = []
    for line in mountinfo.read_text(encoding="utf-8", errors="surrogateescape").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 2:
            entries.append(MountEntry(_unescape(fields[4]), tail[0], _unescape(tail[1]), fields[2]))
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
