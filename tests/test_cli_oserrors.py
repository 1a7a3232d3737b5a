"""Every command driven into the OSErrors a local disk really gives, through the
installed `datamount` script: each ends with exactly one `datamount: error:`
line (a `warning:` line about the logs may come before it), never "unexpected"
nor a traceback, with the documented exit code (3: data could not be
prepared; 4: outputs could not be written), and leaves no `.part` file, no
mount and no folder it had no reason to create.

The errors are real: EROFS from a tmpfs remounted read-only, ENOSPC from a tiny
tmpfs, ENAMETOOLONG from a 300-byte path component, ENOTDIR from a file where
a folder is expected. EACCES cannot be made for real here: the tests run as
root, whom file modes do not stop (the read-only tmpfs stands in for it). The
tmpfs mounts need root too; every one is unmounted in a finally. Sources and
destinations are local paths, so no Azurite and no FUSE mount is involved.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from datamount.transfer.partfile import disk_free
from datamount.transfer.progress import human
from fuse_helpers import EXE, mounted

pytestmark = pytest.mark.slow

LONG = "x" * 300  # NAME_MAX is 255 bytes


def cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EXE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def one_error(result: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """The one error line (after any warning lines), checked; returns it."""
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("datamount: error: ")]
    others = [line for line in lines if line not in errors and
              not line.startswith("datamount: warning: ")]  # fmt: skip
    assert (result.returncode, len(errors), others) == (code, 1, []), result.stderr
    assert "unexpected" not in result.stderr and "Traceback" not in result.stderr
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def no_parts(root: Path) -> None:
    assert [p for p in root.rglob("*.part")] == [] if root.is_dir() else True


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATAMOUNT_", "DATASET_", "RSLEX_", "AZUREML_"))
    }
    return {**keep, "DATAMOUNT_CACHE_DIR": str(tmp_path / "cache")}


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """tmp_path with a small source folder `src`, a file `afile`, and specs:
    ro.yaml (ro_mount of src) and up.yaml (an upload output to `out`)."""
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "a.bin").write_bytes(os.urandom(300_000))
    (tmp_path / "src" / "sub" / "b.txt").write_text("b\n")
    (tmp_path / "afile").write_text("a file, not a folder\n")
    (tmp_path / "ro.yaml").write_text(
        f"type: uri_folder\npath: {tmp_path / 'src'}\nmode: ro_mount\n"
    )
    upload_spec(tmp_path / "up.yaml", tmp_path / "out")
    return tmp_path


def upload_spec(spec: Path, dest: Path) -> Path:
    spec.write_text(f"outputs:\n  out:\n    type: uri_folder\n    path: {dest}\n    mode: upload\n")
    return spec


def many_small_files(folder: Path, count: int = 2200, size: int = 3000) -> Path:
    """6.6 MB by size, but one 4 KiB page each on tmpfs: 8.6 MiB used."""
    folder.mkdir()
    for i in range(count):
        (folder / f"f{i:05d}.bin").write_bytes(os.urandom(size))
    return folder


# -- ENOTDIR: a file where a folder is expected -----------------------------------


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["download", "{s}/src", "{s}/afile/dl"], 3, ["cannot create folder {s}/afile/dl"]),
        (["download", "{s}/src", "{s}/afile"], 3, ["{s}/afile", "in the way"]),
        (["download", "{s}/src", "{s}/dl", "--cache-dir", "{s}/afile/c"], 3,
         ["resume manifest {s}/afile/c/manifests/", "Not a directory"]),
        (["mount", "{s}/ro.yaml", "{s}/afile/mp"], 3, ["cannot create mount point {s}/afile/mp"]),
        (["mount", "{s}/ro.yaml", "{s}/mp", "--cache-dir", "{s}/afile/c"], 3,
         ["cannot create cache folder {s}/afile/c: Not a directory"]),
        (["mount", "{s}/ro.yaml", "{s}/mp", "--log-dir", "{s}/afile/logs"], 3,
         ["cannot create log folder {s}/afile/logs: Not a directory"]),
        (["mount", "{s}/up.yaml", "{s}/afile/up"], 3, ["cannot create upload folder {s}/afile/up"]),
        (["mount", "{s}/up.yaml", "{s}/up", "--cache-dir", "{s}/afile/c"], 3,
         ["cannot create cache folder {s}/afile/c/outputs: Not a directory"]),
        (["upload", "{s}/src", "{s}/afile/out"], 4, ["{s}/afile/out"]),
        (["unmount", "{s}/afile/mp"], 3, ["{s}/afile/mp is not mounted"]),
    ],
)  # fmt: skip
def test_enotdir(site: Path, env: dict[str, str], args: list[str], code: int,
                 words: list[str]) -> None:  # fmt: skip
    argv = [a.format(s=site) for a in args]
    one_error(cli(*argv, cwd=site, env=env), code, *[w.format(s=site) for w in words])
    no_parts(site)
    for name in ("mp", "up", "dl"):
        assert not mounted(site / name)
    if args[0] == "mount" and ("--cache-dir" in args or "--log-dir" in args):
        # a bad cache or log folder creates nothing (the ro_mount's mount point neither)
        assert not (site / "mp").exists() and not (site / "up").exists()


# -- ENAMETOOLONG: a 300-byte path component ---------------------------------------


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["download", "{s}/src", "{s}/{long}/dl"], 3),
        (["mount", "{s}/ro.yaml", "{s}/{long}"], 3),
        (["mount", "{s}/up.yaml", "{s}/{long}"], 3),
        (["upload", "{s}/src", "{s}/{long}/out"], 4),
        (["unmount", "{s}/{long}"], 3),
    ],
)
def test_enametoolong(site: Path, env: dict[str, str], args: list[str], code: int) -> None:
    argv = [a.format(s=site, long=LONG) for a in args]
    line = one_error(cli(*argv, cwd=site, env=env), code, LONG)
    assert "File name too long" in line or "is not mounted" in line
    no_parts(site)


# -- EROFS: a tmpfs remounted read-only ----------------------------------------------


def test_erofs_every_command(site: Path, env: dict[str, str]) -> None:
    ro = site / "ro"
    no_reserve = {**env, "DATASET_RESERVED_FREE_DISK_SPACE": "0"}
    with tmpfs(ro, "8m", read_only=True):
        cases = [
            (["download", f"{site}/src", f"{ro}/dl"], no_reserve, 3,
             f"cannot create folder {ro}/dl: Read-only file system"),
            (["mount", f"{site}/ro.yaml", f"{ro}/mp"], env, 3,
             f"cannot create mount point {ro}/mp: Read-only file system"),
            (["mount", f"{site}/ro.yaml", f"{site}/mp", "--cache-dir", f"{ro}/c"], env, 3,
             f"cannot create cache folder {ro}/c: Read-only file system"),
            (["mount", f"{site}/up.yaml", f"{ro}/up"], env, 3,
             f"cannot create upload folder {ro}/up: Read-only file system"),
            (["mount", f"{site}/up.yaml", f"{site}/up", "--cache-dir", f"{ro}/c"], env, 3,
             f"cannot create cache folder {ro}/c/outputs: Read-only file system"),
            (["upload", f"{site}/src", f"{ro}/out"], env, 4, "Read-only file system"),
        ]  # fmt: skip
        for argv, run_env, code, words in cases:
            one_error(cli(*argv, cwd=site, env=run_env), code, words)
        assert not (site / "mp").exists() and not (site / "up").exists()

        # An upload output whose destination is read-only: the unmount fails
        # with exit 4 and keeps the folder and its record to try again.
        spec = upload_spec(site / "up-ro.yaml", ro / "out")
        folder = site / "job-out"
        assert cli("mount", str(spec), str(folder), cwd=site, env=env).returncode == 0
        (folder / "result.txt").write_text("42\n")
        result = cli("unmount", str(folder), cwd=site, env=env)
        one_error(result, 4, f"upload to {ro}/out failed", "Read-only file system")
        assert (folder / "result.txt").read_text() == "42\n"
    no_parts(site)


# -- ENOSPC: a tiny tmpfs --------------------------------------------------------------


def test_enospc_mid_download_exit_3_no_part_files(site: Path, env: dict[str, str]) -> None:
    """The space check passes (6.6 MB of 8 MiB, no reserve) but the files take
    a page each: the writes fail partway with ENOSPC."""
    source = many_small_files(site / "many")
    env = {**env, "DATASET_RESERVED_FREE_DISK_SPACE": "0"}
    with tmpfs(site / "small", "8m") as small:
        result = cli("download", str(source), str(small / "dl"), cwd=site, env=env)
        one_error(result, 3, f"download to {small}/dl failed", "No space left on device")
        no_parts(small)
        done = list((small / "dl").iterdir())
        assert 0 < len(done) < 2200  # the files completed before the disk filled stay
        for path in done:
            assert path.read_bytes() == (source / path.name).read_bytes()


def test_enospc_upload_and_unmount_exit_4(site: Path, env: dict[str, str]) -> None:
    source = many_small_files(site / "many")
    with tmpfs(site / "small", "8m") as small:
        result = cli("upload", str(source), str(small / "out"), cwd=site, env=env)
        one_error(result, 4, f"upload to {small}/out failed", "No space left on device")

        spec = upload_spec(site / "up-small.yaml", small / "out2")
        folder = site / "job-out"
        assert cli("mount", str(spec), str(folder), cwd=site, env=env).returncode == 0
        for path in source.iterdir():
            (folder / path.name).write_bytes(path.read_bytes())
        result = cli("unmount", str(folder), cwd=site, env=env)
        one_error(result, 4, f"upload to {small}/out2 failed", "No space left on device")


def test_not_enough_space_reports_real_free_space(site: Path, env: dict[str, str]) -> None:
    """Free space below the reserve: the line gives the disk's real free bytes,
    the reserve and the need (not max(budget, 0) + reserve)."""
    with tmpfs(site / "small", "8m") as small:
        free = human(disk_free(small))
        result = cli("download", str(site / "src"), str(small / "dl"), cwd=site, env=env)
        line = one_error(result, 3, f"not enough disk space in {small}/dl")
        assert f"plus {human(150 << 20)} reserved" in line
        assert line.endswith(f", {free} free"), line
        assert not (small / "dl").exists()


# -- the funnel itself: what stays unexpected ------------------------------------------


def test_funnel_names_the_path_and_keeps_bugs_unexpected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import errno

    from datamount.cli import guard
    from datamount.settings import Settings

    settings = Settings.from_env({}, cache_dir=str(tmp_path / "c"), log_dir=str(tmp_path / "no"))

    def raising(exc: BaseException):  # noqa: ANN202
        def body() -> int:
            raise exc

        return body

    disk = OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), "/x/y")
    assert guard.guarded("download", settings, raising(disk)) == 3
    assert guard.guarded("upload", settings, raising(disk)) == 4
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a write: no path, still the disk
    assert guard.guarded("mount", settings, raising(full)) == 3
    bug = OSError(errno.EBADF, os.strerror(errno.EBADF))  # no path, not the disk's state
    assert guard.guarded("mount", settings, raising(bug)) == 1
    assert guard.guarded("mount", settings, raising(KeyError("k"))) == 1
    err = capsys.readouterr().err.splitlines()
    assert (
        err
        == [
            "datamount: error: /x/y: Not a directory",
            "datamount: error: /x/y: Not a directory",
            "datamount: error: the local disk: No space left on device",
            "datamount: error: unexpected OSError: [Errno 9] Bad file descriptor",  # no log: no "details in"
            "datamount: error: unexpected KeyError: 'k'",
        ]
    )


def test_upload_of_a_source_that_does_not_exist_is_bad_input(tmp_path: Path, env) -> None:  # noqa: ANN001
    dest = tmp_path / "dest"
    out = cli("upload", str(tmp_path / "nothing"), f"{dest}/", cwd=tmp_path, env=env)
    one_error(out, 2, "nothing: no such file or folder to upload")  # was exit 1
    assert not dest.exists()
