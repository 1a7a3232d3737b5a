"""LocalStore: the ObjectStore over a local directory tree.

Keys are paths relative to `root` (the factory roots the store at '/', so a
key is an absolute path without its leading '/'). Listing walks lazily with
os.scandir, in the same key order an object store uses; the etag is
inode-mtime-size, so a rewritten file is a new version. Writes never leave a
half-written file under its final name: blocks are staged in a hidden
`.datamount.parts.<name>/` directory beside the target and committed by
assembling a hidden temp file and renaming it into place. The MD5 given at
commit/put is kept in a `user.` extended attribute where the filesystem has
them; metadata is not kept (nothing local reads it).

Threads: no shared state; safe from any thread. Reads are positional (pread,
or preadv straight into the caller's buffer).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat as stat_mod
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from datamount.errors import BadRequest, VersionChanged
from datamount.storage.base import ListPage, ObjectInfo, ObjectStore, check_range
from datamount.storage.errormap import translate

HIDDEN = ".datamount."  # temp and part entries; never listed
MD5_XATTR = "user.datamount.content_md5"
COPY_CHUNK = 8 << 20


def etag_of(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


def _read_md5(path: str | int) -> bytes | None:
    try:
        value = os.getxattr(path, MD5_XATTR)
    except OSError:  # no attribute, or a filesystem without user xattrs
        return None
    return value if len(value) == 16 else None


def _write_md5(fd: int, md5: bytes | None) -> None:
    if md5 is not None:
        with contextlib.suppress(OSError):  # best effort: tmpfs < 6.6, some FUSE fs
            os.setxattr(fd, MD5_XATTR, md5)


class LocalStore(ObjectStore):
    def __init__(self, root: Path | str = "/", *, page_size: int = 1000) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.page_size = page_size

    def __repr__(self) -> str:
        return f"LocalStore({self.root!r})"

    def _path(self, key: str) -> str:
        if "\x00" in key or ".." in key.split("/"):
            raise BadRequest(f"invalid key {key!r}")
        return os.path.join(self.root, key.lstrip("/"))

    def _info(self, key: str, st: os.stat_result, path: str) -> ObjectInfo:
        is_dir = stat_mod.S_ISDIR(st.st_mode)
        return ObjectInfo(
            key=key,
            size=0 if is_dir else st.st_size,
            etag=etag_of(st),
            last_modified=st.st_mtime,
            content_md5=None if is_dir else _read_md5(path),
            is_dir=is_dir,
        )

    # -- listing -----------------------------------------------------------

    def _entries(self, dir_key: str, name_prefix: str) -> list[tuple[str, os.DirEntry[str]]]:
        """Entries of one directory matching `name_prefix`, in key order.

        A directory sorts as name + '/', so 'a/b/c' comes after 'a/b.txt'
        exactly as in a blob listing.
        """
        out: list[tuple[str, os.DirEntry[str]]] = []
        try:
            with os.scandir(self._path(dir_key) or "/") as it:
                for entry in it:
                    name = entry.name
                    if name.startswith(HIDDEN) or not name.startswith(name_prefix):
                        continue
                    try:
                        is_dir = entry.is_dir()
                    except OSError:
                        continue
                    out.append((name + "/" if is_dir else name, entry))
        except (FileNotFoundError, NotADirectoryError):
            return []
        out.sort(key=lambda e: e[0])
        return out

    def _walk(
        self, dir_key: str, name_prefix: str, ancestors: frozenset[tuple[int, int]]
    ) -> Iterator[ObjectInfo]:
        for sort_name, entry in self._entries(dir_key, name_prefix):
            key = dir_key + entry.name
            try:
                st = entry.stat()
            except FileNotFoundError:  # removed while we walked
                continue
            if sort_name.endswith("/"):
                ident = (st.st_dev, st.st_ino)
                if ident not in ancestors:  # a symlink loop would never end
                    yield from self._walk(key + "/", "", ancestors | {ident})
            elif stat_mod.S_ISREG(st.st_mode):
                yield self._info(key, st, entry.path)

    def list_pages(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ListPage]:
        if delimiter not in (None, "/"):
            raise BadRequest(f"LocalStore lists with delimiter '/' only, not {delimiter!r}")
        prefix = prefix.lstrip("/")
        cut = prefix.rfind("/") + 1
        dir_key, name_prefix = prefix[:cut], prefix[cut:]
        with translate("list", prefix, store=self.root):
            page = ListPage()
            count = 0
            yielded = False
            if delimiter is None:
                try:
                    top = os.stat(self._path(dir_key))
                    ancestors = frozenset({(top.st_dev, top.st_ino)})
                except OSError:
                    ancestors = frozenset()
                items: Iterator[ObjectInfo | str] = iter(
                    self._walk(dir_key, name_prefix, ancestors)
                )
            else:
                items = self._one_level(dir_key, name_prefix)
            for item in items:
                if isinstance(item, str):
                    page.prefixes.append(item)
                else:
                    page.objects.append(item)
                count += 1
                if count == self.page_size:
                    yield page
                    yielded = True
                    page, count = ListPage(), 0
            if count or not yielded:
                yield page

    def _one_level(self, dir_key: str, name_prefix: str) -> Iterator[ObjectInfo | str]:
        for sort_name, entry in self._entries(dir_key, name_prefix):
            if sort_name.endswith("/"):
                yield dir_key + sort_name
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            if stat_mod.S_ISREG(st.st_mode):
                yield self._info(dir_key + entry.name, st, entry.path)

    # -- reads -------------------------------------------------------------

    def local_path(self, key: str) -> str:
        return self._path(key)

    def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)
        with translate("stat", key, store=self.root):
            return self._info(key, os.stat(path), path)

    def read(self, key: str, offset: int, length: int, *, etag: str | None = None) -> bytes:
        check_range(offset, length)
        path = self._path(key)
        with translate("read", key, store=self.root):
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if etag is not None and etag_of(os.fstat(fd)) != etag:
                    raise VersionChanged(f"read {key!r} failed: file changed", status=412)
                chunks: list[bytes] = []
                got = 0
                while got < length:  # pread of > 2 GiB returns short on Linux
                    chunk = os.pread(fd, length - got, offset + got)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    got += len(chunk)
                # Changed while we read it: the bytes may mix two versions.
                if etag is not None and etag_of(os.fstat(fd)) != etag:
                    raise VersionChanged(f"read {key!r} failed: file changed", status=412)
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            finally:
                os.close(fd)

    def read_into(
        self, key: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        if not isinstance(buffer, memoryview):  # a slice of a bytearray is a copy
            buffer = memoryview(buffer)
        check_range(offset, len(buffer))
        path = self._path(key)
        with translate("read", key, store=self.root):
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if etag is not None and etag_of(os.fstat(fd)) != etag:
                    raise VersionChanged(f"read {key!r} failed: file changed", status=412)
                got, want = 0, len(buffer)
                while got < want:  # preadv of > 2 GiB returns short on Linux
                    n = os.preadv(fd, [buffer[got:]], offset + got)
                    if not n:
                        break
                    got += n
                if etag is not None and etag_of(os.fstat(fd)) != etag:
                    raise VersionChanged(f"read {key!r} failed: file changed", status=412)
                return got
            finally:
                os.close(fd)

    # -- writes ------------------------------------------------------------

    def _temp_beside(self, path: str) -> str:
        head, name = os.path.split(path)
        os.makedirs(head, exist_ok=True)
        return os.path.join(head, f"{HIDDEN}tmp.{name}.{uuid.uuid4().hex}")

    def _parts_dir(self, path: str) -> str:
        head, name = os.path.split(path)
        return os.path.join(head, f"{HIDDEN}parts.{name}")

    def _publish(
        self, key: str, path: str, write: Callable[[int], None], md5: bytes | None
    ) -> ObjectInfo:
        """Write through `write(fd)` into a temp file, then rename it to `path`."""
        tmp = self._temp_beside(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                write(fd)
                _write_md5(fd, md5)
                st = os.fstat(fd)  # rename keeps inode and mtime: the etag holds
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return ObjectInfo(key, st.st_size, etag_of(st), st.st_mtime, _read_md5(path))

    def put(
        self,
        key: str,
        data: bytes,
        *,
        content_md5: bytes | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ObjectInfo:
        path = self._path(key)
        with translate("put", key, store=self.root):
            return self._publish(key, path, lambda fd: _write_all(fd, data), content_md5)

    def stage_block(self, key: str, block_id: str, data: bytes) -> None:
        if not block_id:
            raise BadRequest(f"stage_block {key!r} failed: empty block id")
        path = self._path(key)
        with translate("stage_block", key, store=self.root):
            parts = self._parts_dir(path)
            os.makedirs(parts, exist_ok=True)
            final = os.path.join(parts, block_id.encode().hex())
            tmp = f"{final}.{uuid.uuid4().hex}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, final)

    def commit_blocks(
        self,
        key: str,
        block_ids: list[str],
        *,
        content_md5: bytes | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ObjectInfo:
        path = self._path(key)
        parts = self._parts_dir(path)
        sources = [os.path.join(parts, b.encode().hex()) for b in block_ids]
        with translate("commit_blocks", key, store=self.root):
            missing = [
                b for b, src in zip(block_ids, sources, strict=True) if not os.path.isfile(src)
            ]
            if missing:
                raise BadRequest(
                    f"commit_blocks {key!r} failed: block {missing[0]!r} was not staged"
                )

            def assemble(fd: int) -> None:
                with open(fd, "wb", closefd=False) as out:
                    for src in sources:
                        with open(src, "rb") as f:
                            shutil.copyfileobj(f, out, COPY_CHUNK)

            info = self._publish(key, path, assemble, content_md5)
            shutil.rmtree(parts, ignore_errors=True)
            return info

    def delete(self, key: str) -> None:
        path = self._path(key)
        with translate("delete", key, store=self.root):
            os.unlink(path)

    def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        src = self._path(src_key)
        dst = self._path(dst_key)
        with translate("copy", src_key, store=self.root):
            md5 = _read_md5(src)
            with open(src, "rb") as f:

                def write(fd: int) -> None:
                    with open(fd, "wb", closefd=False) as out:
                        shutil.copyfileobj(f, out, COPY_CHUNK)

                return self._publish(dst_key, dst, write, md5)

    def close(self) -> None:
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
