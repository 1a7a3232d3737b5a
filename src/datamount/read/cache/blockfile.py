"""The disk tier's block files (disk.py keeps the index, the queue and the
bound): the file format, its name, and writing and reading one file.

File format (FORMAT_VERSION 2): HEADER (magic, version, lengths of the UTF-8
store/key/etag, block index, object size, data length, XXH3-64 of the data),
then store, key and etag, then the data: compact (right after the header) or
paged (header and data each zero-padded to whole pages); the file size tells
which (`layout`). `read` checks every field against the key asked for, the
file size and the checksum: anything else is None (the caller removes it).

Writing: an unnamed O_TMPFILE file in `root/tmp`, linked under its final name
once whole (linkat of /proc/self/fd/N), so a final name never holds a torn
block and a killed process leaves no temp file; where O_TMPFILE is refused, a
named `tmp/<name>.<tid>.tmp` renamed into place. Every file is 0600 and
every folder 0700 (datamount.private: the cache is private). Blocks of DIRECT_MIN bytes
and more are written paged, with one O_DIRECT write (why O_DIRECT, and why
paged: docs/design/cache.md, "O_DIRECT block files"): a page-aligned block
(fetched blocks are) is sent from its own buffer in a pwritev between a
per-thread header page and its last partial page; another block is first
copied into a per-thread aligned buffer. Smaller blocks, and every block
where O_DIRECT is refused (tmpfs), are written compact and buffered. Paths
are plain strings, not pathlib (the same section).

Threads: any; `direct`, `tmpfile` and `vectored` are one-way flags (True at
start, cleared once on refusal); the buffer is per thread. No lock.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import logging
import mmap
import os
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import xxhash

from datamount.private import FILE_MODE, folders
from datamount.read.blocks import BlockData, BlockKey, ObjectId
from datamount.read.copy import PAGE, copy_into, page_aligned, write_file

log = logging.getLogger("datamount.read.cache.disk")

MAGIC = b"DMBLOCK\n"
# 2: the checksum is XXH3-64 (version 1 had zlib.crc32).
# Why XXH3: docs/design/cache.md ("Checksum: XXH3 instead of crc32").
FORMAT_VERSION = 2
# magic, format version, len(store), len(key), len(etag), block index, object size,
# data length, xxh3_64(data); then store, key, etag (UTF-8), then the data.
HEADER = struct.Struct("<8sHIIIQQQQ")
SUFFIX = ".blk"
TMP_DIR = "tmp"
ALIGN = PAGE  # O_DIRECT alignment of buffer address, offset and length (the page size)
DIRECT_MIN = 64 << 10  # below this a buffered write is as cheap


def identity(obj: ObjectId) -> tuple[bytes, bytes, bytes]:
    def utf8(text: str) -> bytes:
        return text.encode("utf-8", "surrogatepass")

    return utf8(obj.store), utf8(obj.key), utf8(obj.etag)


class CachedBlocks(NamedTuple):
    """Where the disk tier keeps the blocks of one object version, for a
    reader outside Python (the native FUSE loop, fs/_lowlevel.c): block i of
    the object is `paths[i]`, a file in this module's format whose header
    must name exactly `store`, `key` and `etag` (UTF-8) and whose data must
    match its checksum, else the block is read through Python."""

    block_size: int
    size: int
    store: bytes
    key: bytes
    etag: bytes
    paths: tuple[str, ...]


def block_names(obj: ObjectId, block_size: int) -> list[str]:
    """The file names of every block of `obj` (not through block_name's cache)."""
    return [_block_name(BlockKey(obj, i)) for i in range(-(-obj.size // block_size))]


def _block_name(key: BlockKey) -> str:
    """The file name (without suffix) of a block: a hash of its full identity."""
    parts = identity(key.obj)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(struct.pack("<IIIQQ", *map(len, parts), key.index, key.obj.size))
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


# get, put and the writer each ask for it
block_name = functools.lru_cache(maxsize=4096)(_block_name)


def encode_header(key: BlockKey, data: BlockData) -> bytes:
    store, name, etag = identity(key.obj)
    lengths = (len(store), len(name), len(etag))
    fields = (key.index, key.obj.size, len(data), checksum(data))
    return HEADER.pack(MAGIC, FORMAT_VERSION, *lengths, *fields) + store + name + etag


def header_size(obj: ObjectId) -> int:
    """The length of `encode_header` for a block of `obj`."""
    return HEADER.size + sum(map(len, identity(obj)))


def checksum(data: BlockData) -> int:
    """The XXH3-64 of a block's data, as its header keeps it."""
    return xxhash.xxh3_64_intdigest(data)


def read(path: str, key: BlockKey) -> tuple[bytes, int] | None:
    """(data, file size), or None when the file is not exactly this block.
    Two preads on a raw fd: no file object, no read-ahead buffer."""
    store, name, etag = identity(key.obj)
    ident = store + name + etag
    fd = os.open(path, os.O_RDONLY)
    try:
        file_size = os.fstat(fd).st_size
        head = os.pread(fd, HEADER.size + len(ident), 0)
        if len(head) < HEADER.size:
            return None
        magic, version, n_store, n_name, n_etag, index, size, length, crc = HEADER.unpack_from(head)
        expected = (MAGIC, FORMAT_VERSION, len(store), len(name), len(etag))
        if (magic, version, n_store, n_name, n_etag) != expected:
            return None
        if (index, size) != (key.index, key.obj.size):
            return None
        offset = _data_offset(file_size, len(head), length)
        if offset < 0 or head[HEADER.size :] != ident:
            return None
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    if len(data) != length or checksum(data) != crc:
        return None
    return data, file_size


class BlockFiles:
    """The block files under `root` (which exists, with its `tmp/` folder)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.prefix = f"{os.fspath(root)}/"
        self._tmp = f"{self.prefix}{TMP_DIR}"
        self.direct = hasattr(os, "O_DIRECT")  # cleared where the filesystem refuses it
        self.tmpfile = hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")
        self.vectored = True  # O_DIRECT from a page-aligned block's own buffer; cleared on EINVAL
        # os.link follows the /proc/self/fd link only as linkat, with a folder fd.
        self._root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        self._local = threading.local()  # each writer's aligned buffer

    def path(self, name: str) -> str:
        return f"{self.prefix}{name[0:2]}/{name}{SUFFIX}"

    def close(self) -> None:
        """After the last write."""
        fd, self._root_fd = self._root_fd, -1
        if fd >= 0:
            os.close(fd)

    def write(self, name: str, header: bytes, data: BlockData) -> int:
        """The block's file, whole under its final name, or OSError and nothing
        left. Returns the file's size."""
        rel = f"{name[0:2]}/{name}{SUFFIX}"
        if self.tmpfile:  # the usual way in one call without the GIL (read/copy.py)
            direct = self.direct and len(header) + len(data) >= DIRECT_MIN
            pieces = self._pieces(direct, header, data)
            if write_file(self._tmp, direct, pieces, self._root_fd, rel) == 0:
                return layout(len(header), len(data), direct)[1]
            # Refused (a folder's first block, a filesystem without O_DIRECT...):
            # the steps below meet the same refusal and know what to do of it.
        tmp: str | None = None  # the named temp file, where O_TMPFILE is refused
        try:
            fd, tmp, direct = self._create(name, len(header) + len(data) >= DIRECT_MIN)
            try:
                self._fill(fd, direct, header, data)
                if tmp is None:
                    self._publish(f"/proc/self/fd/{fd}", rel, os.link)
            finally:
                os.close(fd)
            if tmp is not None:
                self._publish(tmp, rel, os.replace)
            return layout(len(header), len(data), direct)[1]
        except OSError:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise

    def _create(self, name: str, want_direct: bool) -> tuple[int, str | None, bool]:
        """A new file to write the block into: (fd, its temp name or None for
        an unnamed O_TMPFILE one, whether it is O_DIRECT)."""
        direct = want_direct and self.direct
        while True:
            flags = os.O_WRONLY | (os.O_DIRECT if direct else 0)
            try:
                if self.tmpfile:
                    try:
                        return os.open(self._tmp, flags | os.O_TMPFILE, FILE_MODE), None, direct
                    except OSError as exc:
                        if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR):
                            raise
                        log.info("disk cache: O_TMPFILE unavailable in %s", self.root)
                        self.tmpfile = False
                tmp = f"{self._tmp}/{name}.{threading.get_ident()}.tmp"
                return os.open(tmp, flags | os.O_CREAT | os.O_TRUNC, FILE_MODE), tmp, direct
            except OSError as exc:
                if not direct or exc.errno != errno.EINVAL:
                    raise
                log.info("disk cache: O_DIRECT unavailable in %s: buffered writes", self.root)
                self.direct = direct = False

    def file_size(self, header: int, data: int) -> int:
        """The bytes a block file of `header` + `data` bytes takes (its layout)."""
        return layout(header, data, data + header >= DIRECT_MIN and self.direct)[1]

    def _fill(self, fd: int, direct: bool, header: bytes, data: BlockData) -> None:
        """Write the block from offset 0 (`_pieces`)."""
        pieces = self._pieces(direct, header, data)
        try:
            _writev_all(fd, pieces, 0)
        except OSError as exc:
            if not (direct and self.vectored and len(pieces) > 1 and exc.errno == errno.EINVAL):
                raise
            # A device whose O_DIRECT wants more than page alignment per segment.
            log.info("disk cache: O_DIRECT refuses a block's own buffer in %s: copies", self.root)
            self.vectored = False
            self._fill(fd, direct, header, data)

    def _pieces(self, direct: bool, header: bytes, data: BlockData) -> list[memoryview]:
        """What a block file holds from offset 0: compact, or with `direct`
        paged, for one O_DIRECT write. A page-aligned block (every fetched
        block: read/copy.py `empty`) goes as it is, between this thread's
        aligned header page and a copy of its last partial page; any other
        is copied whole into this thread's aligned buffer first. The padding
        is zeroed: no bytes of an earlier block."""
        if not direct:
            return [v for v in (memoryview(header), memoryview(data)) if v]
        offset, total = layout(len(header), len(data), True)
        whole = len(data) // ALIGN * ALIGN if self.vectored and page_aligned(data) else 0
        staged = total - whole  # header page + the data's pages not sent as they are
        buf = self._buffer(staged)
        buf[: len(header)] = header
        buf[len(header) : offset] = bytes(offset - len(header))
        end = offset + len(data) - whole
        copy_into(buf[offset:end], data[whole:])  # without the GIL (read/copy.py)
        buf[end:staged] = bytes(staged - end)
        if not whole:
            return [buf[:staged]]
        views = [buf[:offset], memoryview(data)[:whole], buf[offset:staged]]
        return [v for v in views if v]

    def _publish(self, src: str, rel: str, how: Callable[..., None]) -> None:
        """Give the written file its final name `rel` (under the root): `how`
        is os.link (of an O_TMPFILE's /proc/self/fd path) or os.replace."""
        fd = self._root_fd
        try:
            how(src, rel, dst_dir_fd=fd)
        except FileNotFoundError:  # the folder's first block (no mkdir per block)
            folders(f"{self.prefix}{rel[0:2]}")
            how(src, rel, dst_dir_fd=fd)
        except FileExistsError:  # link only: a file the index did not know; ours wins
            os.unlink(rel, dir_fd=fd)
            how(src, rel, dst_dir_fd=fd)

    def _buffer(self, size: int) -> memoryview:
        """This thread's page-aligned buffer (mmap), at least `size` bytes."""
        buf: memoryview | None = getattr(self._local, "buf", None)
        if buf is None or len(buf) < size:
            buf = self._local.buf = memoryview(mmap.mmap(-1, -(-size // ALIGN) * ALIGN))
        return buf


def _pages(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def layout(header: int, data: int, paged: bool) -> tuple[int, int]:
    """(offset of the data, file size) of a block file of `header` + `data`
    bytes, compact or paged."""
    if paged:
        return _pages(header), _pages(header) + _pages(data)
    return header, header + data


def _data_offset(file_size: int, header: int, data: int) -> int:
    """Where the data starts in a file of `file_size` bytes (the size says
    which layout it has), or -1 when it fits neither."""
    for paged in (False, True):
        offset, size = layout(header, data, paged)
        if size == file_size:
            return offset
    return -1


def _writev_all(fd: int, views: list[memoryview], offset: int) -> None:
    """pwritev of `views` at `offset`, again from where a short write stopped."""
    while views:
        n = os.pwritev(fd, views, offset)
        if not n:
            raise OSError(errno.EIO, "pwritev wrote nothing")
        offset += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views = views[1:]
        if n:
            views = [views[0][n:], *views[1:]]
