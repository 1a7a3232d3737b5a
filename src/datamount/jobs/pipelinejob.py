"""Running a pipeline job's steps on this node.

Each step is a `datamount run` of its command job (jobspec/steps.py), in a child
process with its own working folder `<workdir>/<step>/` (its logs under
`<workdir>/<step>/system_logs/`, its output lines also printed with a
`[<step>]` prefix). Steps start in dependency order, at most `parallel` at
once; a failed step stops its dependents, and every step not yet started
unless `settings.continue_on_step_failure` is true. When every step
succeeded, the pipeline outputs with a `name` are registered and the run is
recorded in the run history.

Threads: one per running step, copying its output to the log and the user.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from datamount.errors import EXIT_OK, EXIT_OUTPUTS, DatamountError
from datamount.jobs import environment
from datamount.jobspec.pipeline import Pipeline
from datamount.jobspec.steps import parent_output_path
from datamount.modes.context import Context
from datamount.workspace import runhistory
from datamount.workspace.registry import register

log = logging.getLogger("datamount.run")
SKIPPED = -1  # a step that did not run


class PipelineRun:
    def __init__(
        self,
        ctx: Context,
        pipeline: Pipeline,
        jobs: dict[str, dict[str, Any]],
        workdir: Path,
        *,
        argv: list[str],
        say: Callable[[str], None],
        parallel: int = 2,
    ) -> None:
        self.ctx = ctx
        self.pipeline = pipeline
        self.jobs = jobs
        self.workdir = workdir
        self.argv = argv  # how to call `datamount` (and its global options)
        self.say = say
        self.parallel = max(1, parallel)
        self.codes: dict[str, int] = {}
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    def run(self) -> int:
        run = self.ctx.run_name or self.pipeline.name
        with self._signals():
            self._schedule()
        failed = [n for n in self.pipeline.order if self.codes.get(n, SKIPPED) not in (0,)]
        ran_bad = [n for n in failed if self.codes.get(n, SKIPPED) != SKIPPED]
        skipped = [n for n in failed if self.codes.get(n, SKIPPED) == SKIPPED]
        if ran_bad:
            first = ran_bad[0]
            extra = f"; not run: {', '.join(skipped)}" if skipped else ""
            self.say(
                f"pipeline {run}: step {first} failed (exit {self.codes[first]})"
                + (f"; also failed: {', '.join(ran_bad[1:])}" if ran_bad[1:] else "")
                + extra
            )
            self._record(self.codes[first])
            return self.codes[first]
        problems = self._register(run)
        self._record(EXIT_OUTPUTS if problems else EXIT_OK)
        for line in problems:
            self.say(f"outputs could not be registered: {line}")
        if problems:
            return EXIT_OUTPUTS
        self.say(f"pipeline {run}: {len(self.pipeline.order)} steps succeeded")
        return EXIT_OK

    # -- scheduling ----------------------------------------------------------------

    def _schedule(self) -> None:
        pending = list(self.pipeline.order)
        running: dict[Future[int], str] = {}
        stop = False
        with ThreadPoolExecutor(self.parallel, thread_name_prefix="step") as pool:
            while pending or running:
                for name in list(pending):
                    deps = self.pipeline.steps[name].depends_on()
                    if any(self.codes.get(d, 0) != 0 for d in deps if d in self.codes) or stop:
                        pending.remove(name)
                        self.codes[name] = SKIPPED
                        why = "the pipeline stopped" if stop else "a step it reads failed"
                        self.say(f"[{name}] not run: {why}")
                        continue
                    if len(running) >= self.parallel or not all(d in self.codes for d in deps):
                        continue
                    pending.remove(name)
                    running[pool.submit(self._step, name)] = name
                if not running:
                    continue
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    name = running.pop(future)
                    try:
                        self.codes[name] = future.result()
                    except OSError as exc:
                        self.say(f"[{name}] could not start: {exc}")
                        self.codes[name] = 1
                    if self.codes[name] != 0 and not self.pipeline.continue_on_step_failure:
                        stop = True

    def _step(self, name: str) -> int:
        folder = self.workdir / name
        logs = folder / "system_logs"
        logs.mkdir(parents=True, exist_ok=True)
        job_file = logs / "step_job.yml"
        job_file.write_text(yaml.safe_dump(self.jobs[name], sort_keys=False), encoding="utf-8")
        self.say(f"[{name}] started")
        argv = [*self.argv, "run", str(job_file), "--workdir", str(folder)]
        with open(logs / "std_log.txt", "wb") as out:
            child = subprocess.Popen(
                argv, env=dict(self.ctx.environ), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            self._children[name] = child
            assert child.stdout is not None
            for line in child.stdout:
                out.write(line)
                self.say(f"[{name}] {line.decode(errors='replace').rstrip()}")
            code = child.wait()
        self.say(f"[{name}] exited with {code}")
        return code

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGTERM/SIGHUP reach every running step (each finishes its outputs)."""

        def handle(signum: int, frame: FrameType | None) -> None:
            for child in self._children.values():
                if child.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        child.send_signal(signum)

        with environment.handling((signal.SIGTERM, signal.SIGHUP), handle):
            yield

    # -- after the steps -----------------------------------------------------------

    def _register(self, run: str) -> list[str]:
        problems = []
        workspace = None
        for name, raw in self.pipeline.outputs.items():
            if not isinstance(raw, dict) or raw.get("name") is None:
                continue
            path, kind = parent_output_path(self.pipeline, name, run)
            try:
                workspace = workspace or self.ctx.workspace()
                version = register(
                    workspace, str(raw["name"]),
                    str(raw["version"]) if raw.get("version") is not None else None,
                    type_=kind.value, path=path, job=run,
                )  # fmt: skip
                self.say(f"outputs.{name}: registered {raw['name']}:{version}")
            except DatamountError as exc:
                problems.append(f"outputs.{name}: {exc}")
        return problems

    def _record(self, code: int) -> None:
        try:
            workspace = self.ctx.load_workspace(required=False)
            history = workspace.history_path() if workspace is not None else None
            if history is None:
                return
            run = self.ctx.run_name or self.pipeline.name
            outputs = {}
            for name in self.pipeline.outputs:
                path, kind = parent_output_path(self.pipeline, name, run)
                outputs[name] = runhistory.RunOutput(kind.value, path)
            runhistory.record(history, run, self.pipeline.name, code, outputs)
        except DatamountError as exc:
            self.say(f"the run history could not be written: {exc}")
