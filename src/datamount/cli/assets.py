"""The bodies of the commands about YAML kinds other than one command job:
`validate` of a data asset, a component or a pipeline, `data create`,
`component create`, and the checks `run` makes of a pipeline before
starting any step. Each returns the line to print or raises a
DatamountError; `run` prints it. No threads.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path
from typing import Any

from datamount.cli.parser import PROG
from datamount.errors import InvalidInput, SpecError, only_unreadable
from datamount.jobs import commandjob
from datamount.jobspec.graph import load_pipeline, parse_pipeline, read_yaml
from datamount.jobspec.job import JobSpec, parse_spec
from datamount.jobspec.literals import LITERAL_TYPES, bounds_problems
from datamount.jobspec.pipeline import RUNNABLE, ComponentLookup, Pipeline, Step, local_file
from datamount.jobspec.steps import check_steps
from datamount.jobspec.typemode import DEFAULT_DATASTORE
from datamount.modes.context import Context
from datamount.workspace import kinds
from datamount.workspace.datastores import Workspace


def run(ctx: Context, args: argparse.Namespace) -> None:
    """`data create FILE` or `component create FILE` [--version V]."""
    create = data_create if args.command == "data" else component_create
    print(f"{PROG}: {create(ctx, Path(args.file), args.version)}", file=sys.stderr)


SWEEP = (
    "sweep jobs are not supported (one node runs no hyperparameter search); "
    "run its trial as a command job"
)


def file_kind(path: Path) -> str:
    """The kind of the YAML at `path` ('job' when it cannot be read: jobspec/job.py says why)."""
    try:
        return kinds.kind_of(read_yaml(path, str(path)))
    except InvalidInput:
        return "job"


def validate_file(ctx: Context, path: Path, kind: str) -> str:
    """`validate` of a data asset, component, pipeline or sweep YAML: the line to print."""
    data = read_yaml(path, str(path))
    workspace = ctx.load_workspace(required=False)
    checked = (
        f"checked against {workspace.source}"
        if workspace is not None
        else f"workspace not checked: {ctx.workspace_path()} not found"
    )
    if kind == "sweep":
        raise SpecError(f"{path}: {SWEEP}")
    if kind == "data":
        name, version, type_, where = kinds.check_data(data)
        label = f"{name}:{version}" if version else name
        return f"{path}: valid (data asset {label}, {type_} at {where})"
    if kind == "component":
        name = kinds.check_component(data, path)
        return f"{path}: valid (command component {name}, {len(data.get('inputs') or {})} inputs)"
    component = "pipelinecomponent" in str(data.get("$schema") or "").lower()
    try:
        pipeline, specs = check_pipeline(ctx, path, workspace, data=with_placeholders(data))
    except SpecError as exc:
        if not only_unreadable(exc):
            raise
        for line in exc.problems:
            print(f"{PROG}: warning: {line}", file=sys.stderr)
        return (
            f"{path}: valid for the Azure ML SDK, but {len(exc.problems)} of its paths name "
            "nothing datamount can read (`run` refuses them)"
        )
    what = f"pipeline component {data.get('name')}" if component else "pipeline job"
    unchecked = [s for s in pipeline.steps.values() if not s.checked]
    for step in unchecked:
        registry = kinds.REGISTRY_COMPONENT.match(step.reference or "")
        how = (
            f"declared in the workspace's registries: {registry.group(1)}: components: section"
            if registry
            else "registered: `datamount component create FILE`"
        )
        print(
            f"{PROG}: warning: {step.where}.component: {step.reference} is not in the local "
            f"registry: its interface was not checked (`run` needs it {how})",
            file=sys.stderr,
        )
    for line in pipeline.at_run:
        print(f"{PROG}: warning: {line} (`run` refuses it)", file=sys.stderr)
    names = ", ".join(s.name for s in unchecked)
    note = f"; components not checked: {names}" if unchecked else ""
    steps = f"{len(pipeline.steps)} step{'s' if len(pipeline.steps) != 1 else ''}"
    return f"{path}: valid ({what}, {steps}: {', '.join(pipeline.order)}; {checked}{note})"


def _lookup(workspace: Workspace | None) -> ComponentLookup:
    def lookup(reference: str, where: str) -> tuple[dict[str, Any], Path] | None:
        if workspace is None or workspace.source is None:
            return None
        try:
            return kinds.find_component(workspace, reference, where)
        except kinds.ComponentNotFound:
            return None  # unknown, not empty: `run` refuses it (unregistered)

    return lookup


def with_placeholders(data: dict[str, Any]) -> dict[str, Any]:
    """A pipeline (component) whose data inputs without a path or default get
    a placeholder path, so its steps can be checked as jobs."""
    inputs = data.get("inputs")
    if not isinstance(inputs, dict):
        return data
    filled = {}
    for key, value in inputs.items():
        if (
            isinstance(value, dict)
            and str(value.get("type", "uri_folder")).lower() not in LITERAL_TYPES
            and "path" not in value
            and "default" not in value
        ):
            value = {**value, "path": kinds.PLACEHOLDER}
        filled[key] = value
    return {**data, "inputs": filled}


def check_pipeline(
    ctx: Context,
    path: Path,
    workspace: Workspace | None,
    run: str = "validate",
    data: dict[str, Any] | None = None,
) -> tuple[Pipeline, dict[str, JobSpec]]:
    lookup = _lookup(workspace)
    pipeline = load_pipeline(path, lookup) if data is None else parse_pipeline(data, path, lookup)
    if "default_datastore" not in pipeline.settings and workspace is not None:
        default = (workspace.config.model_extra or {}).get("default_datastore")
        if default:
            pipeline.settings["default_datastore"] = str(default)
    return pipeline, check_steps(pipeline, run)


def prepare_run(ctx: Context, path: Path) -> tuple[Pipeline, dict[str, dict[str, Any]]]:
    """Everything `run` checks of a pipeline before any step starts: the
    graph, every step as a job, and each step's data (commandjob.check)."""
    from datamount.jobspec.steps import all_jobs

    workspace = ctx.load_workspace(required=False)
    run = ctx.run_name or path.stem
    pipeline, specs = check_pipeline(ctx, path, workspace, run)
    problems: list[str] = []
    for name, step in pipeline.steps.items():
        if step.type not in RUNNABLE:
            problems.append(
                f"jobs.{name}: a {step.type} step cannot run on one node (`validate` accepts it)"
            )
        elif not step.checked:
            problems.append(unregistered(workspace, step))
    problems += pipeline.at_run
    for name, job in all_jobs(pipeline, run).items():
        problems += bounds_problems(job.get("inputs") or {}, pipeline.steps[name].where)
    if problems:
        raise SpecError(problems)
    for name, spec in specs.items():
        try:
            commandjob.check(ctx, spec)
        except InvalidInput as exc:
            problems += [f"jobs.{name}: {p}" for p in exc.problems]
    if problems:
        raise SpecError(problems)
    return pipeline, all_jobs(pipeline, run)


def unregistered(workspace: Workspace | None, step: Step) -> str:
    """Why `run` cannot run a step whose component is not known here."""
    reference = step.reference or "its component"
    if workspace is None or workspace.source is None:
        return (
            f"{step.where}.component: {reference} needs a workspace file with it registered "
            "(`datamount component create FILE`)"
        )
    try:
        kinds.find_component(workspace, reference, step.where)
    except InvalidInput as exc:
        return str(exc)
    return f"{step.where}.component: {reference} is not in the local registry"


def data_create(ctx: Context, path: Path, version: str | None) -> str:
    """`data create FILE`: register the data asset (a local path uploaded first)."""
    from datamount.jobspec.uris import LocationKind, parse
    from datamount.modes import download
    from datamount.workspace.registry import register

    data = read_yaml(path, str(path))
    name, chosen, type_, where = kinds.check_data(data, version)
    workspace = ctx.workspace()
    target = where
    if parse(where, "path").kind is LocationKind.LOCAL:
        local = (path.parent / where).resolve()
        if not local.exists():
            raise SpecError(f"path: {local} does not exist")
        store = (workspace.config.model_extra or {}).get("default_datastore") or DEFAULT_DATASTORE
        # A fresh folder per upload, as Azure ML's LocalUpload/<id>/: a later
        # version never overwrites the bytes an earlier one points at.
        folder = f"azureml://datastores/{store}/paths/LocalUpload/{uuid.uuid4().hex}/"
        target = folder + local.name if local.is_file() else folder
        download.upload(ctx, local, target)
    registered = register(
        workspace, name, chosen or None, type_=type_, path=target,
        description=data.get("description"),
    )  # fmt: skip
    return f"registered data asset {name}:{registered} ({type_} at {target})"


def component_create(ctx: Context, path: Path, version: str | None) -> str:
    from datamount.workspace.registry import register_component

    data = read_yaml(path, str(path))
    name = kinds.check_component(data, path)
    chosen = version if version is not None else data.get("version")
    stored = dict(data)
    if stored.get("code") is not None:
        stored["code"] = str((path.parent / local_file(str(stored["code"]))).resolve())
    registered = register_component(
        ctx.workspace(), name, None if chosen is None else str(chosen), stored
    )
    return f"registered component {name}:{registered}"


__all__ = ["SWEEP", "component_create", "data_create", "file_kind", "parse_spec", "prepare_run"]
