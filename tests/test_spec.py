"""Spec shapes and the exact Azure ML type × mode × direction table."""

import itertools
from pathlib import Path

import pytest

from datamount.errors import SpecError
from datamount.jobspec.job import (
    ALLOWED_MODES,
    DataInput,
    DataType,
    LiteralInput,
    Mode,
    load_spec,
    parse_spec,
)
from datamount.jobspec.uris import LocationKind

pytestmark = pytest.mark.unit

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
DS = "azureml://datastores/workspaceblobstore/paths/x/"

MODELS = ("mlflow_model", "custom_model", "triton_model")
# The table, written out independently of the code under test (docs/specs.md).
TABLE = {
    ("input", "uri_file"): {"download", "ro_mount", "direct"},
    ("input", "uri_folder"): {"download", "ro_mount", "direct"},
    ("input", "mltable"): {"download", "ro_mount", "direct", "eval_download", "eval_mount"},
    ("output", "uri_file"): {"upload", "rw_mount", "direct"},
    ("output", "uri_folder"): {"upload", "rw_mount", "direct"},
    ("output", "mltable"): {"upload", "rw_mount", "direct"},
    # Model types (azure-ai-ml's ModelInputSchema and OutputSchema): folders.
    **{("input", m): {"download", "ro_mount", "direct"} for m in MODELS},
    **{("output", m): {"upload", "rw_mount", "direct"} for m in MODELS},
}


def test_table_matches_design() -> None:
    assert {(d, t.value): {m.value for m in ms} for (d, t), ms in ALLOWED_MODES.items()} == TABLE


COMBOS = list(
    itertools.product(["input", "output"], [t.value for t in DataType], [m.value for m in Mode])
)


@pytest.mark.parametrize(("direction", "dtype", "mode"), COMBOS)
def test_every_combination(direction: str, dtype: str, mode: str) -> None:
    group = f"{direction}s"
    spec = {group: {"x": {"type": dtype, "path": DS, "mode": mode}}}
    if mode in TABLE[(direction, dtype)]:
        job = parse_spec(spec)
        entry = job.entry("x")
        assert (entry.direction, entry.type.value, entry.mode.value) == (direction, dtype, mode)
    else:
        with pytest.raises(SpecError) as info:
            parse_spec(spec)
        allowed = ", ".join(m.value for m in ALLOWED_MODES[(direction, DataType(dtype))])
        assert info.value.problems == [
            f"{group}.x.mode: '{mode}' is not allowed for a {dtype} {direction}; allowed: {allowed}"
        ]


def test_single_input_shape_defaults_to_ro_mount() -> None:
    job = parse_spec({"type": "uri_folder", "path": DS})
    assert job.shape == "single"
    entry = job.entry(None)
    assert entry.name == "input"
    assert entry.mode is Mode.RO_MOUNT
    assert entry.location.kind is LocationKind.DATASTORE


def test_named_shape_defaults() -> None:
    job = parse_spec(
        {
            "inputs": {"train": {"type": "uri_file", "path": "./t.csv"}},
            "outputs": {"model": {"type": "uri_folder", "path": DS}},
        }
    )
    assert job.shape == "named"
    assert job.entry("train").mode is Mode.RO_MOUNT
    assert job.entry("model").mode is Mode.RW_MOUNT
    assert job.entry("model").direction == "output"


def test_command_job_shape_keeps_unknown_keys_and_literals() -> None:
    job = load_spec(CONFIGS / "command-job.yaml")
    assert job.shape == "command"
    assert job.name == "demo-train"
    assert job.inputs["epochs"] == LiteralInput(name="epochs", value=1)
    assert isinstance(job.inputs["cifar"], DataInput)
    assert job.inputs["titanic"].mode is Mode.DOWNLOAD  # type: ignore[union-attr]
    assert job.environment_variables == {"DATASET_MOUNT_READ_THREADS": "8"}
    assert job.code == "./src"
    for key in (
        "$schema",
        "environment",
        "compute",
        "distribution",
        "resources",
        "experiment_name",
    ):
        assert key in job.extra
    assert job.extra["distribution"] == {"type": "pytorch", "process_count_per_instance": 1}


def test_output_default_path_is_derived() -> None:
    job = parse_spec(
        {"name": "job-7", "command": "echo ${{outputs.model}}", "outputs": {"model": None}}
    )
    model = job.outputs["model"]
    assert model.path == "azureml://datastores/workspaceblobstore/paths/job-7/model/"
    assert model.path_was_default
    assert model.type is DataType.URI_FOLDER
    assert model.mode is Mode.RW_MOUNT


def test_output_name_version_registration_fields() -> None:
    job = parse_spec(
        {"outputs": {"m": {"type": "uri_folder", "path": DS, "name": "model", "version": 3}}}
    )
    assert job.outputs["m"].asset_name == "model"
    assert job.outputs["m"].asset_version == "3"


def test_literal_typed_inputs() -> None:
    job = parse_spec(
        {
            "command": "echo ${{inputs.lr}} ${{inputs.flag}}",
            "inputs": {
                "lr": {"type": "number", "default": "0.5"},
                "flag": True,
                "name": "x",
            },
        }
    )
    assert job.inputs["lr"] == LiteralInput(name="lr", value=0.5)
    assert job.inputs["flag"].render() == "True"  # type: ignore[union-attr]


def test_identity_forms() -> None:
    job = parse_spec(
        {
            "command": "true",
            "identity": {"type": "managed"},
            "inputs": {"a": {"type": "uri_file", "path": DS + "f", "identity": "user_identity"}},
        }
    )
    assert job.identity is not None and job.identity.type.value == "managed_identity"
    assert job.entry("a").identity.type.value == "user_identity"  # type: ignore[union-attr]


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(SpecError) as info:
        load_spec(CONFIGS / "invalid-modes.yaml")
    assert info.value.problems == [
        "inputs.train.mode: 'rw_mount' is not allowed for a uri_folder input; "
        "allowed: download, ro_mount, direct",
        "inputs.table.mode: 'eval_mount' is not allowed for a uri_file input; "
        "allowed: download, ro_mount, direct",
        "inputs.broken.path: 'wasbs://nocontainer/x' is not a valid wasbs URI: "
        "expected wasbs://<container>@<account>.blob.core.windows.net/<path>",
        "outputs.model.mode: 'download' is not allowed for a uri_folder output; "
        "allowed: upload, rw_mount, direct",
    ]


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            {"inputs": {"a": {"type": "csv", "path": DS}}},
            "inputs.a.type: 'csv' is not a data type; allowed: uri_file, uri_folder, mltable, "
            "mlflow_model, custom_model, triton_model",
        ),
        (
            {"inputs": {"a": {"type": "uri_file"}}},
            "inputs.a.path: required for an input (or set `optional: true`)",
        ),
        (
            {"inputs": {"../x": {"type": "uri_file", "path": DS}}},
            "inputs.../x: not a valid name (letters, digits and '_', not starting with a "
            "digit, at most 255 characters)",
        ),
        (
            {"outputs": {"o": {"path": DS, "name": "bad name"}}},
            "outputs.o.name: 'bad name' is not a data asset name (letters, digits, '-' and '_' "
            "(no '.'), at most 255 characters)",
        ),
        (
            {"outputs": {"o": {"path": DS, "name": "m", "version": 1.10}}},
            "outputs.o.version: 1.1 is a number in YAML: quote the version (e.g. '1.10') so "
            "it stays as written",
        ),
        (
            {"inputs": {"s": {"type": "string"}}},
            "inputs.s: a string input needs a value (`default:` or `value:`) unless it is "
            "`optional: true`",
        ),
        (
            {"inputs": {"b": {"type": "boolean", "default": "maybe"}}},
            "inputs.b.value: 'maybe' is not a valid boolean",
        ),
        (
            {"inputs": {"a": {"type": "uri_file", "path": DS, "mode": "rw"}}},
            "inputs.a.mode: 'rw' is not allowed for a uri_file input; allowed: download, ro_mount, direct",
        ),
        (
            {"inputs": {"a": {"type": "uri_file", "path": DS, "colour": "red"}}},
            "inputs.a.colour: unknown key",
        ),
        (
            {"inputs": {"a": {"type": "uri_file", "path": DS, "name": "n"}}},
            "inputs.a: 'name'/'version' register outputs; an input cannot have them",
        ),
        (
            {"inputs": {"a": {"type": "uri_file", "path": DS, "identity": {"type": "root"}}}},
            "inputs.a.identity: {'type': 'root'} is not an identity; allowed types: "
            "user_identity, managed_identity, aml_token",
        ),
        ({"inputs": ["a"]}, "inputs: expected a mapping of names to entries, got list"),
        (
            {"command": "python t.py ${{inputs.missing}}", "inputs": {"a": 1}},
            "command: ${{inputs.missing}} names no declared input (declared: a)",
        ),
        (
            {"command": "python t.py ${{parent.x}}"},
            "command: unknown reference ${{parent.x}}; use ${{inputs.<name>}} or ${{outputs.<name>}}",
        ),
        ({"command": ""}, "command: a command job needs a non-empty 'command' string"),
        (
            {"inputs": {"n": {"type": "integer", "default": "abc"}}},
            "inputs.n.value: 'abc' is not a valid integer",
        ),
    ],
)
def test_invalid_entries(spec: dict, problem: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert info.value.problems == [problem]


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ([1, 2], "expected a YAML mapping"),
        ({"foo": 1}, "expected one input"),
        ({"type": "pipeline", "jobs": {}}, "'pipeline' jobs are not supported"),
    ],
)
def test_bad_top_level(data: object, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        parse_spec(data)


def test_bad_yaml_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("inputs:\n  a: {type: uri_file\n")
    with pytest.raises(SpecError, match=r"bad.yaml: not valid YAML \(line \d+, column \d+\)"):
        load_spec(bad)
    with pytest.raises(SpecError, match="missing.yaml: cannot read it: no such file"):
        load_spec(tmp_path / "missing.yaml")


def test_entry_selection() -> None:
    job = parse_spec({"inputs": {"a": {"type": "uri_file", "path": DS + "f"}, "b": 3}})
    assert job.entry(None).name == "a"  # the only data entry
    job2 = parse_spec(
        {"inputs": {"a": {"type": "uri_file", "path": "x"}, "c": {"type": "uri_file", "path": "y"}}}
    )
    with pytest.raises(SpecError, match=r"several data entries; choose one with --input \(a, c\)"):
        job2.entry(None)
    with pytest.raises(SpecError, match=r"--input z: no such input or output; the spec has: a, c"):
        job2.entry("z")


@pytest.mark.parametrize("name", ["input-single.yaml", "inputs-outputs.yaml", "command-job.yaml"])
def test_sample_specs_are_valid(name: str) -> None:
    assert load_spec(CONFIGS / name).source == CONFIGS / name


def test_literal_values_keep_their_type_and_optional_inputs_may_be_left_out() -> None:
    spec = parse_spec(
        {
            "command": "echo ${{inputs.f}} ${{inputs.t}} $[[--opt ${{inputs.o}}]]",
            "inputs": {
                "f": {"type": "boolean", "default": "false"},
                "t": {"type": "boolean", "default": "yes"},
                "n": {"type": "integer", "default": "3"},
                "s": {"type": "string", "optional": True},
                "o": {"type": "uri_folder", "optional": True},
            },
        }
    )
    literals = {k: v.value for k, v in spec.inputs.items() if isinstance(v, LiteralInput)}
    assert literals == {"f": False, "t": True, "n": 3, "s": None}
    assert "o" not in spec.inputs  # left out: its $[[...]] block is dropped at run time


def test_an_inputs_datastore_key_is_kept_as_the_sdk_has_it(tmp_path: Path) -> None:
    data = {
        "command": "ls ${{inputs.x}} ${{outputs.o}}",
        "inputs": {"x": {"path": "./d", "datastore": "azureml:workspaceblobstore"}},
        "outputs": {"o": {"type": "uri_folder"}},
    }
    spec = parse_spec(data, source=tmp_path / "job.yml")
    assert spec.inputs["x"].datastore == "workspaceblobstore"  # where Azure ML would upload ./d
    data["outputs"]["o"]["datastore"] = "workspaceblobstore"
    data["inputs"]["x"]["datastore"] = "bad name"
    with pytest.raises(SpecError) as caught:
        parse_spec(data, source=tmp_path / "job.yml")
    assert caught.value.problems == [
        "inputs.x.datastore: 'bad name' is not a datastore name",
        "outputs.o.datastore: only inputs have `datastore:` (where a local path is uploaded); "
        "put an output on a datastore with its `path`",
    ]
