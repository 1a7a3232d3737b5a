"""A pipeline job's graph: its steps, their bindings, the order they run in,
and every check that can be made before anything runs.

`load_pipeline(path, run_name=..., components=...)` reads a `type: pipeline`
YAML; each step is given inline (`type: command`), by file
(`component: ./file.yml`), inline (`component: {...}`) or by registered name
(`component: azureml:<name>:<version>`, looked up through the `components`
callable); a step whose component is a pipeline is flattened (nested.py).
Bindings are `${{parent.inputs.x}}`, `${{parent.outputs.y}}` and
`${{parent.jobs.<step>.outputs.<o>}}`. Every problem (a cycle, a binding to
an unknown step or output, a type mismatch, a bad step) is one line of the
SpecError raised. `Step.job()` is the command job a step runs as (steps.py
builds it). Pure: no I/O beyond reading the YAML files. No threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datamount import yamlfile
from datamount.errors import SpecError
from datamount.jobspec.literals import LITERAL_TYPES
from datamount.jobspec.nested import flatten
from datamount.jobspec.pipeline import (
    STEP_TYPES,
    Binding,
    ComponentLookup,
    Pipeline,
    Step,
    binding_of,
    local_file,
)
from datamount.jobspec.typemode import DataType, asset_kind, data_type


def read_yaml(path: Path, what: str) -> dict[str, Any]:
    """The mapping in the YAML file at `path`; `what` names it in errors
    (the file itself, or the pipeline field that names it)."""
    label = str(path) if what == str(path) else f"{what}: {path}"
    data = yamlfile.load(path, label, SpecError)
    if not isinstance(data, dict):
        raise SpecError(f"{label}: expected a YAML mapping at the top level")
    return data


def load_pipeline(path: Path, components: ComponentLookup | None = None) -> Pipeline:
    return parse_pipeline(read_yaml(path, str(path)), path, components)


def parse_pipeline(
    data: dict[str, Any],
    source: Path,
    components: ComponentLookup | None = None,
    stack: tuple[Path, ...] = (),
) -> Pipeline:
    """The pipeline `data` (read from `source`); `stack`: the files of the
    pipelines that hold it (a nested pipeline holding itself is an error)."""
    problems: list[str] = []
    jobs = data.get("jobs") or {}
    if not isinstance(jobs, dict):
        raise SpecError("jobs: expected a mapping of step names to steps")
    settings = data.get("settings") or {}
    pipeline = Pipeline(
        source=source,
        name=str(data.get("name") or data.get("display_name") or source.stem),
        inputs=_section(data, "inputs", problems),
        outputs=_section(data, "outputs", problems),
        settings=settings if isinstance(settings, dict) else {},
        steps={},
        order=[],
    )
    if not stack and "pipelinecomponent" not in str(data.get("$schema") or "").lower():
        _check_pipeline_inputs(pipeline, problems)
    for name, raw in jobs.items():
        step = _step(str(name), raw, source.parent, components, problems)
        if step is not None:
            pipeline.steps[str(name)] = step
    nested = []
    for step in pipeline.steps.values():
        before = len(problems)
        _check_bindings(pipeline, step, problems)
        if step.type == "pipeline" and step.checked and len(problems) == before:
            nested.append(step.name)
    order(pipeline.steps, problems)  # a cycle among the steps of this level
    if nested and not problems:
        outer = set(pipeline.steps)

        def parse(d: dict[str, Any], s: Path, st: tuple[Path, ...]) -> Pipeline:
            return parse_pipeline(d, s, components, st)

        flatten(pipeline, nested, parse, stack or (source.resolve(),), problems)
        for step in pipeline.steps.values():
            if step.name not in outer:  # the inner steps, checked at this level
                _check_bindings(pipeline, step, problems)
    pipeline.order = order(pipeline.steps, [])  # no new cycle: each level has none
    if problems:
        raise SpecError(problems)
    return pipeline


def _check_pipeline_inputs(pipeline: Pipeline, problems: list[str]) -> None:
    """A pipeline job's literal inputs take `type`, `default`, `description`
    and `optional`; `enum`, `min` and `max` belong to a component's inputs
    (the SDK's PipelineJobSchema refuses them on the job)."""
    for name, value in pipeline.inputs.items():
        if not isinstance(value, dict) or str(value.get("type", "")).lower() not in LITERAL_TYPES:
            continue
        extra = sorted({"enum", "min", "max"} & value.keys())
        if extra:
            problems.append(
                f"inputs.{name}: {', '.join(extra)} is declared on a component's inputs, "
                "not on a pipeline job's"
            )


def _section(data: dict[str, Any], key: str, problems: list[str]) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        problems.append(f"{key}: expected a mapping of names to entries")
        return {}
    return {str(k): v for k, v in value.items()}


def _step(
    name: str, raw: object, base: Path, components: ComponentLookup | None, problems: list[str]
) -> Step | None:
    where = f"jobs.{name}"
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping (a step)")
        return None
    definition: dict[str, Any] = raw
    step_base = base
    checked = True
    source = None
    component = raw.get("component")
    if isinstance(component, dict):
        definition = component
    elif isinstance(component, str):
        if component.startswith("azureml:"):
            found = components(component, where) if components else None
            if found is None:
                definition, checked = {}, False
            else:
                definition, step_base = found
        else:
            file = (base / local_file(component)).resolve()
            definition = read_yaml(file, f"{where}.component")
            step_base, source = file.parent, file
    elif component is not None:
        problems.append(
            f"{where}.component: expected a file, azureml:<name>:<version> or a mapping"
        )
        return None
    kind = str(raw.get("type") or definition.get("type") or "command").lower()
    if kind not in STEP_TYPES:
        problems.append(f"{where}.type: {kind!r} is not a step type ({', '.join(STEP_TYPES)})")
        return None
    inputs, outputs = raw.get("inputs") or {}, raw.get("outputs") or {}
    if not isinstance(inputs, dict) or not isinstance(outputs, dict):
        problems.append(f"{where}: inputs and outputs are mappings of names to entries")
        return None
    if kind == "pipeline" and definition is raw:
        problems.append(f"{where}: a pipeline step names its pipeline in `component:` (a file)")
        return None
    if kind == "pipeline" and checked and not isinstance(definition.get("jobs"), dict):
        problems.append(f"{where}: a pipeline step needs a pipeline (with `jobs:`) as component")
        return None
    reference = component if isinstance(component, str) and not checked else None
    return Step(
        name, kind, definition, step_base, dict(inputs), dict(outputs), checked,
        source=source, reference=reference,
    )  # fmt: skip


def _check_bindings(pipeline: Pipeline, step: Step, problems: list[str]) -> None:
    where = step.where
    for group in ("inputs", "outputs"):
        values = step.inputs if group == "inputs" else step.outputs
        for key, value in values.items():
            binding = binding_of(value)
            here = f"{where}.{group}.{key}"
            if binding is None:
                continue
            if group == "outputs" and binding.group != "outputs":
                problems.append(f"{here}: an output binds to ${{{{parent.outputs.<name>}}}} only")
            elif binding.group in ("inputs", "outputs"):
                parent = pipeline.inputs if binding.group == "inputs" else pipeline.outputs
                if binding.name not in parent:
                    known = ", ".join(sorted(parent)) or "none"
                    what = binding.group[:-1]
                    problems.append(
                        f"{here}: {binding} names no pipeline {what} (declared: {known})"
                    )
            else:
                _check_step_output(pipeline, step, key, value, binding, here, problems)


def _check_step_output(
    pipeline: Pipeline,
    step: Step,
    key: str,
    value: object,
    binding: Binding,
    here: str,
    problems: list[str],
) -> None:
    producer = pipeline.steps.get(binding.step or "")
    if producer is None or binding.step == "?":
        known = ", ".join(sorted(pipeline.steps)) or "none"
        problems.append(f"{here}: {binding} names no step (steps: {known})")
        return
    if not producer.checked:
        return
    outputs = {**producer.declared("outputs"), **producer.outputs}
    if binding.name not in outputs:
        known = ", ".join(sorted(outputs)) or "none"
        problems.append(
            f"{here}: step {producer.name} has no output {binding.name!r} (outputs: {known})"
        )
        return
    made = output_type(pipeline, producer, binding.name)
    wanted = None
    if isinstance(value, dict) and "type" in value:
        wanted = data_type(value["type"])
    elif step.checked:
        declared = step.declared("inputs").get(key)
        if isinstance(declared, dict) and "type" in declared:
            wanted = data_type(declared["type"])
    if made is not None and wanted is not None and not compatible(made, wanted):
        # The SDK's load does not check types across bindings: refused at run only.
        pipeline.at_run.append(
            f"{here}: {binding} is a {made.value}, but the input is a {wanted.value}"
        )


def output_type(pipeline: Pipeline, step: Step, name: str) -> DataType | None:
    """The type of output `name` of `step` (its own, its declaration's, or
    the parent output it binds to; uri_folder by default)."""
    for raw in (step.outputs.get(name), step.declared("outputs").get(name)):
        if isinstance(raw, dict) and "type" in raw:
            return data_type(raw["type"])
        binding = binding_of(raw)
        if binding is not None and binding.group == "outputs":
            parent = pipeline.outputs.get(binding.name)
            if isinstance(parent, dict) and "type" in parent:
                return data_type(parent["type"])
    return DataType.URI_FOLDER


def compatible(made: DataType, wanted: DataType) -> bool:
    """A step output can feed an input of the same kind (data or model) and
    the same shape (a file, or a folder: an MLTable or a model is a folder)."""
    if asset_kind(made) != asset_kind(wanted):
        return False
    return (made is DataType.URI_FILE) == (wanted is DataType.URI_FILE)


def order(steps: dict[str, Step], problems: list[str]) -> list[str]:
    """The steps in dependency order (declaration order among ready steps);
    a cycle is one problem naming it, and the steps in it are left out."""
    deps = {name: {d for d in step.depends_on() if d in steps} for name, step in steps.items()}
    done: list[str] = []
    remaining = dict(deps)
    while remaining:
        ready = [n for n, d in remaining.items() if d <= set(done)]
        if not ready:
            problems.append(f"jobs: a cycle: {' -> '.join(_cycle(remaining))}")
            break
        for name in ready:
            done.append(name)
            del remaining[name]
    return done


def _cycle(deps: dict[str, set[str]]) -> list[str]:
    """One cycle among `deps` (each left step waits for another left one)."""
    start = next(iter(deps))
    path = [start]
    while True:
        nxt = sorted(d for d in deps[path[-1]] if d in deps)[0]
        if nxt in path:
            return [*path[path.index(nxt) :], nxt][::-1]
        path.append(nxt)
