"""Names that cannot cross between a local disk and Azure blob storage.

Upload: a local name that is not valid UTF-8 (Linux allows any bytes; blob
names are UTF-8) stops `datamount upload` before any request, exit 2, with
one line naming the path (its bad bytes shown as `\\xff`); nothing is
uploaded, not even the valid files beside it. Download: a blob name with a
part longer than a local file name (255 bytes) stops the download, exit 3,
one line naming the blob and why. Real files on disk, real Azurite.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from datamount.storage.memory import MemoryStore
from datamount.transfer.source import UnsafeName, safe_relative
from datamount.transfer.uploader import BadName, Uploader, UploadOptions
from fuse_helpers import datamount, mount_env

DEST = "azureml://datastores/store/paths/up/"


def make(path: bytes, body: bytes = b"x") -> None:
    """A real file at raw byte path `path` (parents made)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.write(fd, body)
    finally:
        os.close(fd)


def blobs(container) -> list[str]:  # noqa: ANN001
    return sorted(b.name for b in container.list_blobs())


def error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and "unexpected" not in stderr
    return lines[0]


def test_folder_with_a_non_utf8_file_name_uploads_nothing(
    azurite, container, tmp_path: Path
) -> None:  # noqa: ANN001
    env = mount_env(azurite, tmp_path, container.container_name)
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "ok.txt").write_text("fine")
    (src / "z.txt").write_text("fine too")
    make(os.fsencode(src) + b"/a/\xff\xfe.bin")
    out = datamount("upload", str(src), DEST, env=env)
    assert out.returncode == 2, out.stderr
    line = error_line(out.stderr)
    assert f"{src}/a/\\xff\\xfe.bin: the name is not valid UTF-8" in line
    assert "nothing was uploaded" in line
    assert blobs(container) == []


def test_a_bad_folder_name_is_named_once_with_the_count_of_the_others(
    azurite, container, tmp_path: Path
) -> None:  # noqa: ANN001
    env = mount_env(azurite, tmp_path, container.container_name)
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok.txt").write_text("fine")
    root = os.fsencode(src)
    make(root + b"/caf\xe9/one.bin")  # latin-1 'café': a folder name
    make(root + b"/caf\xe9/two.bin")
    make(root + b"/deep/x/\x80.txt")
    out = datamount("upload", str(src), DEST, env=env)
    assert out.returncode == 2, out.stderr
    line = error_line(out.stderr)
    assert f"{src}/caf\\xe9: the name is not valid UTF-8" in line  # the folder, not its files
    assert "(and 1 more such names)" in line
    assert blobs(container) == []


def test_a_single_non_utf8_file(azurite, container, tmp_path: Path) -> None:  # noqa: ANN001
    env = mount_env(azurite, tmp_path, container.container_name)
    bad = os.fsencode(tmp_path) + b"/r\xe9sum\xe9.pdf"
    make(bad)
    out = datamount("upload", os.fsdecode(bad), DEST, env=env)
    assert out.returncode == 2, out.stderr
    assert f"{tmp_path}/r\\xe9sum\\xe9.pdf: the name is not valid UTF-8" in error_line(out.stderr)
    assert blobs(container) == []
    # Renamed to UTF-8, it goes (the message's advice works).
    good = tmp_path / "résumé.pdf"
    os.rename(bad, good)
    out = datamount("upload", str(good), DEST, env=env)
    assert out.returncode == 0, out.stderr
    assert blobs(container) == ["up/résumé.pdf"]


@pytest.mark.unit
def test_the_check_makes_no_request(tmp_path: Path) -> None:
    store = MemoryStore({})
    make(os.fsencode(tmp_path) + b"/src/\xff")
    (tmp_path / "src" / "ok.txt").write_text("fine")
    with pytest.raises(BadName, match="not valid UTF-8"):
        Uploader(store, UploadOptions(threads=2)).upload(tmp_path / "src", "out/")
    assert sum(store.requests.values()) == 0
    assert BadName.exit_code == 2


def test_upload_output_with_a_bad_name_keeps_the_folder_for_a_retry(
    azurite, container, tmp_path: Path
) -> None:  # noqa: ANN001
    env = mount_env(azurite, tmp_path, container.container_name)
    spec = tmp_path / "out.yaml"
    spec.write_text(yaml.safe_dump({"outputs": {"out": {"mode": "upload", "path": DEST}}}))
    folder = tmp_path / "out"
    assert datamount("mount", str(spec), str(folder), env=env).returncode == 0
    (folder / "ok.txt").write_text("fine")
    bad = os.fsencode(folder) + b"/\xff.bin"
    make(bad)
    out = datamount("unmount", str(folder), env=env)
    assert out.returncode == 4, out.stderr  # outputs could not be written (the CLI upload: 2)
    assert "outputs.out: " in out.stderr and "\\xff.bin: the name is not valid UTF-8" in out.stderr
    assert blobs(container) == []
    assert (folder / "ok.txt").exists()
    os.rename(bad, folder / "fixed.bin")
    out = datamount("unmount", str(folder), env=env)
    assert out.returncode == 0, out.stderr
    assert blobs(container) == ["up/fixed.bin", "up/ok.txt"]


# -- download: a blob name that cannot be a local file name -----------------------


def test_download_of_a_blob_with_a_part_longer_than_255_bytes(
    azurite, container, tmp_path: Path
) -> None:  # noqa: ANN001
    env = mount_env(azurite, tmp_path, container.container_name)
    long = "é" * 150  # 150 characters, 300 bytes: a valid blob name, no local file name
    azurite.seed(container, {"in/a.txt": b"a", f"in/{long}/x.bin": b"x", "in/z.txt": b"z"})
    dest = tmp_path / "dest"
    out = datamount("download", "azureml://datastores/store/paths/in/", str(dest), env=env)
    assert out.returncode == 3, out.stderr
    line = error_line(out.stderr)
    assert f"object name 'in/{long}/x.bin' cannot be a local path" in line
    assert "a part is 300 bytes long, a local file name 255 at most" in line
    assert not dest.exists()  # one listing page: checked before anything is written


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("a/../b", "it has a '..' part"),
        ("a/./b", "it has a '.' part"),
        ("a/\x00", "it holds a NUL"),
        ("//", "it is empty"),
        ("x" * 256, "a part is 256 bytes long, a local file name 255 at most"),
    ],
)
def test_unsafe_names_say_why(name: str, why: str) -> None:
    with pytest.raises(UnsafeName) as info:
        safe_relative(name, f"pre/{name}")
    assert str(info.value) == f"object name {'pre/' + name!r} cannot be a local path: {why}"


@pytest.mark.unit
def test_long_but_legal_names_download() -> None:
    assert safe_relative("a//" + "x" * 255) == "a/" + "x" * 255
