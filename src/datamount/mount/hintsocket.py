"""The mount's hint socket: loaders on the node tell the daemon which files
they read next (the channel and its format: data/hints.py), and each batch
goes to the file-ahead prefetcher (read/ahead.py).

The socket lives in /tmp/datamount-<uid>/ (mode 0700, this user's; the
socket itself 0600), so only this user's processes can send hints. A
folder there that is not ours, or not private, disables hints (logged):
nobody else may put a socket in our way.

Threads: one accepting thread ("datamount-hints"), and one short-lived
thread per connection reading its lines.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from datamount.mountinfo import hint_socket

log = logging.getLogger("datamount.hints")

# One batch of 1,000,000 paths of ~60 bytes; longer lines are refused.
MAX_LINE = 64 << 20
IDLE_TIMEOUT = 60.0  # a connection silent this long is closed

Take = Callable[[Sequence[str], bool], None]


class HintServer:
    """Listens at `hint_socket(mountpoint)`; `take(paths, replace)` per batch."""

    def __init__(self, mountpoint: Path, take: Take) -> None:
        self.path = hint_socket(mountpoint)
        self._take = take
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self) -> bool:
        """Listen; False (logged, no hints) when the socket cannot be made."""
        try:
            _private_folder(self.path.parent)
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()  # a crashed daemon's, of this same mount point
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(self.path))
            os.chmod(self.path, 0o600)
            sock.listen(16)
        except OSError as exc:
            log.warning("no hint socket for loaders (%s): %s", self.path, exc)
            return False
        self._sock = sock
        self._thread = threading.Thread(target=self._accept, name="datamount-hints", daemon=True)
        self._thread.start()
        log.info("hint socket for loaders at %s", self.path)
        return True

    def close(self) -> None:
        self._closed = True
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()
        if self._thread is not None:
            self._thread.join(5.0)

    def _accept(self) -> None:
        while not self._closed and self._sock is not None:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(
                target=self._serve, args=(conn,), name="datamount-hints-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(IDLE_TIMEOUT)
            reader = conn.makefile("rb")
            while True:
                try:
                    line = reader.readline(MAX_LINE + 1)
                except OSError:
                    return
                if not line:
                    return
                reply = self._batch(line)
                try:
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except OSError:
                    return
                if len(line) > MAX_LINE:
                    return  # the rest of that line is not a batch

    def _batch(self, line: bytes) -> dict[str, object]:
        if len(line) > MAX_LINE:
            return {"ok": False, "error": f"a hint line is at most {MAX_LINE} bytes"}
        try:
            batch = json.loads(line)
            files = batch["files"]
            replace = bool(batch.get("replace", False))
            if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
                raise TypeError("files must be a list of paths")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return {"ok": False, "error": f'not a hint batch {{"files": [...]}}: {exc}'}
        self._take(files, replace)
        return {"ok": True, "files": len(files)}


def _private_folder(folder: Path) -> None:
    """Make `folder` (mode 0700) or check that an existing one is ours and
    private; OSError otherwise."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise PermissionError(f"{folder} is not a folder of this user")
    if info.st_mode & 0o077:
        raise PermissionError(f"{folder} is open to other users (mode {info.st_mode & 0o777:o})")
