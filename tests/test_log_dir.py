"""The log folder through the installed `datamount` script: one the user
named (`--log-dir`, DATAMOUNT_LOG_DIR) that cannot be used is exit 3 with
one `datamount: error:` line and nothing started; the default one
(`<cache dir>/logs`) unusable is one `datamount: warning:` line and the
command goes on. The folders are made unusable for real: a regular file
where a folder must be (ENOTDIR), a folder where a log file must be
(EISDIR)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fuse_helpers import EXE

pytestmark = pytest.mark.slow

SPEC = "inputs:\n  data: {type: uri_folder, path: ./data/}\n"
VALID = "spec.yaml: valid (named spec, 1 data inputs, 0 outputs; workspace not checked: "


@pytest.fixture
def site(tmp_path: Path) -> Path:
    (tmp_path / "spec.yaml").write_text(SPEC)
    (tmp_path / "afile").write_text("a regular file\n")
    return tmp_path


def cli(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DATAMOUNT_", "DATASET_"))}
    environ = {**base, "DATAMOUNT_CACHE_DIR": str(site / "cache"), **env}
    return subprocess.run([EXE, *args], cwd=site, env=environ, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


@pytest.mark.parametrize(
    ("how", "error"),
    [
        (["--log-dir", "afile/logs"], "cannot create log folder afile/logs: Not a directory"),
        (["--log-dir", "afile"], "cannot create log folder afile: a file of that name is in the way"),
        ({"DATAMOUNT_LOG_DIR": "{s}/afile/logs"},
         "cannot create log folder {s}/afile/logs: Not a directory"),
    ],
)  # fmt: skip
def test_a_named_log_folder_that_cannot_be_made_is_exit_3(
    site: Path, how: list[str] | dict[str, str], error: str
) -> None:
    flags = how if isinstance(how, list) else []
    env = {k: v.format(s=site) for k, v in how.items()} if isinstance(how, dict) else {}
    result = cli(site, "validate", "spec.yaml", *flags, **env)
    assert (result.returncode, result.stdout) == (3, "")
    assert result.stderr.splitlines() == [f"datamount: error: {error.format(s=site)}"]
    assert not (site / "cache" / "logs").exists()  # no logs went elsewhere instead


def test_a_named_log_folder_whose_log_file_is_a_folder_is_exit_3(site: Path) -> None:
    (site / "logs" / "datamount-runtime.log").mkdir(parents=True)
    result = cli(site, "validate", "spec.yaml", "--log-dir", "logs")
    assert (result.returncode, result.stdout) == (3, "")
    assert result.stderr.splitlines() == [
        "datamount: error: cannot write logs to logs: Is a directory"
    ]


def test_the_default_log_folder_unusable_is_a_warning(site: Path) -> None:
    result = cli(site, "validate", "spec.yaml", DATAMOUNT_CACHE_DIR=str(site / "afile" / "c"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(VALID), result.stdout
    assert result.stderr.splitlines() == [
        f"datamount: warning: cannot write logs to {site}/afile/c/logs: Not a directory"
    ]


def test_the_default_log_folder_unusable_then_an_error(site: Path) -> None:
    """The warning, then the command's own one error line and exit code."""
    result = cli(site, "validate", "missing.yaml", DATAMOUNT_CACHE_DIR=str(site / "afile" / "c"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"datamount: warning: cannot write logs to {site}/afile/c/logs: Not a directory",
        "datamount: error: missing.yaml: cannot read it: no such file",
    ]


def test_a_usable_named_log_folder_gets_the_logs(site: Path) -> None:
    result = cli(site, "validate", "spec.yaml", "--log-dir", "named/logs")
    assert (result.returncode, result.stderr) == (0, "")
    runtime = (site / "named" / "logs" / "datamount-runtime.log").read_text()
    assert "datamount " in runtime and ": validate (logs in named/logs)" in runtime
    assert not (site / "cache" / "logs").exists()


def test_run_with_a_named_log_folder_that_cannot_be_made(site: Path) -> None:
    """`run`: exit 3 before the command starts, its temporary workdir removed."""
    (site / "job.yaml").write_text("command: echo started > started.txt\n")
    (site / "tmp").mkdir()
    result = cli(site, "run", "job.yaml", "--log-dir", str(site / "afile" / "l"),
                 TMPDIR=str(site / "tmp"))  # fmt: skip
    assert result.returncode == 3
    assert result.stderr.splitlines() == [
        f"datamount: error: cannot create log folder {site}/afile/l: Not a directory"
    ]
    assert list((site / "tmp").iterdir()) == []
    assert not list(site.rglob("started.txt"))
