"""Files and folders only their owner reads: the modes of the cache.

The cache holds other people's data (blocks and whole copies of private
blobs, staged output, manifests, mount state, logs), so everything datamount
writes there is private: folders 0700 (FOLDER_MODE), files 0600 (FILE_MODE),
whatever the umask (a umask only takes bits away). The user's own download
targets are not written through here: they keep the umask's modes.

- `folders(path)`: `mkdir -p` where each folder it creates is 0700.
- `create(path, flags)`: `os.open` of a file created 0600.
- `write_text(path, text)`: a file written whole (temp + rename), 0600.
- `private_root(path)`: the cache folder itself, made 0700; one that exists
  and is open to others is tightened to 0700 (one WARNING line), one of
  another user is refused (NotPrivate, one line); `refuse_foreign(path)`,
  that refusal alone, before anything is written there.

No threads, no state.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from pathlib import Path

log = logging.getLogger("datamount.private")

FOLDER_MODE = 0o700
FILE_MODE = 0o600
OPEN_BITS = 0o077  # group and other: none of them in the cache


class NotPrivate(PermissionError):
    """A cache folder that is not ours: refused."""


def folders(path: Path | str) -> Path:
    """Create `path` and its missing parents, each one 0700; an existing folder
    is left as it is (FileExistsError when a file is in the way)."""
    path = Path(path)
    missing: list[Path] = []
    here = path
    while not os.path.lexists(here):  # a file part way up: ENOTDIR on its child
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, FOLDER_MODE)
        except FileExistsError:
            if not folder.is_dir():
                raise
    if not path.is_dir():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
    return path


def create(path: Path | str, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """`os.open(path, flags)`, a file it creates 0600 (close-on-exec)."""
    return os.open(path, flags | os.O_CLOEXEC, FILE_MODE)


def write_text(path: Path, text: str) -> None:
    """Write `path` whole, 0600: a temp file beside it renamed over it, so a
    reader sees the old or the new text, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = create(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def tighten(path: Path | str) -> None:
    """Drop the group and other bits of an existing file of ours (a file an
    older version left 0644); nothing when it is not there or not ours."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    if info.st_mode & OPEN_BITS and info.st_uid == os.geteuid():
        os.chmod(path, stat.S_IMODE(info.st_mode) & ~OPEN_BITS)


def refuse_foreign(path: Path | str) -> None:
    """NotPrivate when the cache folder `path` exists and belongs to another
    user; nothing is created (so nothing is written into that folder)."""
    try:
        info = os.stat(path)
    except OSError:
        return
    _ours(Path(path), info)


def _ours(path: Path, info: os.stat_result) -> None:
    if info.st_uid != os.geteuid():
        raise NotPrivate(
            f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()}); "
            "the cache must be private: choose another (--cache-dir, DATAMOUNT_CACHE_DIR)"
        )


def private_root(path: Path | str) -> Path:
    """The cache folder `path`, created 0700, or checked: another user's
    folder is refused (NotPrivate), one of ours open to others is
    tightened to 0700 and said so in one WARNING line. What an older version
    left inside keeps its modes, but nobody else can reach it any more."""
    path = folders(path)
    info = path.stat()
    _ours(path, info)
    mode = stat.S_IMODE(info.st_mode)
    if mode & OPEN_BITS:
        os.chmod(path, FOLDER_MODE)
        log.warning("cache folder %s was open to other users (mode %04o): now %04o",
                    path, mode, FOLDER_MODE)  # fmt: skip
    return path
