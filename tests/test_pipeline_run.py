"""`datamount run` of pipeline jobs, `component create` and `data create` on
Azurite: a fan-out/fan-in pipeline (a component by file and one by
registered name, parent inputs and outputs, one step output read as
ro_mount by one step and downloaded by another, a nested pipeline whose
output a later step reads), a failing step with and
without `continue_on_step_failure`, and bad pipelines refused before any
step starts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from fuse_helpers import Mounts, datamount, mount_env

pytestmark = [pytest.mark.azurite, pytest.mark.usefixtures("run_scratch")]

CMD = "https://azuremlschemas.azureedge.net/latest/commandComponent.schema.json"
PIPE = "https://azuremlschemas.azureedge.net/latest/pipelineJob.schema.json"


def env_for(azurite, container, tmp_path: Path, **extra: str) -> dict[str, str]:  # noqa: ANN001
    env = mount_env(azurite, tmp_path, container.container_name, **extra)
    ws = Path(env["DATAMOUNT_WORKSPACE"])
    ws.write_text(ws.read_text().replace("  store:", "  workspaceblobstore:"))
    return env


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def components(tmp_path: Path) -> None:
    write(tmp_path / "prep.yml", {
        "$schema": CMD, "name": "prep", "version": "1", "type": "command",
        "inputs": {"raw": {"type": "uri_folder"}, "n": {"type": "integer", "default": 1}},
        "outputs": {"out": {"type": "uri_folder", "mode": "upload"}},
        "command": "cp -r ${{inputs.raw}}/. ${{outputs.out}}/ && echo ${{inputs.n}} > ${{outputs.out}}/n",
    })  # fmt: skip
    write(tmp_path / "counter.yml", {
        "$schema": CMD, "name": "counter", "version": "1", "type": "command",
        "inputs": {"x": {"type": "uri_folder", "mode": "download"}},
        "outputs": {"o": {"type": "uri_folder", "mode": "upload"}},
        "command": "ls ${{inputs.x}} | sort > ${{outputs.o}}/files && test -f ${{inputs.x}}/n",
    })  # fmt: skip
    write(tmp_path / "wrap.yml", {
        "$schema": PIPE.replace("pipelineJob", "pipelineComponent"), "type": "pipeline",
        "name": "wrap", "inputs": {"src": {"type": "uri_folder"}},
        "outputs": {"made": {"type": "uri_folder", "mode": "upload"}},
        "jobs": {"inner": step("cp ${{inputs.src}}/n ${{outputs.o}}/n",
                               {"src": {"path": "${{parent.inputs.src}}", "mode": "download"}},
                               {"o": "${{parent.outputs.made}}"})},
    })  # fmt: skip


def step(command: str, inputs: dict, outputs: dict | None = None) -> dict:
    return {"type": "command", "command": command, "inputs": inputs, "outputs": outputs or {}}


@pytest.mark.slow
@pytest.mark.fuse
def test_a_fan_out_fan_in_pipeline_runs_end_to_end(
    azurite,
    container,
    tmp_path: Path,
    mounts: Mounts,  # noqa: ANN001
) -> None:
    container.upload_blob("data/a.txt", b"alpha\n")
    container.upload_blob("data/b.txt", b"beta\n")
    env = env_for(azurite, container, tmp_path)
    components(tmp_path)
    made = datamount("component", "create", str(tmp_path / "counter.yml"), env=env)
    assert made.returncode == 0, made.stderr
    assert "registered component counter:1" in made.stderr
    pipeline = write(tmp_path / "pipe.yml", {
        "$schema": PIPE, "type": "pipeline",
        "settings": {"default_compute": "azureml:cpu"},
        "inputs": {"raw": {"type": "uri_folder",
                           "path": "azureml://datastores/workspaceblobstore/paths/data/"},
                   "n": 3},
        "outputs": {"final": {"type": "uri_folder", "name": "final",
                              "path": "azureml://datastores/workspaceblobstore/paths/out/final/"}},
        "jobs": {
            "prep": {"component": "./prep.yml",
                     "inputs": {"raw": {"path": "${{parent.inputs.raw}}", "mode": "download"},
                                "n": "${{parent.inputs.n}}"}},
            "mounted": step("cat ${{inputs.x}}/a.txt ${{inputs.x}}/n > ${{outputs.o}}/cat",
                            {"x": {"path": "${{parent.jobs.prep.outputs.out}}",
                                   "mode": "ro_mount"}},
                            {"o": {"type": "uri_folder", "mode": "upload"}}),
            "count": {"component": "azureml:counter:1",
                      "inputs": {"x": "${{parent.jobs.prep.outputs.out}}"}},
            "wrap": {"type": "pipeline", "component": "./wrap.yml",
                     "inputs": {"src": "${{parent.jobs.prep.outputs.out}}"}},
            "join": step("cat ${{inputs.c}}/cat ${{inputs.f}}/files > ${{outputs.all}}/all"
                         " && cp ${{inputs.w}}/n ${{outputs.all}}/w",
                         {"c": {"path": "${{parent.jobs.mounted.outputs.o}}", "mode": "download"},
                          "f": {"path": "${{parent.jobs.count.outputs.o}}", "mode": "download"},
                          "w": {"path": "${{parent.jobs.wrap.outputs.made}}",
                                "mode": "download"}},
                         {"all": "${{parent.outputs.final}}"}),
        },
    })  # fmt: skip
    workdir = tmp_path / "work"
    mounts.point(workdir / "mounted" / "inputs" / "x")
    out = datamount("run", str(pipeline), "--workdir", str(workdir), env=env)
    assert out.returncode == 0, out.stderr
    result = container.download_blob("out/final/all").readall().decode()
    assert result == "alpha\n3\na.txt\nb.txt\nn\n"
    names = [b.name for b in container.list_blobs(name_starts_with="pipe_")]
    assert any(n.endswith("/prep/out/a.txt") for n in names), names  # <run>/<step>/<output>/
    assert any(n.endswith("/wrap/inner/o/n") for n in names), names  # <step>/<inner step>/
    assert container.download_blob("out/final/w").readall() == b"3\n"  # the nested output
    assert (workdir / "wrap.inner" / "system_logs" / "std_log.txt").is_file()
    assert (workdir / "count" / "system_logs" / "std_log.txt").is_file()
    assert (workdir / "join" / "system_logs" / "data_capability").is_dir()
    ws = Path(env["DATAMOUNT_WORKSPACE"])
    registry = yaml.safe_load((ws.parent / "ws.assets.yaml").read_text())
    assert registry["data_assets"]["final"][0]["path"].endswith("/paths/out/final/")
    assert registry["components"]["counter"][0]["version"] == "1"


def test_a_failing_step_stops_its_dependents(azurite, container, tmp_path: Path) -> None:  # noqa: ANN001
    env = env_for(azurite, container, tmp_path, DATAMOUNT_PIPELINE_PARALLEL="1")
    jobs = {
        "bad": step("exit 7", {}, {"o": {"type": "uri_folder", "mode": "upload"}}),
        "after": step("true", {"x": {"path": "${{parent.jobs.bad.outputs.o}}",
                                     "mode": "download"}}),
        "ok": step("echo fine", {}),
    }  # fmt: skip
    go_on = {"$schema": PIPE, "type": "pipeline", "jobs": jobs,
             "settings": {"continue_on_step_failure": True}}  # fmt: skip
    out = datamount("run", str(write(tmp_path / "on.yml", go_on)), env=env)
    assert out.returncode == 7, out.stderr
    assert "[ok] fine" in out.stderr
    assert "[after] not run: a step it reads failed" in out.stderr
    assert "steps in " in out.stderr and ", up to 1 at a time" in out.stderr  # the knob, logged
    assert "step bad failed (exit 7)" in out.stderr.splitlines()[-2]
    stop = {**go_on, "settings": {}}
    workdir = tmp_path / "work"
    out = datamount("run", str(write(tmp_path / "stop.yml", stop)), "--workdir", str(workdir),
                    env=env)  # fmt: skip
    assert out.returncode == 7, out.stderr
    assert "[ok] not run: the pipeline stopped" in out.stderr
    assert (workdir / "bad" / "system_logs" / "std_log.txt").is_file()


def test_bad_pipelines_exit_2_before_any_step(tmp_path: Path, azurite, container) -> None:  # noqa: ANN001
    env = env_for(azurite, container, tmp_path)
    marker = tmp_path / "ran"
    jobs = {
        "a": step(f"touch {marker}", {"x": "${{parent.jobs.b.outputs.o}}"}, {"o": {}}),
        "b": step("true", {"x": "${{parent.jobs.a.outputs.o}}"}, {"o": {}}),
        "c": step("true", {"x": "${{parent.jobs.zz.outputs.o}}"}),
        "s": {"type": "spark", "inputs": {}},
    }  # fmt: skip
    out = datamount("run", str(write(tmp_path / "bad.yml", {"type": "pipeline", "jobs": jobs})),
                    env=env)  # fmt: skip
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert any("jobs: a cycle: " in line for line in lines), lines
    assert any("jobs.c.inputs.x: ${{parent.jobs.zz.outputs.o}} names no step" in x for x in lines)
    assert not marker.exists()
    # A type mismatch across a binding: `validate` warns (the SDK's load accepts
    # it), `run` refuses it before any step.
    mismatch = {
        "a": step(f"touch {marker}", {}, {"o": {}}),
        "c": step("true", {"y": {"type": "uri_file", "path": "${{parent.jobs.a.outputs.o}}"}}),
    }
    spec = write(tmp_path / "mismatch.yml", {"type": "pipeline", "jobs": mismatch})
    out = datamount("validate", str(spec), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "datamount: warning: jobs.c.inputs.y: ${{parent.jobs.a.outputs.o}} is a uri_folder, "
        "but the input is a uri_file (`run` refuses it)"
    ]
    out = datamount("run", str(spec), env=env)
    assert out.returncode == 2 and not marker.exists()
    assert out.stderr.splitlines()[-1] == (
        "datamount: error: jobs.c.inputs.y: ${{parent.jobs.a.outputs.o}} is a uri_folder, "
        "but the input is a uri_file"
    )
    env["DATAMOUNT_PIPELINE_PARALLEL"] = "0"  # a bad knob: one line, exit 2, nothing run
    out = datamount("run", str(write(tmp_path / "bad.yml", {"type": "pipeline", "jobs": jobs})),
                    env=env)  # fmt: skip
    assert out.returncode == 2 and not marker.exists()
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .endswith("DATAMOUNT_PIPELINE_PARALLEL='0': must be from 1 to 256")
    )


def test_data_create_uploads_a_local_path_once_per_version_and_registers_it(
    azurite,
    container,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    env = env_for(azurite, container, tmp_path)
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "a.csv").write_text("x\n1\n")
    asset = write(tmp_path / "asset.yml", {"name": "sales", "type": "uri_folder", "path": "./v1"})
    out = datamount("data", "create", str(asset), env=env)
    assert out.returncode == 0, out.stderr
    assert "registered data asset sales:1" in out.stderr
    (tmp_path / "v1" / "a.csv").write_text("x\n2\n")  # the next version's bytes
    out = datamount("data", "create", str(asset), env=env)
    assert out.returncode == 0, out.stderr
    assert "registered data asset sales:2" in out.stderr
    got = {}
    for version in ("1", "2"):
        dest = tmp_path / f"got{version}"
        out = datamount("download", f"azureml:sales:{version}", str(dest), env=env)
        assert out.returncode == 0, out.stderr
        got[version] = (dest / "a.csv").read_text()
    assert got == {"1": "x\n1\n", "2": "x\n2\n"}  # version 1 still points at its own bytes
    missing = write(tmp_path / "missing.yml", {"name": "gone", "type": "uri_folder",
                                               "path": "./nope"})  # fmt: skip
    out = datamount("data", "create", str(missing), env=env)
    assert out.returncode == 2 and "does not exist" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_what_the_sdk_loads_but_cannot_run_here_is_refused_by_run_alone(
    tmp_path: Path,
    azurite,
    container,  # noqa: ANN001
) -> None:
    """A value outside a component input's enum or max, and a registry
    component not in the local registry: `validate` exits 0 (a warning line
    for the component), `run` refuses each in one line before any step."""
    env = env_for(azurite, container, tmp_path)
    marker = tmp_path / "ran"
    write(tmp_path / "pre.yml", {
        "type": "command", "name": "pre", "version": "1",
        "inputs": {"task": {"type": "string", "enum": ["a", "b"], "default": "a"},
                   "ratio": {"type": "number", "default": 0.2, "min": 0, "max": 1}},
        "command": f"touch {marker}",
    })  # fmt: skip
    given = {"type": "pipeline", "jobs": {"pre": {
        "component": "file:./pre.yml", "inputs": {"task": "c", "ratio": 7}}}}  # fmt: skip
    spec = write(tmp_path / "enum.yml", given)
    out = datamount("validate", str(spec), env=env)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    out = datamount("run", str(spec), env=env)
    assert out.returncode == 2 and not marker.exists()
    assert out.stderr.splitlines()[-2:] == [
        "datamount: error: jobs.pre.inputs.task: 'c' is not one of its enum (a, b)",
        "datamount: error: jobs.pre.inputs.ratio: 7 is above its max 1",
    ]
    given["jobs"]["pre"]["inputs"] = {"task": "b", "ratio": 0.5}
    given["jobs"]["eval"] = {
        "component": "azureml://registries/azureml/components/model_evaluation/versions/0.0.7",
        "inputs": {"task": "text-generation"},
    }
    spec = write(tmp_path / "registry.yml", given)
    out = datamount("validate", str(spec), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "datamount: warning: jobs.eval.component: azureml://registries/azureml/components/"
        "model_evaluation/versions/0.0.7 is not in the local registry: its interface was not "
        "checked (`run` needs it declared in the workspace's registries: azureml: components: "
        "section)"
    ]
    out = datamount("run", str(spec), env=env)
    assert out.returncode == 2 and not marker.exists()
    assert out.stderr.splitlines()[-1] == (
        "datamount: error: jobs.eval.component: component 'model_evaluation' of registry "
        "'azureml': the registry is not in the workspace's registries: section "
        "(registries: none); declare it there with its components"
    )


def test_component_create_reads_code_as_the_sdk_does(tmp_path: Path) -> None:
    """`code: file:./src` is the folder ./src beside the component file (the
    SDK's local prefix), stored absolute in the registry."""
    (tmp_path / "src").mkdir()
    (tmp_path / "ws.yaml").write_text("datastores: {}\n")
    write(tmp_path / "c.yml", {"$schema": CMD, "name": "c1", "type": "command",
                               "code": "file:./src", "command": "echo hi"})  # fmt: skip
    env = {**os.environ, "DATAMOUNT_WORKSPACE": str(tmp_path / "ws.yaml")}
    made = datamount("component", "create", str(tmp_path / "c.yml"), env=env)
    assert (made.returncode, made.stderr) == (0, "datamount: registered component c1:1\n")
    registry = yaml.safe_load((tmp_path / "ws.assets.yaml").read_text())
    assert registry["components"]["c1"][0]["component"]["code"] == str(tmp_path / "src")
