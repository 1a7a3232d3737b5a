"""Nested pipelines, flattened into the pipeline that holds them.

A step whose component is itself a pipeline (`component: ./sub.yml`, or
given inline) is replaced by the steps of that pipeline, named
`<step>.<inner step>` (`jobs.<step>.jobs.<inner step>` in messages). Inside
it, `${{parent.inputs.x}}` becomes what the outer step gives its input `x`
(or the nested pipeline's default), `${{parent.outputs.y}}` what the outer
step binds its output `y` to (else the inner step's output lands at
`<run>/<step>/<inner step>/<output>/`), and `${{parent.jobs.a...}}` names
the renamed sibling. A later outer step's `${{parent.jobs.<step>.outputs.y}}`
then names the inner step output that `y` is bound to. So every step of
every level is one node of one graph: one order, one parallelism bound, one
cycle check. The nested pipeline's `settings` are not used (the outer
pipeline's apply). Pure: no I/O beyond reading YAML files. No threads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from datamount.errors import SpecError
from datamount.jobspec.pipeline import Binding, Pipeline, Step, absolute, binding_of

MISSING = object()
# (nested pipeline step, its output) -> (inner step, its output)
Aliases = dict[tuple[str, str], tuple[str, str]]
Parse = Callable[[dict[str, Any], Path, tuple[Path, ...]], Pipeline]


def rebind(value: object, new: object) -> object:
    """`value` (a binding string, or a mapping with a binding `path`) with
    its binding replaced by `new` (a string, a mapping or a literal)."""
    if not isinstance(value, dict):
        return new
    own = {k: v for k, v in value.items() if k != "path"}
    if isinstance(new, dict):
        return {**new, **own}
    if isinstance(new, str):
        return {**own, "path": new}
    return new


def flatten(
    pipeline: Pipeline, nested: list[str], parse: Parse, stack: tuple[Path, ...],
    problems: list[str],
) -> None:  # fmt: skip
    """Replace each step named in `nested` by its pipeline's steps, in place."""
    aliases: Aliases = {}
    flat: dict[str, Step] = {}
    expanded: set[str] = set()
    for name, step in pipeline.steps.items():
        if name not in nested:
            flat[name] = step
            continue
        inner = _inner(pipeline, step, parse, stack, problems)
        if inner is None:
            continue
        expanded.add(name)
        for inner_step in _expand(pipeline, step, inner, aliases):
            flat[inner_step.name] = inner_step
    for step in flat.values():
        for key, value in list(step.inputs.items()):
            binding = binding_of(value)
            if binding is None or binding.step not in expanded:
                continue
            target = aliases.get((binding.step, binding.name))
            if target is None:
                problems.append(
                    f"{step.where}.inputs.{key}: {binding}: the nested pipeline {binding.step} "
                    f"binds no step output to its output {binding.name!r}"
                )
                continue
            step.inputs[key] = rebind(value, str(Binding("jobs", target[1], target[0])))
    pipeline.steps = flat


def _inner(
    pipeline: Pipeline, step: Step, parse: Parse, stack: tuple[Path, ...], problems: list[str]
) -> Pipeline | None:
    source = step.source or pipeline.source
    if step.source is not None and step.source in stack:
        chain = " -> ".join(p.name for p in (*stack[stack.index(step.source) :], step.source))
        problems.append(f"{step.where}.component: a pipeline that holds itself: {chain}")
        return None
    try:
        inner = parse(step.definition, source, (*stack, source) if step.source else stack)
    except SpecError as exc:
        problems += [f"{step.where}.{p}" for p in exc.problems]
        return None
    pipeline.at_run += [f"{step.where}.{p}" for p in inner.at_run]
    for key in step.outputs:
        if key not in inner.outputs:
            known = ", ".join(sorted(inner.outputs)) or "none"
            problems.append(
                f"{step.where}.outputs.{key}: the nested pipeline has no output {key!r} "
                f"(outputs: {known})"
            )
    for key in step.inputs:
        if key not in inner.inputs:
            known = ", ".join(sorted(inner.inputs)) or "none"
            problems.append(
                f"{step.where}.inputs.{key}: the nested pipeline has no input {key!r} "
                f"(inputs: {known})"
            )
    return inner


def _given_inputs(pipeline: Pipeline, step: Step, inner: Pipeline) -> dict[str, Any]:
    """What each input of the nested pipeline is: the outer step's value
    (local paths made absolute), else the nested declaration's default."""
    given: dict[str, Any] = {}
    origin = step.origin or pipeline.source.parent
    for key, decl in inner.inputs.items():
        if key in step.inputs:
            given[key] = absolute(step.inputs[key], origin)
        elif isinstance(decl, dict) and "default" in decl:
            given[key] = decl["default"]
        elif isinstance(decl, dict) and "path" in decl:
            given[key] = absolute(dict(decl), inner.source.parent)
        elif not isinstance(decl, dict):
            given[key] = decl  # a literal written as the input itself
        else:
            given[key] = MISSING
    return given


def _expand(pipeline: Pipeline, step: Step, inner: Pipeline, aliases: Aliases) -> list[Step]:
    given = _given_inputs(pipeline, step, inner)
    origin = step.origin or pipeline.source.parent
    result = []
    for inner_step in inner.steps.values():
        new = f"{step.name}.{inner_step.name}"
        inputs: dict[str, Any] = {}
        for key, value in inner_step.inputs.items():
            binding = binding_of(value)
            if binding is not None and binding.step:
                inputs[key] = rebind(
                    value, str(Binding("jobs", binding.name, f"{step.name}.{binding.step}"))
                )
            elif binding is not None and binding.group == "inputs":
                replacement = given.get(binding.name, MISSING)
                if replacement is not MISSING:
                    inputs[key] = rebind(value, replacement)
            else:
                inputs[key] = value
        outputs: dict[str, Any] = {}
        for key, value in inner_step.outputs.items():
            binding = binding_of(value)
            if binding is None or binding.group != "outputs":
                outputs[key] = value
                continue
            aliases[(step.name, binding.name)] = (new, key)
            bound = step.outputs.get(binding.name)
            if bound is not None:
                outputs[key] = rebind(value, absolute(bound, origin))
            else:
                decl = inner.outputs.get(binding.name)
                kept = {k: v for k, v in (decl or {}).items() if k in ("type", "mode")}
                own = value if isinstance(value, dict) else {}
                outputs[key] = {**kept, **{k: v for k, v in own.items() if k != "path"}}
        origin_inner = inner_step.origin or inner.source.parent
        result.append(
            Step(
                new,
                inner_step.type,
                inner_step.definition,
                inner_step.base,
                inputs,
                outputs,
                inner_step.checked,
                source=inner_step.source,
                origin=origin_inner,
            )  # fmt: skip
        )
    return result
