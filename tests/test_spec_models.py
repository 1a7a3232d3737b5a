"""Model types, the new path forms (registries, ARM ids, job outputs,
unsupported schemes), the SDK's output-name rule, the run history and the
command's environment: pure logic, no storage."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import yaml

from datamount.cli.main import parse_args
from datamount.errors import SpecError, UriError, WorkspaceError
from datamount.jobs.environment import command_env
from datamount.jobspec.job import DataType, Mode, parse_spec
from datamount.jobspec.uris import LocationKind, parse
from datamount.storage.location import StorageKind
from datamount.workspace import runhistory
from datamount.workspace.datastores import Workspace

pytestmark = pytest.mark.unit

MODELS = ("mlflow_model", "custom_model", "triton_model")


def ws_file(tmp_path: Path, body: dict) -> Path:
    path = tmp_path / "ws.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


@pytest.mark.parametrize("kind", MODELS)
def test_model_inputs_and_outputs_take_the_sdk_modes(kind: str) -> None:
    spec = parse_spec(
        {
            "inputs": {"m": {"type": kind.upper(), "path": "/models/m/", "mode": "download"}},
            "outputs": {"o": {"type": kind, "path": "/out/", "mode": "mount"}},
        }
    )
    assert spec.inputs["m"].type is DataType(kind)  # type: ignore[union-attr]
    assert spec.outputs["o"].mode is Mode.RW_MOUNT
    for bad in ("eval_mount", "eval_download", "rw_mount"):
        with pytest.raises(SpecError, match=f"not allowed for a {kind} input"):
            parse_spec({"inputs": {"m": {"type": kind, "path": "/m/", "mode": bad}}})


def test_a_model_output_without_path_gets_a_folder() -> None:
    spec = parse_spec({"outputs": {"o": {"type": "mlflow_model"}}}, run_name="r1")
    assert spec.outputs["o"].path == "azureml://datastores/workspaceblobstore/paths/r1/o/"


@pytest.mark.parametrize(
    ("raw", "fields"),
    [
        ("azureml://registries/shared/data/iris/versions/1",
         {"registry": "shared", "asset_kind": "data", "asset_name": "iris", "asset_version": "1"}),
        ("azureml://registries/shared/models/clf/labels/latest",
         {"registry": "shared", "asset_kind": "model", "asset_version": None}),
        ("azureml:/subscriptions/0/resourceGroups/rg/providers/"
         "Microsoft.MachineLearningServices/workspaces/ws/data/iris/versions/2",
         {"workspace": "ws", "asset_kind": "data", "asset_version": "2"}),
        ("azureml://subscriptions/0/resourcegroups/rg/workspaces/ws/models/clf/versions/3",
         {"workspace": "ws", "asset_kind": "model", "asset_name": "clf"}),
    ],
)  # fmt: skip
def test_asset_uris(raw: str, fields: dict) -> None:
    loc = parse(raw)
    assert loc.kind is LocationKind.ASSET
    assert {k: getattr(loc, k) for k in fields} == fields


def test_job_output_uri() -> None:
    loc = parse("azureml://jobs/run-1/outputs/model/paths/sub/dir/")
    assert (loc.kind, loc.job, loc.job_output, loc.path) == (
        LocationKind.JOB_OUTPUT, "run-1", "model", "sub/dir/",
    )  # fmt: skip
    assert parse("azureml://jobs/run-1/outputs/model").path == ""
    with pytest.raises(UriError, match="not a valid job output URI"):
        parse("azureml://jobs/run-1/model")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("runs:/0123/model", "runs:/ is MLflow's run-artifact scheme"),
        ("s3://bucket/x", "unsupported scheme 's3'"),
        ("models:/clf/1", "unsupported scheme 'models'"),
        ("wasbs://c1c@acct.blob.core.windows.net/x?sv=1&sig=abc",
         "put SAS tokens in the workspace credentials"),
        ("azureml://registries/shared/environments/e/versions/1", "not a valid registry URI"),
    ],
)  # fmt: skip
def test_unsupported_forms_are_one_error(raw: str, message: str) -> None:
    with pytest.raises(UriError) as info:
        parse(raw, "inputs.x.path")
    assert len(info.value.problems) == 1 and message in info.value.problems[0]
    assert "sig=abc" not in info.value.problems[0] or "SAS" not in message


def test_a_model_uri_for_a_data_input_and_the_reverse_are_errors() -> None:
    with pytest.raises(SpecError, match="is a model asset, but the entry is a uri_folder"):
        parse_spec({"inputs": {"x": {"path": "azureml://registries/r/models/m/versions/1"}}})
    with pytest.raises(SpecError, match="is a data asset, but the entry is a mlflow_model"):
        parse_spec(
            {
                "inputs": {
                    "x": {
                        "type": "mlflow_model",
                        "path": "azureml://registries/r/data/d/versions/1",
                    }
                }
            }
        )


def test_output_names_follow_the_sdk_rule() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"outputs": {"o": {"type": "custom_model", "name": "my.model"}}})
    assert info.value.problems == [
        "outputs.o.name: 'my.model' is not a model name (letters, digits, '-' and '_' "
        "(no '.'), at most 255 characters)"
    ]
    parse_spec({"outputs": {"o": {"name": "my-model_2"}}})


def test_models_and_registries_resolve_by_the_entry_type(tmp_path: Path) -> None:
    path = ws_file(
        tmp_path,
        {
            "data_assets": {"iris": [{"version": "1", "type": "uri_folder", "path": "/d/iris/"}]},
            "models": {"clf": [{"version": "1", "type": "mlflow_model", "path": "/m/clf1/"},
                               {"version": "2", "type": "mlflow_model", "path": "/m/clf2/"}]},
            "registries": {"shared": {
                "data": {"iris": [{"version": "7", "type": "uri_folder", "path": "/r/iris/"}]},
                "models": {"clf": [{"version": "9", "type": "custom_model", "path": "/r/clf/"}]},
            }},
        },
    )  # fmt: skip
    ws = Workspace.load(path, {})
    got = ws.resolve(parse("azureml:clf@latest"), expected_type="mlflow_model")
    assert (got.kind, got.path) == (StorageKind.LOCAL, "/m/clf2/")
    got = ws.resolve(parse("azureml://registries/shared/models/clf/labels/latest"),
                     expected_type="custom_model")  # fmt: skip
    assert got.path == "/r/clf/"
    got = ws.resolve(parse("azureml://registries/shared/data/iris/versions/7"),
                     expected_type="uri_folder")  # fmt: skip
    assert got.path == "/r/iris/"
    with pytest.raises(WorkspaceError, match="'clf' is a model in the workspace, not a data asset"):
        ws.resolve(parse("azureml:clf:1"), where="inputs.x.path", expected_type="uri_folder")
    with pytest.raises(
        WorkspaceError, match="'iris' is a data asset in the workspace, not a model"
    ):
        ws.resolve(parse("azureml:iris:1"), expected_type="mlflow_model")
    with pytest.raises(WorkspaceError, match="registry 'other' is not in the workspace"):
        ws.resolve(parse("azureml://registries/other/data/iris/versions/1"))


def _record(args: tuple[str, int]) -> None:
    history, i = args
    out = runhistory.RunOutput("uri_folder", f"/out/{i}/")
    runhistory.record(Path(history), f"run-{i}", "job", 0, {"o": out})


def test_run_history_keeps_every_run_of_concurrent_writers(tmp_path: Path) -> None:
    history = tmp_path / "ws.runs.yaml"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_record, [(str(history), i) for i in range(24)])
    runs = runhistory.read(history)
    assert sorted(runs) == sorted(f"run-{i}" for i in range(24))
    assert runhistory.output_of(history, "run-5", "o", "x").path == "/out/5/"
    assert not list(tmp_path.glob(".*.tmp"))


def test_job_outputs_resolve_through_the_history(tmp_path: Path) -> None:
    path = ws_file(tmp_path, {"datastores": {}})
    ws = Workspace.load(path, {})
    history = ws.history_path()
    assert history == tmp_path / "ws.runs.yaml"
    out = runhistory.RunOutput("uri_folder", "/out/first/")
    runhistory.record(history, "first", "job", 0, {"o": out})
    got = ws.resolve(parse("azureml://jobs/first/outputs/o/paths/sub/f.txt"))
    assert got.path == "/out/first/sub/f.txt"
    with pytest.raises(WorkspaceError, match="run 'nope' is not in the run history"):
        ws.resolve(parse("azureml://jobs/nope/outputs/o"))
    with pytest.raises(WorkspaceError, match="run first has no output 'p'"):
        ws.resolve(parse("azureml://jobs/first/outputs/p"))
    with pytest.raises(WorkspaceError, match="is a uri_folder, but the entry is a mlflow_model"):
        ws.resolve(parse("azureml://jobs/first/outputs/o"), expected_type="mlflow_model")


def test_the_command_gets_azure_ml_variables() -> None:
    env = command_env(
        {"PATH": "/bin"}, {"inputs.data": "/w/inputs/data", "outputs.m": "/w/o"}, "r1"
    )
    assert env == {"PATH": "/bin", "AZURE_ML_INPUT_data": "/w/inputs/data",
                   "AZURE_ML_OUTPUT_m": "/w/o", "AZUREML_RUN_ID": "r1"}  # fmt: skip


def test_global_options_before_the_command() -> None:
    args = parse_args(["--cache-dir", "/c", "--workspace", "w.yaml", "validate", "s.yaml"])
    assert (args.cache_dir, args.workspace, args.spec) == ("/c", "w.yaml", "s.yaml")
    args = parse_args(["--cache-dir", "/c", "validate", "s.yaml", "--cache-dir", "/d"])
    assert args.cache_dir == "/d"  # after the command wins
