"""Paths the Azure ML SDK accepts that name nothing datamount can read (an
account or container name Azure never issues, s3://, adl://): `validate`
says so in one warning line and exits 0, as the SDK's load accepts them;
`mount`, `download` and `run`, whose point is reading, refuse them in one
line, exit 2, before anything starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fuse_helpers import EXE

pytestmark = pytest.mark.slow

CASES = {
    "wasbs://data@my-acct.blob.core.windows.net/x/": "'my-acct' is not a storage account name "
    "(3-24 lowercase letters and digits)",
    "wasbs://c@acct.blob.core.windows.net/x/": "'c' is not a valid container name (3-63 "
    "lowercase letters, digits and hyphens)",
    "s3://bucket/prefix/": "unsupported scheme 's3'; use http(s)://, wasb(s)://, abfs(s):// or "
    "azureml://",
    "adl://store.azuredatalakestore.net/x/": "unsupported scheme 'adl'; use http(s)://, "
    "wasb(s)://, abfs(s):// or azureml://",
}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "DATAMOUNT_CACHE_DIR": str(cwd / "cache")}
    return subprocess.run([EXE, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.split(":")[0] + "-" + p[-12:-1])
def test_validate_warns_and_the_reading_commands_refuse(path: str, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"type: uri_folder\npath: {path}\nmode: download\n")
    line = f"input.path: {path!r}: {CASES[path]}"
    out = cli("validate", str(spec), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [f"datamount: warning: {line}"]
    assert "valid for the Azure ML SDK, but 1 of its paths name nothing datamount can read" in (
        out.stdout
    )
    for args in (("download", str(spec), str(tmp_path / "out")),
                 ("mount", str(spec), str(tmp_path / "mnt"))):  # fmt: skip
        out = cli(*args, cwd=tmp_path)
        assert out.returncode == 2, out.stderr
        assert out.stderr.splitlines() == [f"datamount: error: {line}"], args
    assert not (tmp_path / "out").exists() and not (tmp_path / "mnt").exists()
    job = tmp_path / "job.yaml"
    job.write_text(
        "type: command\ncommand: echo ${{inputs.x}}\n"
        f"inputs:\n  x: {{type: uri_folder, path: '{path}'}}\n"
    )
    out = cli("run", str(job), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [f"datamount: error: inputs.x.path: {path!r}: {CASES[path]}"]
