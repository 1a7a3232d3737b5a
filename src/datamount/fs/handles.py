"""The handles the filesystem ops hand out and keep: what `open` returns,
one open file of the handle table, and one open directory's entry stream.

Threads: any FUSE thread; a DirStream serialises the requests of its one
directory handle (its own lock), the rest are plain values.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from datamount.read.blocks import ObjectId
from datamount.read.reader import ReadHandle


@dataclass(frozen=True)
class Opened:
    """What `open` returns: the handle id, and whether the kernel may keep the
    pages it cached for this file (the pinned version is the one it saw)."""

    fh: int
    keep_cache: bool


@dataclass
class OpenFile:
    """One open file handle: the path it was opened by, the handle its reads
    go to, and the blob version it pinned (None: it reads no blob version,
    e.g. a staged file of an rw mount). `handle` may be replaced once, by a
    local copy of that version (`fs.kept`), when the mount deletes the blob."""

    path: str
    handle: ReadHandle
    obj: ObjectId | None = None
    mtime: float = 0.0  # of the version opened


class DirStream:
    """One open directory: the entries received so far, and the rest of the
    listing still to come. `entries(offset)` replays what it has and pulls
    further pages only when the caller gets that far, so the first entries
    are served while later pages have not been requested yet."""

    def __init__(self, source: Iterator[tuple[str, dict[str, int]]], dot: dict[str, int]) -> None:
        self._lock = threading.Lock()
        self._seen: list[tuple[str, dict[str, int]]] = [(".", dot), ("..", dot)]
        self._source: Iterator[tuple[str, dict[str, int]]] | None = source
        self._error: OSError | None = None  # a failed page fails every later call too

    def entries(self, offset: int) -> Iterator[tuple[str, dict[str, int], int]]:
        """(name, stat, offset of the next entry) from entry number `offset` on."""
        i = offset
        while True:
            with self._lock:  # one request at a time per directory handle
                if i >= len(self._seen) and self._error is not None:
                    raise self._error
                if i >= len(self._seen) and self._source is not None:
                    try:
                        self._seen.append(next(self._source))
                    except StopIteration:
                        self._source = None
                    except OSError as exc:
                        self._source, self._error = None, exc
                        raise
                if i >= len(self._seen):
                    return
                name, st = self._seen[i]
            # Yield outside the lock: the caller may stop here for good.
            yield name, st, i + 1
            i += 1
