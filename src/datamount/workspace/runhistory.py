"""The local run history: every `datamount run` records its run name and
where each of its outputs landed, so a later job can read an earlier run's
output as `azureml://jobs/<run>/outputs/<output>/paths/<path>`, as in Azure ML.

One YAML file beside the asset registry, `<workspace stem>.runs.yaml`:

    runs:
      <run name>: {job: <job name>, finished: <UTC time>, exit_code: 0,
                   outputs: {<output>: {type: uri_folder, path: <URI or absolute path>}}}

Written under the file's lock, re-read inside it, and replaced by a rename
(workspace/locked.py): two runs finishing at once both land. No threads.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from datamount import yamlfile
from datamount.errors import WorkspaceError
from datamount.workspace.locked import locked, write_atomic

HEADER = (
    "# Runs of datamount jobs and where their outputs landed (azureml://jobs/...).\n"
    "# Written atomically under a lock; edit only while no job runs.\n"
)


class RunOutput(NamedTuple):
    type: str
    path: str


def history_path(registry: Path, workspace_file: Path) -> Path:
    """`<workspace stem>.runs.yaml` in the asset registry's folder."""
    return registry.parent / f"{workspace_file.stem}.runs.yaml"


def read(path: Path) -> dict[str, dict[str, Any]]:
    """Every recorded run by name ({} when none yet)."""
    data = yamlfile.load(path, f"run history {path}", WorkspaceError, if_missing=_no_runs)
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, dict) or not all(isinstance(v, dict) for v in runs.values()):
        raise WorkspaceError(f"run history {path}: expected 'runs:' entries")
    return {str(k): v for k, v in runs.items()}


def _no_runs() -> dict[str, Any]:
    return {"runs": {}}


def record(path: Path, run: str, job: str, exit_code: int, outputs: dict[str, RunOutput]) -> None:
    """Add run `run` (its outputs' types and landing places) to the history."""
    with locked(path):
        runs = read(path)
        runs[run] = {
            "job": job,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "exit_code": exit_code,
            "outputs": {k: {"type": v.type, "path": v.path} for k, v in outputs.items()},
        }
        body = yaml.safe_dump({"runs": runs}, sort_keys=True, allow_unicode=True)
        write_atomic(path, HEADER + body)


def output_of(path: Path, run: str, output: str, where: str) -> RunOutput:
    """Where output `output` of run `run` landed; a WorkspaceError naming
    what is missing."""
    runs = read(path)
    entry = runs.get(run)
    if entry is None:
        recent = ", ".join(sorted(runs)[-5:]) or "none"
        raise WorkspaceError(
            f"{where}: run {run!r} is not in the run history {path} (recent runs: {recent})"
        )
    outputs = entry.get("outputs") or {}
    if output not in outputs:
        have = ", ".join(sorted(outputs)) or "none"
        raise WorkspaceError(f"{where}: run {run} has no output {output!r} (outputs: {have})")
    item = outputs[output]
    return RunOutput(str(item.get("type", "uri_folder")), str(item["path"]))
