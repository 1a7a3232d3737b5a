"""The CLI end to end, as a user runs it: the installed `datamount` script,
its exit codes, its stdout/stderr lines, and the logs it leaves (no secrets)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from datamount import __version__

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
KEY = "Zm9vYmFyLWZha2Uta2V5LWZvci1jbGktdGVzdHM="
SECOND_KEY = "c2Vjb25kLWZha2Uta2V5"
SAS = "sv=2024-05-04&ss=b&srt=co&sp=rl&sig=VerySecretSignature%3D"


def datamount_bin() -> str:
    found = Path(sys.executable).parent / "datamount"
    return str(found) if found.exists() else shutil.which("datamount") or "datamount"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATAMOUNT_", "DATASET_", "RSLEX_", "AZUREML_"))
    }
    return {**base, "AZURITE_ACCOUNT_KEY": KEY, "AZURITE_SECOND_KEY": SECOND_KEY,
            "DATAMOUNT_CACHE_DIR": str(tmp_path / "cache")}  # fmt: skip


def run(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [datamount_bin(), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_version(env: dict[str, str]) -> None:
    result = run(["--version"], env)
    assert (result.returncode, result.stdout.strip()) == (0, f"datamount {__version__}")


def test_a_local_download_needs_no_workspace(env: dict[str, str], tmp_path: Path) -> None:
    """The repository's workspace names variables that are unset here: a
    local source downloads all the same; a datastore path still says why not."""
    (src := tmp_path / "src").mkdir()
    (src / "a.txt").write_bytes(b"alpha")
    bare = {k: v for k, v in env.items() if not k.startswith("AZURITE_")}
    out = run(["download", str(src), str(tmp_path / "dl")], bare)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "dl" / "a.txt").read_bytes() == b"alpha"
    out = run(["download", "azureml://datastores/workspaceblobstore/paths/x/", str(tmp_path / "d2")],
              bare)  # fmt: skip
    assert out.returncode == 2
    assert "environment variable AZURITE_ACCOUNT_KEY is not set" in out.stderr


@pytest.mark.parametrize(
    "name", ["input-single.yaml", "inputs-outputs.yaml", "command-job.yaml", "mltable-eval.yaml"]
)
def test_validate_samples(env: dict[str, str], name: str) -> None:
    result = run(["validate", f"configs/{name}"], env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"configs/{name}: valid (")
    assert "checked against" in result.stdout
    assert result.stderr == ""


def test_validate_invalid_exits_2_one_line_per_problem(env: dict[str, str]) -> None:
    result = run(["validate", "configs/invalid-modes.yaml"], env)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines == [
        "datamount: error: inputs.train.mode: 'rw_mount' is not allowed for a uri_folder input; "
        "allowed: download, ro_mount, direct",
        "datamount: error: inputs.table.mode: 'eval_mount' is not allowed for a uri_file input; "
        "allowed: download, ro_mount, direct",
        "datamount: error: inputs.broken.path: 'wasbs://nocontainer/x' is not a valid wasbs URI: "
        "expected wasbs://<container>@<account>.blob.core.windows.net/<path>",
        "datamount: error: outputs.model.mode: 'download' is not allowed for a uri_folder output; "
        "allowed: upload, rw_mount, direct",
    ]
    assert "Traceback" not in result.stderr


def test_validate_reports_missing_datastore_and_asset(env: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "inputs:\n"
        "  a: {type: uri_folder, path: 'azureml://datastores/nope/paths/x/'}\n"
        "  b: {type: uri_file, path: 'azureml:titanic:9'}\n"
    )
    result = run(["validate", str(spec), "--workspace", str(CONFIGS / "workspace.yaml")], env)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "datamount: error: inputs.a.path: datastore 'nope' is not in the workspace "
        "(datastores: lake, workspaceblobstore)",
        "datamount: error: inputs.b.path: data asset 'titanic' has no version '9' (versions: 1, 2)",
    ]


def test_validate_without_workspace_checks_spec_only(env: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "one.yaml"
    spec.write_text("type: uri_file\npath: azureml:unknown:1\nmode: download\n")
    result = run(["validate", str(spec)], env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "workspace not checked" in result.stdout


def test_validate_is_offline(env: dict[str, str], tmp_path: Path) -> None:
    """No network call: a blackholed endpoint (TEST-NET-1) would hang a request."""
    ws = tmp_path / "ws.yaml"
    ws.write_text(
        "datastores:\n  workspaceblobstore: {account_name: acct1, container_name: data, "
        "endpoint: 'http://192.0.2.1:9/acct1'}\n"
    )
    spec = tmp_path / "s.yaml"
    spec.write_text("type: uri_folder\npath: azureml://datastores/workspaceblobstore/paths/x/\n")
    result = run(["validate", str(spec), "--workspace", str(ws)], env)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("train", "http://127.0.0.1:10000/devstoreaccount1/data/cifar/"),
        ("titanic", "http://127.0.0.1:10000/devstoreaccount1/data/titanic-v2.csv"),
        ("lake", "abfss://lake@devstoreaccount1.dfs.core.windows.net/events/"),
        ("model", "http://127.0.0.1:10000/devstoreaccount1/data/out/model/"),
    ],
)
def test_resolve_inputs(env: dict[str, str], name: str, expected: str) -> None:
    result = run(["resolve", "configs/inputs-outputs.yaml", "--input", name], env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected + "\n"


def test_resolve_single_and_default_output(env: dict[str, str]) -> None:
    single = run(["resolve", "configs/input-single.yaml"], env)
    assert single.stdout == "http://127.0.0.1:10000/devstoreaccount1/data/cifar/\n"
    model = run(["resolve", "configs/command-job.yaml", "--input", "model"], env)
    assert model.stdout == "http://127.0.0.1:10000/devstoreaccount1/data/demo-train/model/\n"


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("azureml:titanic@latest", "http://127.0.0.1:10000/devstoreaccount1/data/titanic-v2.csv"),
        ("azureml:titanic:1", "http://127.0.0.1:10000/devstoreaccount1/data/titanic.csv"),
        (
            "azureml://datastores/lake/paths/a%20b/",
            "abfss://lake@devstoreaccount1.dfs.core.windows.net/a%20b/",
        ),
        (
            "https://public1.blob.core.windows.net/open/x.csv",
            "https://public1.blob.core.windows.net/open/x.csv",
        ),
        ("https://example.com/iris.csv", "https://example.com/iris.csv"),
    ],
)
def test_resolve_bare_uri(env: dict[str, str], uri: str, expected: str) -> None:
    result = run(["resolve", uri], env)
    assert (result.returncode, result.stdout) == (0, expected + "\n"), result.stderr


def test_resolve_local_relative_to_spec(env: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "local.yaml"
    spec.write_text("type: uri_folder\npath: ./data/\nmode: download\n")
    result = run(["resolve", str(spec)], env, cwd=ROOT)
    assert result.stdout == f"{tmp_path}/data/\n"


def test_resolve_needs_input_when_several(env: dict[str, str]) -> None:
    result = run(["resolve", "configs/inputs-outputs.yaml"], env)
    assert result.returncode == 2
    assert result.stderr == (
        "datamount: error: the spec has several data entries; choose one with --input "
        "(lake, model, titanic, train)\n"
    )


def test_missing_env_var_in_workspace(env: dict[str, str]) -> None:
    del env["AZURITE_ACCOUNT_KEY"]
    result = run(["resolve", "configs/input-single.yaml"], env)
    assert result.returncode == 2
    assert (
        "datastores.workspaceblobstore.credentials.account_key: environment variable "
        "AZURITE_ACCOUNT_KEY is not set" in result.stderr
    )


def test_bad_setting_is_one_clear_error(env: dict[str, str]) -> None:
    env["DATASET_MOUNT_READ_BLOCK_SIZE"] = "lots"
    result = run(["validate", "configs/input-single.yaml"], env)
    assert result.returncode == 2
    assert result.stderr.startswith("datamount: error: DATASET_MOUNT_READ_BLOCK_SIZE='lots'")
    assert len(result.stderr.splitlines()) == 1


def test_workspace_from_env_var(env: dict[str, str], tmp_path: Path) -> None:
    ws = tmp_path / "other.yaml"
    ws.write_text(
        "datastores:\n  workspaceblobstore: {account_name: acct9, container_name: box}\n"
        "data_assets:\n  cifar: [{version: '1', type: uri_folder, path: 'azureml://datastores/workspaceblobstore/paths/c/'}]\n"
    )
    env["DATAMOUNT_WORKSPACE"] = str(ws)
    result = run(["resolve", "configs/input-single.yaml"], env)
    assert result.stdout == "https://acct9.blob.core.windows.net/box/cifar/\n", result.stderr


def test_logs_written_and_secrets_never_logged(env: dict[str, str], tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    ws = tmp_path / "ws.yaml"
    ws.write_text(
        "datastores:\n"
        "  workspaceblobstore: {account_name: acct1, container_name: data, credentials: {account_key: '${AZURITE_ACCOUNT_KEY}'}}\n"
        "  sasstore: {account_name: acct2, container_name: data, credentials: {sas_token: '${MY_SAS}'}}\n"
    )
    env["MY_SAS"] = SAS
    outputs = []
    for args in (
        ["validate", "configs/inputs-outputs.yaml"],
        ["resolve", "azureml://datastores/workspaceblobstore/paths/x"],
        ["resolve", "azureml://datastores/sasstore/paths/x"],
        ["resolve", "azureml://datastores/missing/paths/x"],
    ):
        result = run([*args, "--workspace", str(ws), "--log-dir", str(log_dir)], env)
        outputs.append(result.stdout + result.stderr)
    capability = (log_dir / "data-capability.log").read_text()
    runtime = (log_dir / "datamount-runtime.log").read_text()
    assert "ActivityStarted, resolve" in capability
    assert "ActivityCompleted: Activity=resolve, HowEnded=Success, Duration=" in capability
    assert "ActivityCompleted: Activity=resolve, HowEnded=Failure" in capability
    assert runtime.splitlines()[0].endswith("Effective settings:")
    assert "DATASET_MOUNT_READ_BLOCK_SIZE=2MB" in runtime
    assert "credential sas" in runtime and "credential account_key" in runtime
    for text in (capability, runtime, *outputs):
        assert KEY not in text
        assert "VerySecretSignature" not in text


def test_secret_not_in_argv_or_errors(env: dict[str, str], tmp_path: Path) -> None:
    """A wrong key is named by variable, never echoed."""
    ws = tmp_path / "ws.yaml"
    ws.write_text(
        "datastores:\n  workspaceblobstore: {account_name: acct1, container_name: data, "
        "credentials: {account_key: '${AZURITE_ACCOUNT_KEY}', sas_token: '${AZURITE_ACCOUNT_KEY}'}}\n"
    )
    result = run(["validate", "configs/input-single.yaml", "--workspace", str(ws)], env)
    assert result.returncode == 2
    assert "give account_key or sas_token, not both" in result.stderr
    assert KEY not in result.stderr


def test_usage_error_exits_2(env: dict[str, str]) -> None:
    result = run(["frobnicate"], env)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_start_up_does_not_load_the_tabular_stack() -> None:
    """MLTable support (numpy, pyarrow, pandas) loads only when an MLTable is
    evaluated: every command's start-up (and a mount daemon's memory) stays small."""
    code = (
        "import sys, datamount.cli.main; "
        "print(sorted(m for m in ('numpy', 'pyarrow', 'pandas', 'azure.storage.blob') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
