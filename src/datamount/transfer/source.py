"""What a download copies: the objects under a location, streamed page by
page, each with the local relative path it lands at.

Pure listing logic over a ReadableStore: no threads, no writes.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass

from datamount.errors import DataError, ObjectNotFound
from datamount.storage.base import ObjectInfo, ReadableStore

log = logging.getLogger("datamount.transfer.source")


@dataclass(frozen=True)
class SourceFile:
    key: str  # object key in the store
    rel: str  # relative local path ('/'-separated, validated: no '..', no absolute)
    size: int
    etag: str


class UnsafeName(DataError):
    """An object name that cannot be a local path under the destination."""


NAME_MAX = 255  # bytes in one local path component (Linux); a blob name may hold 1,024 chars


def safe_relative(name: str, key: str | None = None) -> str:
    """`name` (the part of blob `key` below the source) as a relative path
    that stays under the destination.

    Doubled slashes collapse (blob stores allow 'a//b'); '.' and '..'
    segments, NUL and a part longer than a local file name are refused, with
    the reason and the blob's whole name.
    """
    parts = [p for p in name.split("/") if p]
    why = "" if parts else "it is empty"
    for p in parts:
        if p in (".", ".."):
            why = f"it has a {p!r} part"
        elif "\x00" in p:
            why = "it holds a NUL"
        elif len(p.encode()) > NAME_MAX:
            why = f"a part is {len(p.encode())} bytes long, a local file name {NAME_MAX} at most"
        if why:
            break
    if why:
        raise UnsafeName(f"object name {key or name!r} cannot be a local path: {why}")
    return "/".join(parts)


def is_folder_marker(obj: ObjectInfo) -> bool:
    """A 0-byte object standing for a folder (ADLS / portal 'folders', 'x/' names)."""
    return obj.is_dir or (obj.size == 0 and obj.key.endswith("/"))


def shown(store: ReadableStore, key: str) -> str:
    """`key` as the user wrote it: a local store's file path (its keys drop
    the root's '/'), else the key itself."""
    return store.local_path(key) or key or "(root)"


def folder_prefix(key: str) -> str:
    return key if key == "" or key.endswith("/") else key + "/"


def single_file(store: ReadableStore, key: str) -> SourceFile:
    """The one object of a uri_file input; it lands under its own base name."""
    if not key or key.endswith("/"):
        raise DataError(f"{shown(store, key)}: a uri_file path must name a file, not a folder")
    info = store.stat(key)
    if info.is_dir:
        raise DataError(f"{shown(store, key)}: is a folder; declare the input as uri_folder")
    return SourceFile(key, safe_relative(posixpath.basename(key), key), info.size, info.etag)


def folder_pages(store: ReadableStore, key: str) -> Iterator[list[SourceFile]]:
    """The files under folder `key`, one list per listing page (lazily, one
    page behind the listing: the last list also carries the held files).

    An empty result is ObjectNotFound unless a folder marker proves the
    folder exists (then the download is simply empty).
    """
    prefix = folder_prefix(key)
    seen_any = False
    # A blob 'x' next to blobs 'x/...' cannot be both a file and a folder on
    # disk: the folder wins (as in the mount). Keys arrive sorted, so a file is
    # held until a key past 'x/' shows it is not shadowed.
    held: list[SourceFile] = []
    previous: list[SourceFile] | None = None  # yielded one page late: the last takes `held`
    for page in store.list_pages(prefix):
        files = []
        for obj in page.objects:
            seen_any = True
            if is_folder_marker(obj) or not obj.key.startswith(prefix):
                continue
            src = SourceFile(
                obj.key, safe_relative(obj.key[len(prefix) :], obj.key), obj.size, obj.etag
            )
            still = []
            for h in held:
                if src.rel.startswith(h.rel + "/"):
                    log.warning("%s: a folder of the same name exists; skipping the file", h.key)
                elif src.rel > h.rel + "/":
                    files.append(h)
                else:
                    still.append(h)
            held = [*still, src]
        if previous is not None:
            yield previous
        previous = files
    yield [*(previous or []), *held]
    if not seen_any and not _exists_as_folder(store, key):
        raise ObjectNotFound(f"{shown(store, key)}: no such folder")


def _exists_as_folder(store: ReadableStore, key: str) -> bool:
    if not key.strip("/"):
        return True  # a container root exists if listing it worked
    try:
        info = store.stat(key.rstrip("/"))
    except ObjectNotFound:
        return False
    if not info.is_dir:
        raise DataError(f"{shown(store, key)}: is a file; declare the input as uri_file")
    return True
