"""`datamount run` end to end on Azurite for model types, the run history and
the command's Azure ML variables: a model output registered and read back by
a second job through `azureml:<model>@latest`, a job reading an earlier run's
output through `azureml://jobs/<run>/outputs/<o>/paths/<p>`, two runs at once
both in the history, and a model given to a data input refused before
anything starts. Download and upload modes (no FUSE)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from fuse_helpers import CLI_TIMEOUT, EXE, datamount, mount_env

pytestmark = pytest.mark.azurite

SCHEMA = "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json"
DS = "azureml://datastores/workspaceblobstore/paths"


def job(tmp_path: Path, name: str, command: str, **entries: object) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"$schema": SCHEMA, "name": name, "command": command,
                                    **entries}, sort_keys=False))  # fmt: skip
    return path


def env_for(azurite, container, tmp_path: Path) -> dict[str, str]:  # noqa: ANN001
    env = mount_env(azurite, tmp_path, container.container_name)
    ws = Path(env["DATAMOUNT_WORKSPACE"])
    ws.write_text(ws.read_text().replace("  store:", "  workspaceblobstore:"))
    return env


def history(env: dict[str, str]) -> dict:
    ws = Path(env["DATAMOUNT_WORKSPACE"])
    return yaml.safe_load((ws.parent / f"{ws.stem}.runs.yaml").read_text())["runs"]


def test_a_model_output_is_registered_and_read_by_the_next_job(
    azurite, container, tmp_path: Path
) -> None:
    env = env_for(azurite, container, tmp_path)
    train = job(
        tmp_path, "train", "mkdir -p ${{outputs.model}}/data && echo flavors > "
        "${{outputs.model}}/MLmodel && echo w > ${{outputs.model}}/data/w.bin",
        outputs={"model": {"type": "mlflow_model", "mode": "upload", "name": "clf",
                           "path": f"{DS}/models/clf/${{{{name}}}}/"}},
    )  # fmt: skip
    for _ in range(2):  # two versions: @latest is the second
        out = datamount("run", str(train), env=env)
        assert out.returncode == 0, out.stderr
        assert "registered clf:" in out.stderr
    registry = yaml.safe_load(
        Path(env["DATAMOUNT_WORKSPACE"]).with_name("ws.assets.yaml").read_text()
    )
    versions = registry["models"]["clf"]
    assert [v["version"] for v in versions] == ["1", "2"]
    assert {v["type"] for v in versions} == {"mlflow_model"}
    assert "clf" not in registry.get("data_assets", {})

    score = job(
        tmp_path, "score", "cat ${{inputs.m}}/MLmodel; ls ${{inputs.m}}/data; "
        "echo IN=$AZURE_ML_INPUT_m; echo OUT=$AZURE_ML_OUTPUT_r; echo RUN=$AZUREML_RUN_ID; "
        "cp ${{inputs.m}}/data/w.bin ${{outputs.r}}/",
        inputs={"m": {"type": "mlflow_model", "path": "azureml:clf@latest", "mode": "download"}},
        outputs={"r": {"mode": "upload", "path": f"{DS}/scored/"}},
    )  # fmt: skip
    out = datamount("run", str(score), "--workdir", str(tmp_path / "w"), env=env)
    assert out.returncode == 0, out.stderr
    assert "flavors" in out.stdout and "w.bin" in out.stdout
    assert f"IN={tmp_path / 'w' / 'inputs' / 'm'}" in out.stdout
    assert f"OUT={tmp_path / 'w' / 'outputs' / 'r'}" in out.stdout
    run_line = next(x for x in out.stdout.splitlines() if x.startswith("RUN="))
    assert run_line.removeprefix("RUN=").startswith("score_")
    latest = versions[1]["path"].split("/paths/", 1)[1]
    assert container.download_blob(f"{latest}data/w.bin").readall() == b"w\n"
    assert container.download_blob("scored/w.bin").readall() == b"w\n"


def test_a_job_reads_an_earlier_runs_output_through_the_history(
    azurite, container, tmp_path: Path
) -> None:
    env = env_for(azurite, container, tmp_path)
    first = job(tmp_path, "prep", "echo rows > ${{outputs.clean}}/part-0.csv",
                outputs={"clean": {"mode": "upload"}})  # fmt: skip
    out = datamount("run", str(first), env=env)
    assert out.returncode == 0, out.stderr
    (run_name,) = history(env)
    assert history(env)[run_name]["outputs"]["clean"]["path"] == f"{DS}/{run_name}/clean/"

    uri = f"azureml://jobs/{run_name}/outputs/clean/paths/part-0.csv"
    second = job(tmp_path, "use", "cat ${{inputs.f}}",
                 inputs={"f": {"type": "uri_file", "path": uri, "mode": "download"}})  # fmt: skip
    out = datamount("run", str(second), env=env)
    assert out.returncode == 0, out.stderr
    assert "rows" in out.stdout

    missing = job(tmp_path, "miss", f"touch {tmp_path}/started",
                  inputs={"f": {"path": "azureml://jobs/nope/outputs/clean"}})  # fmt: skip
    out = datamount("run", str(missing), env=env)
    assert out.returncode == 2
    assert "run 'nope' is not in the run history" in out.stderr
    assert not (tmp_path / "started").exists()


def test_two_concurrent_runs_are_both_in_the_history(azurite, container, tmp_path: Path) -> None:
    env = env_for(azurite, container, tmp_path)
    spec = job(tmp_path, "par", "sleep 0.5; echo x > ${{outputs.o}}/x.txt",
               outputs={"o": {"mode": "upload"}})  # fmt: skip
    procs = [subprocess.Popen([EXE, "run", str(spec)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    for proc in procs:
        _, err = proc.communicate(timeout=CLI_TIMEOUT)
        assert proc.returncode == 0, err
    runs = history(env)
    assert len(runs) == 2 and all(r["job"] == "par" and r["exit_code"] == 0 for r in runs.values())
    for name in runs:
        assert container.download_blob(f"{name}/o/x.txt").readall() == b"x\n"


def test_a_model_given_to_a_data_input_stops_the_run(azurite, container, tmp_path: Path) -> None:
    env = env_for(azurite, container, tmp_path)
    ws = Path(env["DATAMOUNT_WORKSPACE"])
    ws.write_text(ws.read_text() + "models:\n  clf: [{version: '1', type: custom_model, "
                  f"path: '{DS}/m/'}}]\n")  # fmt: skip
    spec = job(tmp_path, "bad", f"touch {tmp_path}/started",
               inputs={"x": {"type": "uri_folder", "path": "azureml:clf:1"}})  # fmt: skip
    out = datamount("run", str(spec), env=env)
    assert out.returncode == 2
    lines = [x for x in out.stderr.splitlines() if "clf" in x]
    assert len(lines) == 1 and "'clf' is a model in the workspace, not a data asset" in lines[0]
    assert not (tmp_path / "started").exists()
    # validate, with the workspace given before the command
    del env["DATAMOUNT_WORKSPACE"]
    out = datamount("--workspace", str(ws), "validate", str(spec), env=env)
    assert out.returncode == 2 and "is a model in the workspace" in out.stderr
