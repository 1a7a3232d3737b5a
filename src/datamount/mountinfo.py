"""/proc/self/mountinfo, read the one way: its lines split into the fields
before and after the " - " separator, and the octal escapes of its paths
undone, and where a mount's daemon listens for hints (`hint_socket`). Used
by mount/table.py and mount/hintsocket.py (the daemon) and data/hints.py (a
loader finding its mount from inside a training process), which sit in
different layers: the daemon must not import datamount.data, which imports
torch when torch is installed.

No threads, no I/O: the callers read the file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

FSTYPE = "fuse.datamount"  # what a datamount mount shows as its type


def unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo octal."""
    raw = field.encode("utf-8", "surrogateescape")
    out, i = bytearray(), 0
    while i < len(raw):
        if raw[i : i + 1] == b"\\" and raw[i + 1 : i + 4].isdigit():
            out.append(int(raw[i + 1 : i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode("utf-8", "surrogateescape")


def split_lines(text: str) -> Iterator[tuple[list[str], list[str]]]:
    """(fields before " - ", fields after it) of each line: mount point at
    [0][4], device at [0][2]; fstype, source, super options at [1][0:3]."""
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        yield left.split(), right.split()


def hint_socket(mountpoint: str | os.PathLike[str], uid: int | None = None) -> Path:
    """Where the daemon of `mountpoint` listens for hints."""
    key = os.path.normpath(os.path.abspath(mountpoint))
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    user = os.geteuid() if uid is None else uid
    return Path(f"/tmp/datamount-{user}") / f"{digest}.sock"
