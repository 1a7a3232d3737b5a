"""`datamount run` and the upload output mode through the CLI: real Azurite,
real FUSE for the ro_mount input. Every mount point goes through the `mounts`
fixture, which detaches whatever a test leaves behind and fails the test.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from faultproxy import FaultProxy
from fuse_helpers import EXE, Mounts, datamount, mount_env, mounted, wait_for

pytestmark = [pytest.mark.azurite, pytest.mark.usefixtures("run_scratch")]

rng = random.Random(11)
SOURCE = {
    "data/train/a.txt": b"alpha\n",
    "data/train/sub/b.bin": rng.randbytes(3 * 1024 * 1024 + 5),
    "data/config.json": b'{"lr": 0.1}\n',
}
TRAIN_SH = """\
set -eu
train="$1"; cfg="$2"; raw="$3"; epochs="$4"; lr="$5"; model="$6"; metrics="$7"; ckpt="${8:-}"
cp "$train/a.txt" "$model/a.txt"
mkdir -p "$model/deep"
sha256sum "$train/sub/b.bin" | cut -d' ' -f1 > "$model/deep/b.sha256"
cp "$cfg" "$model/config.json"
printf 'raw=%s\\nepochs=%s\\nlr=%s\\nvar=%s\\npwd=%s\\nblas=%s\\n' "$raw" "$epochs" "$lr" "$MY_VAR" "$PWD" \\
    "${OPENBLAS_NUM_THREADS-unset}" \\
    > "$model/args.txt"
echo '{"accuracy": 0.9}' > "$metrics"
if [ -n "$ckpt" ]; then
    mkdir -p "$ckpt/epochs"
    head -c 3000000 "$train/sub/b.bin" > "$ckpt/epochs/e1.bin"
    mv "$ckpt/epochs/e1.bin" "$ckpt/epochs/final.bin"
fi
echo "trained for $epochs epochs"
"""


@pytest.fixture
def seeded(container) -> str:  # noqa: ANN001
    for key, data in SOURCE.items():
        container.upload_blob(key, data, overwrite=True)
    return container.container_name


def job_file(tmp_path: Path, command: str, **changes: object) -> Path:
    code = tmp_path / "src"
    code.mkdir(exist_ok=True)
    (code / "train.sh").write_text(TRAIN_SH)
    job: dict[str, object] = {
        "$schema": "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json",
        "name": "testjob",
        "code": "src",
        "command": command,
        "inputs": {
            "train": {"type": "uri_folder", "mode": "ro_mount",
                      "path": "azureml://datastores/store/paths/data/train/"},
            "cfg": {"type": "uri_file", "mode": "download",
                    "path": "azureml://datastores/store/paths/data/config.json"},
            "raw": {"type": "uri_folder", "mode": "direct",
                    "path": "azureml://datastores/store/paths/data/train/"},
            "epochs": 3,
            "lr": {"type": "number", "default": 0.5},
        },
        "outputs": {
            "model": {"type": "uri_folder", "mode": "upload", "name": "mymodel",
                      "path": "azureml://datastores/store/paths/out/model/"},
            "metrics": {"type": "uri_file", "mode": "upload",
                        "path": "azureml://datastores/store/paths/out/metrics.json"},
        },
        "environment_variables": {"MY_VAR": "hello", "DATASET_MOUNT_READ_BLOCK_SIZE": "1MB"},
    }  # fmt: skip
    job.update(changes)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


FULL = (
    "bash train.sh ${{inputs.train}} ${{inputs.cfg}} ${{inputs.raw}} ${{inputs.epochs}} "
    "${{inputs.lr}} ${{outputs.model}} ${{outputs.metrics}}"
)


def blob(container, key: str) -> bytes:  # noqa: ANN001
    return container.download_blob(key).readall()


def registry(tmp_path: Path) -> dict:
    return yaml.safe_load((tmp_path / "ws.assets.yaml").read_text())["data_assets"]


@pytest.mark.fuse
def test_run_every_mode_end_to_end(
    azurite, container, seeded, tmp_path: Path, mounts: Mounts
) -> None:
    env = mount_env(azurite, tmp_path, seeded)
    env.pop("OPENBLAS_NUM_THREADS", None)  # the job must not get the daemons' one
    job = job_file(tmp_path, FULL + " ${{outputs.ckpt}}")
    spec = yaml.safe_load(job.read_text())
    spec["outputs"]["ckpt"] = {"type": "uri_folder", "mode": "rw_mount", "name": "ckpt",
                               "path": "azureml://datastores/store/paths/out/ckpt/"}  # fmt: skip
    job.write_text(yaml.safe_dump(spec))
    workdir = tmp_path / "work"
    mounts.point(workdir / "inputs" / "train")
    mounts.point(workdir / "outputs" / "ckpt")
    out = datamount("run", str(job), "--workdir", str(workdir), env=env)
    assert out.returncode == 0, out.stderr
    assert "trained for 3 epochs" in out.stdout  # the command's own output streams through

    assert blob(container, "out/model/a.txt") == SOURCE["data/train/a.txt"]
    sha = hashlib.sha256(SOURCE["data/train/sub/b.bin"]).hexdigest()
    assert blob(container, "out/model/deep/b.sha256").decode().strip() == sha
    assert blob(container, "out/model/config.json") == SOURCE["data/config.json"]
    args = dict(
        line.split("=", 1) for line in blob(container, "out/model/args.txt").decode().splitlines()
    )
    assert args["raw"] == f"{azurite.endpoint}/{seeded}/data/train/"
    assert (args["epochs"], args["lr"], args["var"]) == ("3", "0.5", "hello")
    assert args["pwd"] == str(tmp_path / "src")
    assert args["blas"] == "unset"  # the mount daemons' own variable stays theirs
    assert json.loads(blob(container, "out/metrics.json")) == {"accuracy": 0.9}
    # The rw_mount output: written (and renamed) through FUSE, in storage after the run.
    assert blob(container, "out/ckpt/epochs/final.bin") == SOURCE["data/train/sub/b.bin"][:3000000]
    assert not list(container.list_blobs(name_starts_with="out/ckpt/epochs/e1"))
    assert not mounted(workdir / "outputs" / "ckpt")
    assert registry(tmp_path)["ckpt"][0]["path"] == "azureml://datastores/store/paths/out/ckpt/"

    registered = registry(tmp_path)["mymodel"][0]
    assert re.fullmatch(r"testjob_\d{8}_\d{6}_[0-9a-f]{6}", registered["job"])  # the run's name
    assert registered | {"created": None, "job": None} == {
        "version": "1", "type": "uri_folder", "job": None, "created": None,
        "path": "azureml://datastores/store/paths/out/model/",
    }  # fmt: skip
    assert not mounted(workdir / "inputs" / "train")
    assert list((workdir / "outputs" / "model").iterdir()) == []  # the local copy is gone
    logs = workdir / "system_logs" / "data_capability"
    activity = (logs / "data-capability.log").read_text()
    assert "ActivityStarted, run" in activity and "ActivityStarted, command" in activity
    # The job's environment_variables tune datamount itself (the mount daemon's settings).
    assert "DATASET_MOUNT_READ_BLOCK_SIZE=1MB" in (logs / "datamount-runtime.log").read_text()

    # A second run registers the next version; the registered asset is usable as an input.
    again = datamount("run", str(job), "--workdir", str(workdir), env=env)
    assert again.returncode == 0, again.stderr
    assert [v["version"] for v in registry(tmp_path)["mymodel"]] == ["1", "2"]
    resolved = datamount("resolve", "azureml:mymodel:2", env=env)
    assert resolved.stdout.strip() == f"{azurite.endpoint}/{seeded}/out/model/", resolved.stderr


@pytest.mark.fuse
def test_run_default_workdir_is_removed(
    azurite, container, seeded, tmp_path: Path, mounts: Mounts
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**mount_env(azurite, tmp_path, seeded), "TMPDIR": str(scratch)}
    job = job_file(
        tmp_path, "cat ${{inputs.cfg}} && ls ${{inputs.train}} && echo 1 > ${{outputs.metrics}}"
    )
    out = datamount("run", str(job), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ['{"lr": 0.1}', "a.txt", "sub"]
    assert list(scratch.iterdir()) == []


@pytest.mark.fuse
def test_failing_command_keeps_its_exit_code_and_uploads_outputs(
    azurite, container, seeded, tmp_path: Path, mounts: Mounts
) -> None:
    env = mount_env(azurite, tmp_path, seeded)
    job = job_file(
        tmp_path,
        "echo partial > ${{outputs.model}}/ckpt.txt; echo 1 > ${{outputs.metrics}}; exit 7",
    )
    workdir = tmp_path / "work"
    mounts.point(workdir / "inputs" / "train")
    out = datamount("run", str(job), "--workdir", str(workdir), env=env)
    assert out.returncode == 7, out.stderr
    assert blob(container, "out/model/ckpt.txt") == b"partial\n"  # uploaded anyway
    assert not (tmp_path / "ws.assets.yaml").exists()  # a failed job registers nothing
    assert not mounted(workdir / "inputs" / "train")


@pytest.mark.fuse
def test_missing_input_fails_before_the_command(
    azurite, container, seeded, tmp_path: Path, mounts: Mounts
) -> None:
    env = mount_env(azurite, tmp_path, seeded)
    marker = tmp_path / "ran"
    job = job_file(tmp_path, f"touch {marker}")
    spec = yaml.safe_load(job.read_text())
    spec["inputs"]["cfg"]["path"] = "azureml://datastores/store/paths/data/missing.json"
    job.write_text(yaml.safe_dump(spec))
    workdir = tmp_path / "work"
    mounts.point(workdir / "inputs" / "train")
    out = datamount("run", str(job), "--workdir", str(workdir), env=env)
    assert out.returncode == 3, out.stderr
    assert not marker.exists()
    assert "data could not be prepared" in out.stderr and "missing.json" in out.stderr
    assert "Traceback" not in out.stderr
    assert not mounted(workdir / "inputs" / "train")  # the input that did mount is undone
    assert not list(container.list_blobs(name_starts_with="out/"))


def test_invalid_job_reports_every_problem_and_starts_nothing(
    azurite, container, seeded, tmp_path: Path
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**mount_env(azurite, tmp_path, seeded), "TMPDIR": str(scratch)}
    job = job_file(
        tmp_path,
        "echo ${{inputs.nope}}",
        environment_variables={"DATASET_MOUNT_READ_THREADS": "many"},
    )
    out = datamount("run", str(job), env=env)
    assert out.returncode == 2
    assert "${{inputs.nope}} names no declared input" in out.stderr
    assert list(scratch.iterdir()) == []

    job = job_file(tmp_path, "true", environment_variables={"DATASET_MOUNT_READ_THREADS": "x"})
    out = datamount("run", str(job), env=env)
    assert out.returncode == 2 and "DATASET_MOUNT_READ_THREADS" in out.stderr

    spec = yaml.safe_load(job_file(tmp_path, "true").read_text())
    spec["inputs"]["cfg"]["path"] = "azureml://datastores/nostore/paths/x.json"
    spec["code"] = "no-such-folder"
    spec["outputs"]["model"]["version"] = "1"
    (tmp_path / "ws.assets.yaml").write_text(
        "data_assets:\n  mymodel:\n    - {version: '1', type: uri_folder, path: /x/}\n"
    )
    job.write_text(yaml.safe_dump(spec))
    out = datamount("run", str(job), env=env)
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert any("nostore" in line for line in lines)
    assert any(line.endswith("no-such-folder is not a folder") for line in lines)
    assert any("mymodel:1 is already registered" in line for line in lines)
    assert list(scratch.iterdir()) == []


def prepare_upload(tmp_path: Path, env: dict[str, str], output: dict[str, str]) -> Path:
    """Write a one-output spec, `mount` it into tmp_path/out; the printed path."""
    spec = tmp_path / "out.yaml"
    spec.write_text(yaml.safe_dump({"outputs": {"out": {"mode": "upload", **output}}}))
    out = datamount("mount", str(spec), str(tmp_path / "out"), env=env)
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip())


def test_upload_output_through_mount_and_unmount(azurite, container, tmp_path: Path) -> None:
    env = mount_env(azurite, tmp_path, container.container_name)
    output = {"path": "azureml://datastores/store/paths/results/", "name": "results"}
    folder = tmp_path / "out"
    assert prepare_upload(tmp_path, env, output) == folder
    (folder / "sub").mkdir()
    (folder / "sub" / "x.bin").write_bytes(b"x" * 100)
    (folder / "y.txt").write_text("y")

    busy = datamount("mount", str(tmp_path / "out.yaml"), str(folder), env=env)
    assert busy.returncode == 3 and "not yet uploaded" in busy.stderr

    done = datamount("unmount", str(folder), env=env)
    assert done.returncode == 0, done.stderr
    assert "uploaded 2 files" in done.stderr and "registered results:1" in done.stderr
    assert blob(container, "results/sub/x.bin") == b"x" * 100
    assert blob(container, "results/y.txt") == b"y"
    assert folder.is_dir() and list(folder.iterdir()) == []

    again = datamount("unmount", str(folder), env=env)
    assert again.returncode == 3 and "is not mounted" in again.stderr


def test_upload_output_failure_keeps_the_data_for_a_retry(
    azurite, container, tmp_path: Path
) -> None:
    env = mount_env(azurite, tmp_path, container.container_name)
    output = {"type": "uri_file", "path": "azureml://datastores/store/paths/m/metrics.json"}
    path = prepare_upload(tmp_path, env, output)
    folder = tmp_path / "out"
    assert path == folder / "metrics.json"

    missing = datamount("unmount", str(folder), env=env)  # the job wrote nothing
    assert missing.returncode == 4 and "wrote no file" in missing.stderr

    path.write_text("{}")
    broken = {**env, "TEST_KEY": "d3Jvbmcga2V5"}  # a wrong account key: 403
    denied = datamount("unmount", str(folder), env=broken)
    assert denied.returncode == 4, denied.stderr
    assert path.read_text() == "{}"  # nothing lost

    ok = datamount("unmount", str(folder), env=env)
    assert ok.returncode == 0, ok.stderr
    assert blob(container, "m/metrics.json") == b"{}"
    assert not path.exists()


def test_direct_mode_mount_prints_the_uri(azurite, container, tmp_path: Path) -> None:
    env = mount_env(azurite, tmp_path, container.container_name)
    spec = tmp_path / "d.yaml"
    spec.write_text("type: uri_folder\nmode: direct\npath: azureml://datastores/store/paths/p/\n")
    out = datamount("mount", str(spec), str(tmp_path / "unused"), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{azurite.endpoint}/{container.container_name}/p/"
    assert not os.path.exists(tmp_path / "unused")


def cfg_only_job(tmp_path: Path) -> Path:
    """A job with one downloaded input (config.json) and no outputs."""
    inputs = {"cfg": {"type": "uri_file", "mode": "download",
                      "path": "azureml://datastores/store/paths/data/config.json"}}  # fmt: skip
    return job_file(tmp_path, "cat ${{inputs.cfg}}", inputs=inputs, outputs={})


def cfg_requests(proxy: FaultProxy) -> list[str]:
    """How each GET of config.json was answered."""
    gets = [r for r in proxy.requests if r.method == "GET" and r.path.endswith("config.json")]
    return [r.injected or str(r.status) for r in gets]


def test_transient_failure_preparing_an_input_is_tried_again(
    azurite, container, seeded, tmp_path: Path, proxy: FaultProxy
) -> None:
    via = SimpleNamespace(account=azurite.account, key=azurite.key, endpoint=proxy.endpoint)
    # No request-level retries: the 503 reaches the job runner, which tries the input again.
    env = mount_env(
        via, tmp_path, seeded, AZUREML_DATASET_HTTP_RETRY_COUNT="0", DATAMOUNT_RETRY_MIN_SECONDS="0"
    )
    workdir = tmp_path / "work"
    proxy.fail_ranged(1, status=503)
    out = datamount("run", str(cfg_only_job(tmp_path)), "--workdir", str(workdir), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == SOURCE["data/config.json"].decode()
    assert cfg_requests(proxy).count("fail") == 1 and cfg_requests(proxy)[-1] == "206"
    runtime = (workdir / "system_logs" / "data_capability" / "datamount-runtime.log").read_text()
    assert "inputs.cfg: transient failure" in runtime and "attempt 2 of 3" in runtime


def test_permanent_failure_preparing_an_input_is_not_tried_again(
    azurite, container, seeded, tmp_path: Path, proxy: FaultProxy
) -> None:
    via = SimpleNamespace(account=azurite.account, key=azurite.key, endpoint=proxy.endpoint)
    env = mount_env(via, tmp_path, seeded)
    proxy.deny("config.json")
    out = datamount("run", str(cfg_only_job(tmp_path)), "--workdir", str(tmp_path / "w"), env=env)
    assert out.returncode == 3
    assert "data could not be prepared" in out.stderr and "Traceback" not in out.stderr
    assert cfg_requests(proxy) == ["deny"]  # a 403 is final: one request, no second attempt
    assert out.stdout == ""


@pytest.mark.fuse
def test_sigterm_reaches_the_command_then_outputs_are_written_and_mounts_undone(
    azurite, container, seeded, tmp_path: Path, mounts: Mounts
) -> None:
    env = mount_env(azurite, tmp_path, seeded)
    started = tmp_path / "started"
    command = (
        "trap 'echo stopped > ${{outputs.model}}/why.txt; echo 1 > ${{outputs.metrics}}; "
        f"exit 143' TERM; touch {started}; sleep 60 & wait"
    )
    workdir = tmp_path / "work"
    mounts.point(workdir / "inputs" / "train")
    proc = subprocess.Popen(
        [EXE, "run", str(job_file(tmp_path, command)), "--workdir", str(workdir)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_for(started.exists, 30), "the command never started"
        assert mounted(workdir / "inputs" / "train")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert blob(container, "out/model/why.txt") == b"stopped\n"
    assert not mounted(workdir / "inputs" / "train")
    assert not (tmp_path / "ws.assets.yaml").exists()


@pytest.mark.fuse
def test_sigterm_while_preparing_undoes_what_was_prepared(
    azurite, container, seeded, tmp_path: Path, proxy: FaultProxy, mounts: Mounts
) -> None:
    via = SimpleNamespace(account=azurite.account, key=azurite.key, endpoint=proxy.endpoint)
    env = mount_env(
        via, tmp_path, seeded, AZUREML_DATASET_HTTP_RETRY_COUNT="0", DATAMOUNT_RETRY_MIN_SECONDS="0"
    )
    marker = tmp_path / "ran"
    job = job_file(tmp_path, f"touch {marker}")
    workdir = tmp_path / "work"
    train = mounts.point(workdir / "inputs" / "train")
    runtime = workdir / "system_logs" / "data_capability" / "datamount-runtime.log"
    proxy.fail_ranged(1, status=503)  # cfg's first GET: the runner waits before its 2nd attempt
    proc = subprocess.Popen(
        [EXE, "run", str(job), "--workdir", str(workdir)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_for(lambda: runtime.exists() and "transient failure" in runtime.read_text(), 30)
        assert wait_for(lambda: mounted(train), 30)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not marker.exists()
    assert not mounted(train)
    assert not list(container.list_blobs(name_starts_with="out/"))


# -- fixes from review: finishing is not interruptible, nothing lost ---------------


def outputs_job(tmp_path: Path, command: str, outputs: dict) -> Path:
    """A job with no inputs and the given outputs."""
    return job_file(tmp_path, command, inputs={}, outputs=outputs)


@pytest.mark.fuse
def test_signal_while_writing_outputs_finishes_them(
    azurite, container, seeded, tmp_path: Path
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**mount_env(azurite, tmp_path, seeded), "TMPDIR": str(scratch)}
    outs = {
        "up": {"type": "uri_folder", "mode": "upload",
               "path": "azureml://datastores/store/paths/sig/up/"},
        "rw": {"type": "uri_folder", "mode": "rw_mount",
               "path": "azureml://datastores/store/paths/sig/rw/"},
    }  # fmt: skip
    command = (
        "echo keep > ${{outputs.rw}}/keep.txt; "
        "for i in $(seq 1 400); do echo $i > ${{outputs.up}}/f$i.txt; done"
    )
    proc = subprocess.Popen(
        [EXE, "run", str(outputs_job(tmp_path, command, outs))],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # once the command is done, interrupt the finishing
            if "the command exited" in line:
                proc.send_signal(signal.SIGTERM)
                proc.send_signal(signal.SIGINT)
                break
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert blob(container, "sig/rw/keep.txt") == b"keep\n"
    assert len(list(container.list_blobs(name_starts_with="sig/up/"))) == 400
    assert list(scratch.iterdir()) == []
    with open("/proc/mounts") as f:
        assert str(scratch) not in f.read()


def test_failed_upload_keeps_the_data_and_unmount_retries_it(
    azurite, container, seeded, tmp_path: Path, proxy: FaultProxy
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    via = SimpleNamespace(account=azurite.account, key=azurite.key, endpoint=proxy.endpoint)
    env = {
        **mount_env(
            via,
            tmp_path,
            seeded,
            AZUREML_DATASET_HTTP_RETRY_COUNT="0",
            DATAMOUNT_RETRY_MIN_SECONDS="0",
        ),
        "TMPDIR": str(scratch),
    }
    outs = {"model": {"type": "uri_folder", "mode": "upload", "name": "kept",
                      "path": "azureml://datastores/store/paths/kept/"}}  # fmt: skip
    proxy.deny_writes("kept/model.bin")
    job = outputs_job(tmp_path, "head -c 100000 /dev/urandom > ${{outputs.model}}/model.bin", outs)
    out = datamount("run", str(job), env=env)
    assert out.returncode == 4, out.stderr
    assert "outputs not uploaded yet" in out.stderr
    [workdir] = scratch.iterdir()
    local = workdir / "outputs" / "model" / "model.bin"
    assert local.stat().st_size == 100000  # nothing lost
    proxy.allow_writes("kept/model.bin")
    again = datamount("unmount", str(workdir / "outputs" / "model"), env=env)
    assert again.returncode == 0, again.stderr
    assert len(blob(container, "kept/model.bin")) == 100000


def test_unreachable_output_fails_before_the_command(
    azurite, container, seeded, tmp_path: Path
) -> None:
    env = mount_env(azurite, tmp_path, seeded)
    ws = Path(env["DATAMOUNT_WORKSPACE"])
    ws.write_text(ws.read_text().replace(f"container_name: {seeded}", "container_name: nosuch"))
    marker = tmp_path / "ran"
    outs = {"o": {"type": "uri_folder", "mode": "upload",
                  "path": "azureml://datastores/store/paths/x/"}}  # fmt: skip
    out = datamount("run", str(outputs_job(tmp_path, f"touch {marker}", outs)), env=env)
    assert out.returncode == 3 and "outputs.o: cannot write to" in out.stderr
    assert not marker.exists()


@pytest.mark.fuse
def test_closed_stderr_does_not_stop_the_outputs(
    azurite, container, seeded, tmp_path: Path, mounts: Mounts
) -> None:
    env = mount_env(azurite, tmp_path, seeded)
    outs = {"rw": {"type": "uri_folder", "mode": "rw_mount",
                   "path": "azureml://datastores/store/paths/pipe/"}}  # fmt: skip
    workdir = tmp_path / "w"
    mounts.point(workdir / "outputs" / "rw")
    job = outputs_job(tmp_path, "echo p > ${{outputs.rw}}/p.txt", outs)
    proc = subprocess.Popen(
        [EXE, "run", str(job), "--workdir", str(workdir)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    proc.stderr.close()  # whoever read our stderr went away
    assert proc.wait(timeout=120) == 0
    assert blob(container, "pipe/p.txt") == b"p\n"
    assert not mounted(workdir / "outputs" / "rw")


def test_leftover_processes_are_ended_even_when_they_ignore_sigterm(
    azurite, container, seeded, tmp_path: Path
) -> None:
    env = mount_env(azurite, tmp_path, seeded)
    tag = f"sleep {random.randint(10_000, 99_999)}"
    job = outputs_job(tmp_path, f"(trap '' TERM; exec -a stubborn {tag}) >/dev/null 2>&1 &", {})
    out = datamount("run", str(job), env=env)
    assert out.returncode == 0, out.stderr
    left = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True)
    assert left.stdout == ""


def test_each_run_writes_its_own_default_output_path(
    azurite, container, seeded, tmp_path: Path
) -> None:
    env = mount_env(azurite, tmp_path, seeded)
    outs = {"res": {"type": "uri_folder", "mode": "upload", "name": "res"}}
    ws = Path(env["DATAMOUNT_WORKSPACE"])
    ws.write_text(ws.read_text().replace("  store:", "  workspaceblobstore:"))
    job = outputs_job(tmp_path, "echo $RANDOM > ${{outputs.res}}/r.txt", outs)
    for _ in range(2):
        out = datamount("run", str(job), env=env)
        assert out.returncode == 0, out.stderr
    paths = [v["path"] for v in registry(tmp_path)["res"]]
    assert len(set(paths)) == 2 and all(p.startswith(
        "azureml://datastores/workspaceblobstore/paths/testjob_") for p in paths)  # fmt: skip
    names = {b.name.rsplit("/", 2)[0] for b in container.list_blobs(name_starts_with="testjob_")}
    assert len(names) == 2


def test_optional_input_left_out_drops_its_block(
    azurite, container, seeded, tmp_path: Path
) -> None:
    env = mount_env(azurite, tmp_path, seeded)
    inputs = {"o": {"type": "uri_folder", "optional": True},
              "flag": {"type": "boolean", "default": "false"}}  # fmt: skip
    job = job_file(
        tmp_path, "echo A $[[--data ${{inputs.o}}]] B ${{inputs.flag}}", inputs=inputs, outputs={}
    )
    out = datamount("run", str(job), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["A", "B", "False"]

    job = job_file(tmp_path, "echo ${{inputs.o}}", inputs=inputs, outputs={})
    bad = datamount("run", str(job), env=env)
    assert bad.returncode == 2 and "${{inputs.o}} has no value" in bad.stderr


@pytest.mark.fuse
def test_an_unwritten_uri_file_output_is_not_registered(
    azurite, container, seeded, tmp_path: Path, mounts: Mounts
) -> None:
    env = mount_env(azurite, tmp_path, seeded)
    outs = {"m": {"type": "uri_file", "mode": "rw_mount", "name": "never",
                  "path": "azureml://datastores/store/paths/never/m.json"}}  # fmt: skip
    workdir = tmp_path / "w"
    mounts.point(workdir / "outputs" / "m")
    out = datamount("run", str(outputs_job(tmp_path, "true", outs)), "--workdir", str(workdir),
                    env=env)  # fmt: skip
    assert out.returncode == 4 and "wrote no file" in out.stderr
    assert not (tmp_path / "ws.assets.yaml").exists()


def test_two_unmounts_of_one_upload_output(azurite, container, tmp_path: Path) -> None:
    env = mount_env(azurite, tmp_path, container.container_name)
    folder = prepare_upload(tmp_path, env, {"path": "azureml://datastores/store/paths/two/"})
    for i in range(200):
        (folder / f"f{i}.txt").write_text(str(i))
    procs = [
        subprocess.Popen([EXE, "unmount", str(folder)], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = sorted(
        ((p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs),
        key=lambda r: "uploaded 200 files" not in r[1],  # the one that uploaded first
    )
    # One uploads; the other waits for it and finds it done — or, arriving after
    # it finished, finds nothing to unmount. Never an unexpected error.
    assert results[0][0] == 0 and "uploaded 200 files" in "".join(e for _, e in results)
    second = results[1]
    assert (
        second[0] == 0
        and "already uploaded" in second[1]
        or (second[0] == 3 and "is not mounted" in second[1])
    ), results
    assert len(list(container.list_blobs(name_starts_with="two/"))) == 200
