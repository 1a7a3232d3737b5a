"""Loader hints: tell the mount daemon serving a folder which of its files
this process reads next, in order, so it fetches them ahead (read/ahead.py).

The channel (datamount's own extension, no Azure ML counterpart): a Unix
stream socket per mount, `hint_socket(mountpoint)` =
/tmp/datamount-<uid>/<sha256(mount point)[:16]>.sock (a folder of mode
0700 of the daemon's user; the daemon also records the path in its state
file, `hints_socket`). A client sends one JSON line per batch,
`{"files": ["rel/path", ...], "replace": false}` (paths relative to the
mount root, in reading order; `replace`: forget the earlier hints), and the
daemon answers one line, `{"ok": true, "files": N}` or
`{"ok": false, "error": "..."}`, once the batch is queued.

`hint(root, files)` finds the datamount mount holding `root` (the deepest
`fuse.datamount` entry of /proc/self/mountinfo) and sends the batch; it
does nothing (False) for a folder outside a mount, or when the daemon does
not answer: hints only speed reads up. No threads.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Iterable
from pathlib import Path

from datamount.mountinfo import FSTYPE, hint_socket, split_lines, unescape

log = logging.getLogger("datamount.hints")

SEND_TIMEOUT = 2.0  # seconds: a daemon that does not answer by then is skipped


def datamount_mounts(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[tuple[str, int]]:
    """(mount point, user id of the daemon) of every datamount mount."""
    try:
        text = mountinfo.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return []
    found = []
    for fields, tail in split_lines(text):
        if len(fields) < 5 or len(tail) < 3 or tail[0] != FSTYPE:
            continue
        options = dict(o.partition("=")[::2] for o in tail[2].split(","))
        uid = options.get("user_id", "")
        found.append((unescape(fields[4]), int(uid) if uid.isdigit() else os.geteuid()))
    return found


def mount_of(path: str | os.PathLike[str]) -> tuple[Path, Path] | None:
    """(mount point, the path relative to it) of the datamount mount holding
    `path`, or None."""
    target = os.path.realpath(path)
    best: tuple[str, int] | None = None
    for point, uid in datamount_mounts():
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best[0])):
            best = (point, uid)
    if best is None:
        return None
    return Path(best[0]), Path(os.path.relpath(target, best[0]))


def hint(root: str | os.PathLike[str], files: Iterable[str], *, replace: bool = False) -> bool:
    """Tell the daemon serving `root` that this process reads `files`
    (relative to `root`, in this order) next. True when a daemon took them;
    False (and nothing sent) when `root` is not inside a datamount mount."""
    found = mount_of(root)
    if found is None:
        return False
    mountpoint, rel = found
    base = "" if str(rel) == "." else rel.as_posix().strip("/") + "/"
    paths = [base + str(f).strip("/") for f in files]
    uid = next((u for p, u in datamount_mounts() if p == str(mountpoint)), None)
    return send(hint_socket(mountpoint, uid), paths, replace=replace)


def send(sock_path: Path, paths: list[str], *, replace: bool = False) -> bool:
    """One batch to the socket at `sock_path`; True when the daemon took it."""
    line = json.dumps({"files": paths, "replace": replace}) + "\n"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(SEND_TIMEOUT)
            conn.connect(str(sock_path))
            conn.sendall(line.encode("utf-8", "surrogateescape"))
            answer = conn.makefile("rb").readline()
        reply = json.loads(answer or b"{}")
    except (OSError, ValueError) as exc:
        log.debug("no hint sent to %s: %s", sock_path, exc)
        return False
    return bool(isinstance(reply, dict) and reply.get("ok"))
