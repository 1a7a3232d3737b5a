"""The cache is private: datamount.private's folders (0700) and files (0600)
whatever the umask, and a cache folder open to others tightened by every
command, one of another user refused with one line."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from datamount import private
from datamount.log import setup_logging, shutdown_logging
from datamount.transfer.manifest import MANIFEST_NAME, Manifest
from fuse_helpers import Mounts, datamount, mount_env, mounted, spec_file

NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """umask 0: what is private is private by its own mode, not the umask's."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.unit
def test_folders_files_and_text_are_private_whatever_the_umask(
    tmp_path: Path, open_umask: None
) -> None:
    made = private.folders(tmp_path / "a" / "b" / "c")
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o700] * 3
    (tmp_path / "open").mkdir(0o755)
    private.folders(tmp_path / "open")  # an existing folder is left as it is
    assert mode(tmp_path / "open") == 0o755
    os.close(private.create(made / "f"))
    assert mode(made / "f") == 0o600
    private.write_text(made / "t.json", "{}\n")
    assert (made / "t.json").read_text() == "{}\n" and mode(made / "t.json") == 0o600
    assert sorted(p.name for p in made.iterdir()) == ["f", "t.json"]  # no temp file left
    (made / "file").write_text("x")
    with pytest.raises(FileExistsError):
        private.folders(made / "file")


@pytest.mark.unit
def test_tighten_drops_group_and_other_bits(tmp_path: Path) -> None:
    path = tmp_path / "old.log"
    path.write_text("x")
    os.chmod(path, 0o664)
    private.tighten(path)
    assert mode(path) == 0o600
    private.tighten(tmp_path / "missing")  # nothing to do


@pytest.mark.unit
def test_private_root_tightens_an_open_folder_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o755)
    with caplog.at_level(logging.WARNING, logger="datamount.private"):
        private.private_root(cache)
        private.private_root(cache)  # private already: no second line
    assert mode(cache) == 0o700
    assert [r.getMessage() for r in caplog.records] == [
        f"cache folder {cache} was open to other users (mode 0755): now 0700"
    ]


@pytest.mark.unit
def test_private_root_refuses_a_folder_of_another_user(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("needs root (to give the folder to nobody)")
    cache = tmp_path / "theirs"
    cache.mkdir(0o700)
    os.chown(cache, NOBODY, NOBODY)
    with pytest.raises(private.NotPrivate) as caught:
        private.private_root(cache)
    assert str(caught.value) == (
        f"{cache} belongs to uid {NOBODY}, not to this user (uid 0); the cache must be "
        "private: choose another (--cache-dir, DATAMOUNT_CACHE_DIR)"
    )


@pytest.mark.unit
def test_log_files_are_private(tmp_path: Path, open_umask: None) -> None:
    logs = tmp_path / "logs"
    files = setup_logging(logs)
    try:
        logging.getLogger("datamount.test").info("a line")
    finally:
        shutdown_logging()
    assert mode(logs) == 0o700
    assert (mode(files.capability), mode(files.runtime)) == (0o600, 0o600)
    os.chmod(files.runtime, 0o644)  # as an older version left it
    setup_logging(logs)
    shutdown_logging()
    assert mode(files.runtime) == 0o600


@pytest.mark.unit
def test_manifest_in_the_cache_is_private_in_the_target_not(
    tmp_path: Path, open_umask: None
) -> None:
    cached = Manifest(tmp_path / "target", "src", folder=tmp_path / "cache" / "manifests")
    cached.open()
    cached.record("a", 1, "e")
    cached.close()
    assert mode(tmp_path / "cache") == 0o700 and mode(tmp_path / "cache" / "manifests") == 0o700
    assert mode(cached.path) == 0o600
    own = Manifest(tmp_path / "target", "src")
    own.open()
    own.close()
    assert mode(tmp_path / "target") == 0o777  # the user's own folder: the umask (0) decides
    assert mode(tmp_path / "target" / MANIFEST_NAME) == 0o666


# -- at every command -------------------------------------------------------


@pytest.mark.slow
def test_download_tightens_an_old_open_cache_and_refuses_another_users(tmp_path: Path) -> None:
    """Not only `mount`: a download (its resume manifests are in the cache)
    tightens a cache an older version left 0755, with the line in its log,
    and writes nothing into another user's."""
    (source := tmp_path / "src").mkdir()
    (source / "a.txt").write_bytes(b"a")
    cache = tmp_path / "cache"
    cache.mkdir(0o755)
    os.chmod(cache, 0o755)
    env = {**os.environ, "DATAMOUNT_CACHE_DIR": str(cache)}
    out = datamount("download", str(source), str(tmp_path / "dl"), env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "dl" / "a.txt").read_bytes() == b"a"
    assert mode(cache) == 0o700
    log = (cache / "logs" / "datamount-runtime.log").read_text()
    assert f"cache folder {cache} was open to other users (mode 0755): now 0700" in log
    other = tmp_path / "other"
    other.mkdir(0o700)
    os.chown(other, NOBODY, NOBODY)
    env["DATAMOUNT_CACHE_DIR"] = str(other)
    out = datamount("download", str(source), str(tmp_path / "dl2"), env=env, cwd=tmp_path)
    assert (out.returncode, out.stdout) == (3, "")
    assert out.stderr == (
        f"datamount: error: cache folder {other} belongs to uid {NOBODY}, not to this user "
        "(uid 0); the cache must be private: choose another (--cache-dir, DATAMOUNT_CACHE_DIR)\n"
    )
    assert sorted(other.iterdir()) == [] and not (tmp_path / "dl2").exists()


# -- at mount -----------------------------------------------------------------


@pytest.mark.fuse
def test_mount_tightens_an_open_cache_folder(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"ds/a.txt": b"a"})
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o755)
    env = mount_env(azurite, tmp_path, container.container_name)
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/ds/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert (mp / "a.txt").read_bytes() == b"a"
    assert mode(cache) == 0o700
    log = (cache / "logs" / "datamount-runtime.log").read_text()
    assert f"cache folder {cache} was open to other users (mode 0755): now 0700" in log
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert not mounted(mp)


@pytest.mark.fuse
def test_mount_refuses_a_cache_folder_of_another_user(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    cache = tmp_path / "cache"
    cache.mkdir(0o700)
    os.chown(cache, NOBODY, NOBODY)
    env = mount_env(azurite, tmp_path, container.container_name)
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/ds/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert (out.returncode, out.stdout) == (3, "")
    assert out.stderr == (
        f"datamount: error: cache folder {cache} belongs to uid {NOBODY}, not to this user "
        "(uid 0); the cache must be private: choose another (--cache-dir, DATAMOUNT_CACHE_DIR)\n"
    )
    assert not mounted(mp) and not mp.exists()
    assert sorted(cache.iterdir()) == []  # nothing written there, not even the logs
