"""The Azure ML SDK as the oracle for the kinds beside command jobs:
pipelines (`load_job`), components (`load_component`) and data assets
(`load_data`), under tests/specs/kinds/ (`.yaml`, so the job corpus of
test_spec_oracle.py does not take them). Headers as there, plus
`# loader: job|component|data`. Offline: any connection beyond loopback
fails the test. Also unit tests of the graph (order, cycle, bindings).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest

from datamount.cli import assets
from datamount.cli.validate import validate
from datamount.errors import InvalidInput, SpecError
from datamount.jobspec.graph import parse_pipeline
from datamount.modes.context import Context
from datamount.settings import Settings
from test_spec_oracle import _header, no_network  # noqa: F401  (the fixture)

KINDS = sorted((Path(__file__).resolve().parent / "specs" / "kinds").glob("*.yaml"))


def loader(name: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from azure.ai import ml
    logging.getLogger("azure.ai.ml").setLevel(logging.CRITICAL)
    return {"job": ml.load_job, "component": ml.load_component, "data": ml.load_data}[name]


def loader_of(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("# loader:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"{path}: no `# loader:` line")


def verdict(path: Path, tmp_path: Path) -> str:
    environ = {"HOME": str(tmp_path)}
    settings = Settings.from_env(
        environ, cache_dir=str(tmp_path / "cache"), log_dir=str(tmp_path / "logs")
    )
    ctx = Context(settings, environ, tmp_path)
    try:
        kind = assets.file_kind(path)
        if kind == "job":
            validate(ctx, path)
        else:
            assets.validate_file(ctx, path, kind)
    except InvalidInput:
        return "reject"
    return "accept"


@pytest.mark.oracle
@pytest.mark.usefixtures("no_network")
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("path", KINDS, ids=lambda p: p.name)
def test_same_verdict_as_the_sdk(path: Path, tmp_path: Path) -> None:
    header = _header(path)
    try:
        loader(loader_of(path))(path)
        sdk = "accept"
    except Exception:  # the SDK raises marshmallow and its own errors alike
        sdk = "reject"
    assert sdk == header["sdk"], f"the SDK now says {sdk}: fix the corpus header"
    expected = sdk if "deliberate" not in header else ("reject" if sdk == "accept" else "accept")
    assert verdict(path, tmp_path) == expected, header.get("deliberate", "disagree")


@pytest.mark.unit
def test_the_kinds_are_named_in_the_message(tmp_path: Path) -> None:
    settings = Settings.from_env({}, cache_dir=str(tmp_path / "c"), log_dir=str(tmp_path / "l"))
    ctx = Context(settings, {}, tmp_path)
    kinds = {p.name: p for p in KINDS}
    line = assets.validate_file(ctx, kinds["data-ok.yaml"], "data")
    assert "valid (data asset mydata:1, uri_folder" in line
    assert "command component prep" in assets.validate_file(
        ctx, kinds["component-ok.yaml"], "component"
    )
    line = assets.validate_file(ctx, kinds["pipeline-ok.yaml"], "pipeline")
    assert "valid (pipeline job, 2 steps: prep, a;" in line
    with pytest.raises(SpecError, match="sweep jobs are not supported"):
        assets.validate_file(ctx, kinds["sweep-job.yaml"], "sweep")


def cmd(inputs: dict | None = None, outputs: dict | None = None) -> dict:
    return {"type": "command", "command": "true", "inputs": inputs or {}, "outputs": outputs or {}}


def out(step: str, name: str = "o") -> str:
    return f"${{{{parent.jobs.{step}.outputs.{name}}}}}"


@pytest.mark.unit
def test_steps_run_in_dependency_order() -> None:
    jobs = {
        "join": cmd({"a": out("left"), "b": out("right")}),
        "left": cmd({"x": out("src")}, {"o": {}}),
        "right": cmd({"x": out("src")}, {"o": {}}),
        "src": cmd({}, {"o": {}}),
    }
    pipeline = parse_pipeline({"type": "pipeline", "jobs": jobs}, Path("/p/pipe.yml"))
    assert pipeline.order == ["src", "left", "right", "join"]
    assert pipeline.steps["join"].depends_on() == {"left", "right"}


@pytest.mark.unit
def test_a_cycle_and_bad_bindings_are_one_line_each() -> None:
    jobs = {
        "a": cmd({"x": out("b")}, {"o": {"type": "uri_folder"}}),
        "b": cmd({"x": out("a")}, {"o": {}}),
        "c": cmd({"x": out("a", "zz"), "p": "${{parent.inputs.nope}}",
                  "f": {"type": "mlflow_model", "path": out("a")}},
                 {"q": "${{parent.outputs.nope}}"}),
    }  # fmt: skip
    with pytest.raises(SpecError) as caught:
        parse_pipeline({"type": "pipeline", "jobs": jobs}, Path("/p/pipe.yml"))
    assert sorted(caught.value.problems) == sorted([
        "jobs: a cycle: a -> b -> a",
        "jobs.c.inputs.x: step a has no output 'zz' (outputs: o)",
        "jobs.c.inputs.p: ${{parent.inputs.nope}} names no pipeline input (declared: none)",
        "jobs.c.outputs.q: ${{parent.outputs.nope}} names no pipeline output (declared: none)",
    ])  # fmt: skip
    # A type mismatch across a binding: the SDK's load accepts it, `run` refuses it.
    del jobs["b"], jobs["c"]["inputs"]["x"], jobs["c"]["inputs"]["p"], jobs["c"]["outputs"]
    jobs["a"] = cmd({}, {"o": {"type": "uri_folder"}})
    pipeline = parse_pipeline({"type": "pipeline", "jobs": jobs}, Path("/p/pipe.yml"))
    assert pipeline.at_run == [
        "jobs.c.inputs.f: ${{parent.jobs.a.outputs.o}} is a uri_folder, but the input is a "
        "mlflow_model"
    ]


@pytest.mark.unit
def test_a_nested_pipeline_is_flattened_and_checked_across_levels(tmp_path: Path) -> None:
    import yaml

    sub = {"type": "pipeline", "inputs": {"x": {"type": "uri_folder"}},
           "outputs": {"y": {"type": "uri_folder"}},
           "jobs": {"a": cmd({"x": "${{parent.inputs.x}}"}, {"o": "${{parent.outputs.y}}"}),
                    "b": cmd({"x": out("a")}, {"o": {}})}}  # fmt: skip
    (tmp_path / "sub.yml").write_text(yaml.safe_dump(sub))
    nest = {"type": "pipeline", "component": "./sub.yml"}
    jobs = {
        "src": cmd({}, {"o": {}}),
        "s": {**nest, "inputs": {"x": out("src")}},
        "last": cmd({"x": out("s", "y")}),
    }
    pipeline = parse_pipeline({"type": "pipeline", "jobs": jobs}, tmp_path / "p.yml")
    assert pipeline.order == ["src", "s.a", "s.b", "last"]
    assert pipeline.steps["s.a"].inputs == {"x": out("src")}
    assert pipeline.steps["s.b"].inputs == {"x": out("s.a")}
    assert pipeline.steps["last"].inputs == {"x": out("s.a")}
    assert pipeline.steps["s.b"].where == "jobs.s.jobs.b"
    bad = {
        "src": cmd({"x": out("s", "y")}, {"o": {}}),  # a cycle through the nested pipeline
        "s": {**nest, "inputs": {"x": out("src"), "zz": 1}},
        "last": cmd({"x": out("s", "nope")}),
    }
    with pytest.raises(SpecError) as caught:
        parse_pipeline({"type": "pipeline", "jobs": bad}, tmp_path / "p.yml")
    assert sorted(caught.value.problems) == sorted([
        "jobs: a cycle: src -> s -> src",
        "jobs.last.inputs.x: step s has no output 'nope' (outputs: y)",
    ])  # fmt: skip
    typed = {**sub, "inputs": {"x": {"type": "uri_file"}}}
    (tmp_path / "sub.yml").write_text(yaml.safe_dump(typed))
    typed_pipeline = parse_pipeline({"type": "pipeline", "jobs": jobs}, tmp_path / "p.yml")
    assert typed_pipeline.at_run == [
        "jobs.s.inputs.x: ${{parent.jobs.src.outputs.o}} is a uri_folder, but the input is a "
        "uri_file",
    ]
    (tmp_path / "sub.yml").write_text(yaml.safe_dump(sub))
    with pytest.raises(SpecError) as caught:
        parse_pipeline({"type": "pipeline", "jobs": {**jobs, "s": {**nest, "inputs": {
            "x": out("src"), "zz": 1}}}}, tmp_path / "p.yml")  # fmt: skip
    assert caught.value.problems == [
        "jobs.s.inputs.zz: the nested pipeline has no input 'zz' (inputs: x)"
    ]


@pytest.mark.unit
def test_registry_and_workspace_components_are_looked_up(tmp_path: Path) -> None:
    import yaml

    kinds = {p.name: p for p in KINDS}
    prep = yaml.safe_load(kinds["component-ok.yaml"].read_text())
    (tmp_path / "prep.yml").write_text(yaml.safe_dump(prep))
    ws = tmp_path / "ws.yaml"
    ws.write_text(yaml.safe_dump({
        "registries": {"shared": {"components": {"prep": [
            {"version": "1", "path": "prep.yml"},
            {"version": "2", "component": {**prep, "command": "echo two ${{inputs.raw}}"}},
        ]}}},
        "components": {"local": [{"version": "3", "component": {**prep, "command": "echo 3"}}]},
    }))  # fmt: skip
    settings = Settings.from_env({}, cache_dir=str(tmp_path / "c"), log_dir=str(tmp_path / "l"))
    path = kinds["pipeline-registry-component.yaml"]
    bare = assets.validate_file(Context(settings, {}, tmp_path), path, "pipeline")
    assert "workspace not checked" in bare and "components not checked: a, b" in bare
    ctx = Context(settings, {}, tmp_path, str(ws))
    assert "components not checked" not in assets.validate_file(ctx, path, "pipeline")
    data = yaml.safe_load(path.read_text())
    data["jobs"]["c"] = {"component": "azureml:local@latest", "inputs": {"raw": out("b", "out")}}
    workspace = ctx.load_workspace(required=True)
    assert workspace is not None
    pipeline, _ = assets.check_pipeline(ctx, path, workspace, data=data)
    steps = pipeline.steps
    assert steps["a"].definition["command"] == prep["command"] and steps["a"].base == tmp_path
    assert steps["b"].definition["command"].startswith("echo two")  # labels/latest: version 2
    assert steps["c"].definition["command"] == "echo 3"
    # Not in the local registry: unknown, not empty: validate goes on, `run` says why not.
    for ref, why in (
        ("azureml://registries/other/components/prep/versions/1",
         "component 'prep' of registry 'other': the registry is not in the workspace's registries: section (registries: shared)"),
        ("azureml://registries/shared/components/prep/versions/9",
         "component 'prep' has no version '9' in registry shared (versions: 1, 2)"),
        ("azureml:nowhere:1", "component 'nowhere' is not registered in"),
    ):  # fmt: skip
        data["jobs"]["d"] = {"component": ref, "inputs": {"anything": out("c", "out")}}
        pipeline, _ = assets.check_pipeline(ctx, path, workspace, data=data)
        assert not pipeline.steps["d"].checked and pipeline.steps["d"].reference == ref
        assert why in assets.unregistered(workspace, pipeline.steps["d"])


@pytest.mark.unit
def test_file_prefix_on_component_and_code_paths(tmp_path: Path) -> None:
    """`component: file:./x.yml` and `code: file:./src`, as AutoML pipelines write them."""
    import yaml

    from datamount.jobspec.steps import step_job

    (tmp_path / "src").mkdir()
    component = {"type": "command", "command": "echo", "code": "file:./src"}
    (tmp_path / "c.yml").write_text(yaml.safe_dump(component))
    pipeline = parse_pipeline(
        {"type": "pipeline", "jobs": {"a": {"component": "file:./c.yml"}}}, tmp_path / "p.yml"
    )
    assert pipeline.steps["a"].source == tmp_path / "c.yml"
    assert step_job(pipeline, pipeline.steps["a"], "r", {})["code"] == str(tmp_path / "src")
