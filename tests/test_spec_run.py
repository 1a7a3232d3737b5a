"""`datamount run` of jobs written as the Azure ML SDK reads them: a uri_file
output without a path, a direct output, the legacy output `mode: mount`, and
types and modes spelled in capitals. Real Azurite, real FUSE for rw_mount."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fuse_helpers import Mounts, datamount, mount_env

pytestmark = pytest.mark.azurite

SCHEMA = "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json"


def job(tmp_path: Path, command: str, outputs: dict[str, object]) -> Path:
    path = tmp_path / "job.yaml"
    spec = {"$schema": SCHEMA, "name": "sdkjob", "command": command, "outputs": outputs}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def default_store_env(azurite, container, tmp_path: Path) -> dict[str, str]:  # noqa: ANN001
    """The workspace's datastore is `workspaceblobstore`: default output paths land there."""
    env = mount_env(azurite, tmp_path, container.container_name)
    ws = Path(env["DATAMOUNT_WORKSPACE"])
    ws.write_text(ws.read_text().replace("  store:", "  workspaceblobstore:"))
    return env


def test_uri_file_output_without_path_is_a_file_named_after_the_output(
    azurite, container, tmp_path: Path
) -> None:
    env = default_store_env(azurite, container, tmp_path)
    outs = {"model": {"type": "URI_FILE", "mode": "Upload"}}
    out = datamount("run", str(job(tmp_path, "echo weights > ${{outputs.model}}", outs)), env=env)
    assert out.returncode == 0, out.stderr
    blobs = [b.name for b in container.list_blobs(name_starts_with="sdkjob_")]
    assert len(blobs) == 1
    run_name, output, file_name = blobs[0].split("/")
    assert (output, file_name) == ("model", "model")
    assert container.download_blob(blobs[0]).readall() == b"weights\n"


def test_direct_output_gives_the_command_the_resolved_uri(
    azurite, container, tmp_path: Path
) -> None:
    env = default_store_env(azurite, container, tmp_path)
    outs = {"out": {"type": "uri_folder", "mode": "direct", "path":
                    "azureml://datastores/workspaceblobstore/paths/direct/out/"}}  # fmt: skip
    out = datamount("run", str(job(tmp_path, "echo URI=${{outputs.out}}", outs)), env=env)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("URI="))
    assert line.endswith(f"/{container.container_name}/direct/out/")
    assert azurite.key not in out.stdout + out.stderr


@pytest.mark.fuse
def test_legacy_output_mount_is_rw_mount(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:
    env = default_store_env(azurite, container, tmp_path)
    outs = {"o": {"mode": "mount", "path": "azureml://datastores/workspaceblobstore/paths/m/"}}
    workdir = tmp_path / "w"
    mounts.point(workdir / "outputs" / "o")
    spec = job(tmp_path, "echo hi > ${{outputs.o}}/a.txt", outs)
    out = datamount("run", str(spec), "--workdir", str(workdir), env=env)
    assert out.returncode == 0, out.stderr
    assert container.download_blob("m/a.txt").readall() == b"hi\n"


def test_expressions_in_an_output_path_expand_to_the_run(
    azurite, container, tmp_path: Path
) -> None:
    env = default_store_env(azurite, container, tmp_path)
    path = "azureml://datastores/${{default_datastore}}/paths/runs/${{name}}/${{output_name}}/"
    outs = {"res": {"type": "uri_folder", "mode": "upload", "path": path}}
    out = datamount("run", str(job(tmp_path, "echo r > ${{outputs.res}}/r.txt", outs)), env=env)
    assert out.returncode == 0, out.stderr
    blobs = [b.name for b in container.list_blobs()]
    assert len(blobs) == 1 and "${{" not in blobs[0]
    top, run_name, output, file_name = blobs[0].split("/")
    assert (top, output, file_name) == ("runs", "res", "r.txt")
    assert run_name.startswith("sdkjob_")
    assert container.download_blob(blobs[0]).readall() == b"r\n"


def test_an_unknown_expression_in_an_output_path_stops_the_run(
    azurite, container, tmp_path: Path
) -> None:
    env = default_store_env(azurite, container, tmp_path)
    outs = {"res": {"path": "azureml://datastores/workspaceblobstore/paths/${{job_id}}/"}}
    out = datamount("run", str(job(tmp_path, f"touch {tmp_path}/started", outs)), env=env)
    assert out.returncode == 2
    assert "outputs.res.path: unknown expression ${{job_id}}" in out.stderr
    assert not (tmp_path / "started").exists() and not list(container.list_blobs())
