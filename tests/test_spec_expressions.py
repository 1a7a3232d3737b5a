"""The expressions Azure ML expands in output paths: `${{name}}` (the run's
name), `${{output_name}}`, `${{default_datastore}}`; any other is a
validation error naming it."""

import pytest

from datamount.errors import SpecError
from datamount.jobspec.job import parse_spec

pytestmark = pytest.mark.unit

ALLOWED = "allowed: ${{name}}, ${{output_name}}, ${{default_datastore}}"


def outputs(path: str) -> dict[str, object]:
    return {"command": "echo ${{outputs.model}}", "outputs": {"model": {"path": path}}}


def test_name_output_name_and_default_datastore_expand() -> None:
    spec = parse_spec(
        outputs("azureml://datastores/${{default_datastore}}/paths/${{name}}/${{ output_name }}/"),
        run_name="train_20261201_abc",
    )
    entry = spec.entry("model")
    assert entry.path == "azureml://datastores/workspaceblobstore/paths/train_20261201_abc/model/"
    assert (entry.location.datastore, entry.location.path) == (
        "workspaceblobstore",
        "train_20261201_abc/model/",
    )


def test_default_datastore_is_the_one_given() -> None:
    spec = parse_spec(
        outputs("azureml://datastores/${{default_datastore}}/paths/x/"),
        default_datastore="lake",
    )
    assert spec.entry("model").path == "azureml://datastores/lake/paths/x/"


def test_without_a_run_name_is_the_job_name() -> None:
    spec = parse_spec({**outputs("./out/${{name}}/"), "name": "myjob"})
    assert spec.entry("model").path == "./out/myjob/"


@pytest.mark.parametrize("expression", ["bogus", "inputs.x", "parent.outputs.y"])
def test_an_unknown_expression_is_an_error_naming_it(expression: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(outputs(f"azureml://datastores/workspaceblobstore/paths/${{{{{expression}}}}}/"))
    assert info.value.problems == [
        f"outputs.model.path: unknown expression ${{{{{expression}}}}}; {ALLOWED}"
    ]


def test_input_paths_are_left_as_written() -> None:
    spec = parse_spec({"inputs": {"a": {"path": "./data/${{name}}/"}}})
    assert spec.entry("a").path == "./data/${{name}}/"
