"""benchmarks/_gil.py (py-spy raw output -> GIL-held fraction) and benchmarks/_scale.py
(the budget and RAM-tier figures), loaded by path: the benchmarks are no package."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


gil = _load("_gil")
scale = _load("_scale")

RAW = """\
<module> (spin.py:4) 150
<module> (bench.py:9);worker (bench.py:20);read (bench.py:31) 30
 7
thread (0x7f00);run (threading.py:1012) 13
garbage line without a count
"""


def test_parse_raw_counts_every_sample_and_skips_malformed_lines() -> None:
    assert gil.parse_raw(RAW) == 150 + 30 + 7 + 13
    assert gil.parse_raw("") == 0
    assert gil.parse_raw("frame (f.py:1) x12\n") == 0


def test_fraction_is_samples_over_rate_times_seconds() -> None:
    assert gil.fraction(200, 100, 2.0) == pytest.approx(1.0)  # one busy thread, 2 s
    assert gil.fraction(1, 100, 2.0) == pytest.approx(0.005)  # a sleeper's stray sample
    assert gil.fraction(50, 100, 0.0) is None
    assert gil.fraction(50, 0, 1.0) is None


def test_gil_sample_held_seconds_and_failure() -> None:
    sample = gil.GilSample(samples=300, rate=200)
    assert sample.ok and sample.held_seconds == pytest.approx(1.5)
    assert sample.fraction(3.0) == pytest.approx(0.5)
    failed = gil.GilSample(rate=200, error="py-spy failed (exit 1): Permission denied")
    assert not failed.ok and failed.fraction(3.0) is None


def test_sampler_without_py_spy_is_na_not_a_failure() -> None:
    with gil.Sampler(1, tool=None) as sampler:
        pass
    assert sampler.result.error == "py-spy not installed"
    assert sampler.result.fraction(1.0) is None


def test_sampler_reports_py_spy_failing_in_one_line(tmp_path: Path) -> None:
    tool = tmp_path / "py-spy"
    tool.write_text("#!/bin/sh\necho 'py-spy> Error: Permission Denied (os error 1)' >&2\nexit 1\n")
    tool.chmod(0o755)
    with gil.Sampler(1, tool=str(tool)) as sampler:
        pass
    error = sampler.result.error
    assert error.startswith("py-spy failed (exit 1): Error: Permission Denied")
    assert "\n" not in error


def test_finish_reads_the_raw_file_and_the_behind_warning(tmp_path: Path) -> None:
    out, log = tmp_path / "raw.txt", tmp_path / "log.txt"
    out.write_text(RAW)
    log.write_text("py-spy> 1.20s behind in sampling, results may be inaccurate.\n")
    got = gil._finish(out, log, 0, 100)
    assert got.ok and got.samples == 200 and got.behind


def test_budget_and_ram_tier_from_the_daemon(tmp_path: Path) -> None:
    budget = {"limits": {"prefetch": 64 << 20, "disk queue": 512 << 20}, "peak": 70 << 20}
    assert scale.budget_mib(budget) == (576.0, 70.0)
    assert scale.budget_mib({}) == (None, None)
    (tmp_path / "datamount-runtime.log").write_text(
        "x INFO read path: block mode, block 2097152 B, prefetch window 8 blocks, 8 read "
        "threads, RAM tier 134217728 B, disk tier on, memory budget 576 MiB (...)\n"
    )
    assert scale.ram_tier(tmp_path) == 128 << 20
    assert scale.ram_tier(tmp_path / "missing") is None


def test_wrapped_runs_and_their_workloads(tmp_path: Path) -> None:
    stem = tmp_path / "1796134780.000-42"
    stem.with_suffix(".argv").write_text("download\nspec.yaml\n/w/dl/datamount-dl/B\n")
    stem.with_suffix(".raw").write_text(RAW)
    other = tmp_path / "1796134790.000-43"
    other.with_suffix(".argv").write_text("mount\nspec.yaml\n/w/mnt/datamount\n--foreground\n")
    other.with_suffix(".log").write_text("py-spy> Error: Failed to find python version\n")
    runs = gil.wrapped_runs(tmp_path)
    assert [gil.workload_of(r["argv"]) for r in runs] == ["download-B", "mount"]
    assert runs[0]["gil"].samples == 200 and runs[0]["start"] == 1796134780.0 + gil.WRAP_DELAY
    assert runs[1]["gil"].error.endswith("Error: Failed to find python version")


def test_gil_held_longer_than_cpu_is_flagged() -> None:
    assert scale.oversubscribed(0.4, 0.7) == ""
    assert scale.oversubscribed(0.4, None) == ""
    assert "oversubscribed" in scale.oversubscribed(2.3, 0.7)


def test_mount_bench_datamount_env_sets_a_variant_back() -> None:
    """--datamount-env puts one cleared knob back for datamount's runs only."""
    sys.path.insert(0, str(BENCH))  # mount.py imports its siblings by name
    try:
        mount = _load("mount")
    finally:
        sys.path.remove(str(BENCH))
    opts = mount.parse_args(
        ["--datasets", "B", "--workloads", "4",
         "--datamount-env", "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED=false",
         "--datamount-env", "DATASET_MOUNT_MEMORY_CACHE_SIZE=0"]
    )  # fmt: skip
    assert opts.datamount_env == {
        "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "false",
        "DATASET_MOUNT_MEMORY_CACHE_SIZE": "0",
    }
    for bad in ("HOME=/tmp", "DATASET_MOUNT_MEMORY_CACHE_SIZE"):
        with pytest.raises(SystemExit) as exit_:
            mount.parse_args(["--datamount-env", bad])
        assert exit_.value.code == 2


def _affinities(pid: int) -> dict[int, set[int]]:
    return {int(t): os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_isolated_puts_the_server_alone_on_the_last_cpu_and_everything_back() -> None:
    # A "server" with three threads and a child process (a lane worker), and an "other".
    server = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, threading, time\n"
         "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
         "for _ in range(2): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
         "print(child.pid, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child = 0
    try:
        assert server.stdout is not None
        child = int(server.stdout.readline())
        cpus = sorted(os.sched_getaffinity(0))
        alone, rest = {cpus[-1]}, set(cpus[:-1])
        assert gil.process_tree(server.pid) == [child]
        with gil.isolated(server.pid, [other.pid, 0]) as line:
            assert (
                line
                == f"isolated: the daemon alone on CPU {cpus[-1]}, everything else on {sorted(rest)}"
            )
            threads = _affinities(server.pid)
            assert len(threads) == 3 and all(a == alone for a in threads.values())
            assert os.sched_getaffinity(child) == rest and os.sched_getaffinity(other.pid) == rest
            assert os.sched_getaffinity(0) == rest  # so a reader started now runs there
        for pid in (server.pid, child, other.pid, os.getpid()):
            assert all(a == set(cpus) for a in _affinities(pid).values())
    finally:
        for proc in (server, other):
            proc.kill()
            proc.wait()
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
