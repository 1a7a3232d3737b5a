"""A pipeline job's model: its steps, their bindings (`${{parent.inputs.x}}`,
`${{parent.outputs.y}}`, `${{parent.jobs.<step>.outputs.<o>}}`) and the
pipeline that holds them. graph.py parses and checks a pipeline into these;
nested.py flattens nested pipelines; steps.py builds the command job a step
runs as. Pure values: no I/O, no threads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datamount.jobspec.typemode import DEFAULT_DATASTORE

BINDING = re.compile(r"^\$\{\{\s*parent\.(inputs|outputs|jobs)\.([^}]*?)\s*\}\}$")
# A step name; `<outer>.<inner>` for a step of a nested pipeline (nested.py).
STEP_OUTPUT = re.compile(r"^([A-Za-z0-9_.-]+?)\.outputs\.([A-Za-z0-9_]+)$")
# Step types the SDK accepts; only command steps (and nested pipelines) run on one node.
STEP_TYPES = (
    "command",
    "pipeline",
    "sweep",
    "parallel",
    "spark",
    "automl",
    "import",
    "data_transfer",
)
RUNNABLE = ("command",)

# Looks up a registered component: (reference, where) -> (definition, base folder)
ComponentLookup = Callable[[str, str], "tuple[dict[str, Any], Path] | None"]


@dataclass(frozen=True)
class Binding:
    """`${{parent.inputs.x}}` (group 'inputs'), `${{parent.outputs.y}}`
    ('outputs') or `${{parent.jobs.<step>.outputs.<o>}}` ('jobs', step set)."""

    group: str
    name: str
    step: str | None = None

    def __str__(self) -> str:
        inner = (
            f"jobs.{self.step}.outputs.{self.name}" if self.step else f"{self.group}.{self.name}"
        )
        return f"${{{{parent.{inner}}}}}"


@dataclass
class Step:
    """One step: its declaration (the component's inputs/outputs/command) and
    what the pipeline gives it (values and bindings)."""

    name: str
    type: str
    definition: dict[str, Any]  # the component (or inline job): inputs, outputs, command...
    base: Path  # the folder its relative paths (code, local data) are relative to
    inputs: dict[str, Any] = field(default_factory=dict)  # the step's values
    outputs: dict[str, Any] = field(default_factory=dict)
    checked: bool = True  # False: a registered component not known here (its interface unknown)
    source: Path | None = None  # the component's file, when it was given by file
    origin: Path | None = None  # where its values are relative to (None: the pipeline's)
    reference: str | None = None  # `component:` as written, when it names a registered one

    @property
    def where(self) -> str:
        """`jobs.<step>` (`jobs.<outer>.jobs.<inner>` in a nested pipeline)."""
        return "jobs." + ".jobs.".join(self.name.split("."))

    def declared(self, group: str) -> dict[str, Any]:
        value = self.definition.get(group) or {}
        return value if isinstance(value, dict) else {}

    def depends_on(self) -> set[str]:
        return {b.step for b in self.bindings("inputs") if b.step}

    def bindings(self, group: str) -> list[Binding]:
        found = []
        for value in (self.inputs if group == "inputs" else self.outputs).values():
            binding = binding_of(value)
            if binding is not None:
                found.append(binding)
        return found


@dataclass
class Pipeline:
    source: Path
    name: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    settings: dict[str, Any]
    steps: dict[str, Step]
    order: list[str]
    # Found by the checks, refused only when the pipeline runs: what the SDK's
    # load accepts (a type mismatch across a binding), one line each.
    at_run: list[str] = field(default_factory=list)

    @property
    def default_datastore(self) -> str:
        raw = str(self.settings.get("default_datastore") or DEFAULT_DATASTORE)
        return raw.removeprefix("azureml:")

    @property
    def continue_on_step_failure(self) -> bool:
        return self.settings.get("continue_on_step_failure") is True


def local_file(path: str) -> str:
    """A component or code path as the SDK reads it: `file:` is the local prefix."""
    return path.removeprefix("file:")


def binding_of(value: object) -> Binding | None:
    """The binding a step's input/output value is (a string, or a mapping's `path`)."""
    if isinstance(value, dict):
        value = value.get("path")
    if not isinstance(value, str):
        return None
    match = BINDING.match(value.strip())
    if match is None:
        return None
    group, rest = match.groups()
    if group == "jobs":
        step = STEP_OUTPUT.match(rest)
        return Binding("jobs", step.group(2), step.group(1)) if step else Binding("jobs", rest, "?")
    return Binding(group, rest)


def absolute(raw: Any, base: Path) -> Any:
    """`raw` (an entry mapping) with a local relative `path` made absolute."""
    if not isinstance(raw, dict) or not isinstance(raw.get("path"), str):
        return raw
    path: str = raw["path"]
    if "://" in path or path.startswith(("azureml:", "${{", "/", "~")) or ":" in path[:3]:
        return raw
    joined = str((base / path).resolve()) + ("/" if path.endswith("/") else "")
    return {**raw, "path": joined}
