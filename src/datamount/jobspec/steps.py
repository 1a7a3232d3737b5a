"""The command job each pipeline step runs as, with its bindings resolved.

A step's inputs are its component's declarations overlaid with the values
the pipeline gives; `${{parent.inputs.x}}` takes the pipeline input's data
(in the step's own mode), `${{parent.jobs.<s>.outputs.<o>}}` the place step
`<s>` writes `<o>` to. A step output lands at
`azureml://datastores/<default>/paths/<pipeline run>/<step>/<output>/`
unless it binds to a pipeline output (then where that one goes, registered
by the pipeline, not the step). Local paths become absolute (relative to
the file they are written in). Pure: no I/O. No threads.
"""

from __future__ import annotations

from typing import Any

from datamount.errors import SpecError, UriError
from datamount.jobspec.graph import output_type
from datamount.jobspec.job import JobSpec, parse_spec
from datamount.jobspec.literals import LITERAL_TYPES, is_primitive
from datamount.jobspec.pipeline import (
    RUNNABLE,
    Pipeline,
    Step,
    absolute,
    binding_of,
    local_file,
)
from datamount.jobspec.typemode import DataType, data_type, default_output_path, expand_output_path
from datamount.jobspec.uris import parse

SCHEMA = "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json"
DECLARED_KEYS = ("type", "mode", "optional", "description")
JOB_KEYS = ("command", "environment_variables", "identity")
EVAL_MODES = {"eval_mount": "ro_mount", "eval_download": "download"}


def parent_output_path(pipeline: Pipeline, name: str, run: str) -> tuple[str, DataType]:
    raw = pipeline.outputs.get(name)
    raw = raw if isinstance(raw, dict) else {}
    kind = data_type(raw.get("type", "uri_folder")) or DataType.URI_FOLDER
    path = raw.get("path")
    if not isinstance(path, str):
        return default_output_path(run, name, kind, pipeline.default_datastore), kind
    problems: list[str] = []
    expanded = expand_output_path(
        path, f"outputs.{name}.path", run_name=run, output=name,
        datastore=pipeline.default_datastore, problems=problems,
    )  # fmt: skip
    if problems:
        raise SpecError(problems)
    return str(absolute({"path": expanded}, pipeline.source.parent)["path"]), kind


def step_outputs(pipeline: Pipeline, step: Step, run: str) -> dict[str, dict[str, Any]]:
    """Every output of `step` as a command-job output entry."""
    result: dict[str, dict[str, Any]] = {}
    declared = step.declared("outputs")
    for name in {**declared, **step.outputs}:
        if is_primitive(declared.get(name)):
            continue  # a value, not data: nothing lands in storage
        decl = declared.get(name) if isinstance(declared.get(name), dict) else {}
        value = step.outputs.get(name)
        entry = {k: v for k, v in (decl or {}).items() if k in DECLARED_KEYS}
        binding = binding_of(value)
        if binding is not None and binding.group == "outputs":
            path, kind = parent_output_path(pipeline, binding.name, run)
            parent = pipeline.outputs.get(binding.name)
            parent = parent if isinstance(parent, dict) else {}
            entry.update({k: v for k, v in parent.items() if k in ("type", "mode")})
            entry.setdefault("type", kind.value)
            entry["path"] = path
        else:
            if isinstance(value, dict):
                entry.update(absolute(value, step.origin or pipeline.source.parent))
            kind = output_type(pipeline, step, name) or DataType.URI_FOLDER
            entry.setdefault("type", kind.value)
            if "path" not in entry:
                where = f"{run}/{step.name.replace('.', '/')}"  # nested: <step>/<inner>
                entry["path"] = default_output_path(where, name, kind, pipeline.default_datastore)
        result[name] = entry
    return result


def step_inputs(
    pipeline: Pipeline, step: Step, run: str, landed: dict[str, dict[str, dict[str, Any]]]
) -> dict[str, Any]:
    """Every input of `step`; `landed`: the outputs of the steps it reads."""
    result: dict[str, Any] = {}
    declared = step.declared("inputs")
    for name in {**declared, **step.inputs}:
        decl_raw = declared.get(name)
        decl = decl_raw if isinstance(decl_raw, dict) else {}
        literal_decl = str(decl.get("type", "")).lower() in LITERAL_TYPES
        value = step.inputs.get(name, decl_raw if name not in step.inputs else None)
        binding = binding_of(value)
        own = {k: v for k, v in value.items() if k != "path"} if isinstance(value, dict) else {}
        if binding is not None and binding.group == "inputs":
            parent = pipeline.inputs.get(binding.name)
            if not isinstance(parent, dict) or str(parent.get("type", "")).lower() in LITERAL_TYPES:
                result[name] = parent if not literal_decl else {**decl, "default": _literal(parent)}
                continue
            entry = absolute(dict(parent), pipeline.source.parent)
            entry.pop("mode", None)
        elif binding is not None and binding.step:
            produced = landed.get(binding.step, {}).get(binding.name, {})
            entry = {"type": produced.get("type", "uri_folder"), "path": produced.get("path")}
        elif isinstance(value, dict) and not literal_decl:
            origin = step.origin or pipeline.source.parent
            entry = absolute(dict(value), origin if name in step.inputs else step.base)
        else:
            result[name] = value if not literal_decl else {**decl, "default": _literal(value)}
            continue
        for source in (decl, own):
            entry.update({k: v for k, v in source.items() if k in DECLARED_KEYS})
        if "type" not in entry and _names_a_model(entry.get("path")):
            entry["type"] = "custom_model"  # untyped, and neither side says: the asset does
        result[name] = entry
    return result


def _names_a_model(path: object) -> bool:
    """A path of a model asset (`azureml://registries/<r>/models/...`, `azureml:`
    model names cannot be told from data ones without a workspace)."""
    if not isinstance(path, str) or not path.startswith("azureml:"):
        return False
    try:
        return parse(path, "path").asset_kind == "model"
    except UriError:
        return False


def _literal(value: Any) -> Any:
    if isinstance(value, dict):
        return value.get("default", value.get("value"))
    return value


def step_job(
    pipeline: Pipeline, step: Step, run: str, landed: dict[str, dict[str, dict[str, Any]]]
) -> dict[str, Any]:
    """The command job (a mapping, as a YAML file would hold it) step `step` runs as."""
    d = step.definition
    job: dict[str, Any] = {"$schema": SCHEMA, "type": "command", "name": step.name}
    job.update({k: d[k] for k in JOB_KEYS if d.get(k) is not None})
    if d.get("code") is not None:
        job["code"] = str((step.base / local_file(str(d["code"]))).resolve())
    job["inputs"] = step_inputs(pipeline, step, run, landed)
    job["outputs"] = step_outputs(pipeline, step, run)
    return job


def data_job(
    pipeline: Pipeline, step: Step, run: str, landed: dict[str, dict[str, dict[str, Any]]]
) -> dict[str, Any]:
    """A step that does not run here (spark, parallel, sweep, automl) as a
    command job holding only its data entries, so they are checked like any
    other's (parallel's `eval_mount`/`eval_download` checked as the mode they
    read like)."""
    entries = {}
    for group, values in (
        ("inputs", step_inputs(pipeline, step, run, landed)),
        ("outputs", step_outputs(pipeline, step, run)),
    ):
        entries[group] = {
            k: {**v, "mode": EVAL_MODES.get(str(v.get("mode")).lower(), v["mode"])}
            if isinstance(v, dict) and "mode" in v
            else v
            for k, v in values.items()
        }
    return {"$schema": SCHEMA, "type": "command", "name": step.name, "command": "true", **entries}


def all_jobs(pipeline: Pipeline, run: str, *, data_only: bool = False) -> dict[str, dict[str, Any]]:
    """The command job of every runnable, checked step, in order (with
    `data_only`, also the data_job of every other checked step)."""
    landed: dict[str, dict[str, dict[str, Any]]] = {}
    jobs = {}
    for name in pipeline.order:
        step = pipeline.steps[name]
        landed[name] = step_outputs(pipeline, step, run)
        if step.type in RUNNABLE and step.checked:
            jobs[name] = step_job(pipeline, step, run, landed)
        elif data_only and step.checked:
            jobs[name] = data_job(pipeline, step, run, landed)
    return jobs


def check_steps(pipeline: Pipeline, run: str) -> dict[str, JobSpec]:
    """Each command step parsed as the job it runs as (and the data entries
    of every other step checked); every problem, each prefixed with its step."""
    problems: list[str] = []
    specs = {}
    try:
        jobs = all_jobs(pipeline, run, data_only=True)
    except SpecError as exc:
        raise SpecError(exc.problems) from None
    for name, job in jobs.items():
        try:
            spec = parse_spec(job, source=pipeline.source, run_name=f"{run}_{name}")
            if pipeline.steps[name].type in RUNNABLE:
                specs[name] = spec
        except SpecError as exc:
            where = pipeline.steps[name].where
            problems += [type(p)(f"{where}: {p}") for p in exc.problems]  # Unreadable stays
    if problems:
        raise SpecError(problems)
    return specs
