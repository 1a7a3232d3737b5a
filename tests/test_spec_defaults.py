"""Defaults and spelling of data entries as the Azure ML SDK has them:
no `type` is uri_folder, values are case-insensitive, the legacy output
`mode: mount` is rw_mount (and logged), output `direct` for every type, and
a default path for a uri_file output."""

import logging

import pytest

from datamount.jobspec.job import DataType, LiteralInput, Mode, parse_spec

pytestmark = pytest.mark.unit

DS = "azureml://datastores/workspaceblobstore/paths/x/"


def test_an_input_without_type_is_a_uri_folder() -> None:
    entry = parse_spec({"inputs": {"a": {"path": DS}}}).entry("a")
    assert (entry.type, entry.mode) == (DataType.URI_FOLDER, Mode.RO_MOUNT)


def test_an_output_without_type_is_a_uri_folder() -> None:
    entry = parse_spec({"outputs": {"o": {"mode": "upload"}}}).entry("o")
    assert (entry.type, entry.mode) == (DataType.URI_FOLDER, Mode.UPLOAD)


@pytest.mark.parametrize(
    ("raw_type", "raw_mode", "kind", "mode"),
    [
        ("URI_FOLDER", "Direct", DataType.URI_FOLDER, Mode.DIRECT),
        ("Uri_File", "DOWNLOAD", DataType.URI_FILE, Mode.DOWNLOAD),
        ("MLTable", "Eval_Mount", DataType.MLTABLE, Mode.EVAL_MOUNT),
    ],
)
def test_type_and_mode_are_case_insensitive(
    raw_type: str, raw_mode: str, kind: DataType, mode: Mode
) -> None:
    entry = parse_spec({"inputs": {"a": {"type": raw_type, "path": DS, "mode": raw_mode}}}).entry(
        "a"
    )
    assert (entry.type, entry.mode) == (kind, mode)


def test_output_spelling_is_case_insensitive() -> None:
    entry = parse_spec({"outputs": {"o": {"type": "URI_FILE", "path": DS + "f", "mode": "Upload"}}})
    assert (entry.entry("o").type, entry.entry("o").mode) == (DataType.URI_FILE, Mode.UPLOAD)


def test_legacy_output_mount_is_rw_mount_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="datamount.app"):
        entry = parse_spec({"outputs": {"o": {"type": "uri_folder", "mode": "Mount"}}}).entry("o")
    assert entry.mode is Mode.RW_MOUNT
    assert "outputs.o: mode 'Mount' is the legacy name of rw_mount, as in Azure ML" in caplog.text


def test_mount_is_no_input_mode() -> None:
    from datamount.errors import SpecError

    with pytest.raises(SpecError) as info:
        parse_spec({"inputs": {"a": {"type": "uri_folder", "path": DS, "mode": "mount"}}})
    assert info.value.problems == [
        "inputs.a.mode: 'mount' is not allowed for a uri_folder input; "
        "allowed: download, ro_mount, direct"
    ]


@pytest.mark.parametrize("kind", ["uri_file", "uri_folder", "mltable"])
def test_output_direct_for_every_type(kind: str) -> None:
    entry = parse_spec({"outputs": {"o": {"type": kind, "mode": "direct"}}}).entry("o")
    assert entry.mode is Mode.DIRECT


def test_uri_file_output_default_path_is_a_file_named_after_the_output() -> None:
    spec = parse_spec({"outputs": {"model": {"type": "uri_file"}}}, run_name="run-1")
    entry = spec.entry("model")
    assert entry.path == "azureml://datastores/workspaceblobstore/paths/run-1/model/model"
    assert entry.path_was_default
    assert entry.location.path == "run-1/model/model"


def test_uri_folder_output_default_path_unchanged() -> None:
    spec = parse_spec({"outputs": {"o": {}}}, run_name="run-1")
    assert spec.entry("o").path == "azureml://datastores/workspaceblobstore/paths/run-1/o/"


def test_a_value_mapping_is_a_literal_input_as_in_the_sdk() -> None:
    spec = parse_spec({"command": "echo ${{inputs.epochs}}", "inputs": {"epochs": {"value": 3}}})
    literal = spec.inputs["epochs"]
    assert isinstance(literal, LiteralInput)
    assert literal.render() == "3"
