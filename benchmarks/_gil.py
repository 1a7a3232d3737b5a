"""How much of the wall time some thread of a process held the GIL, sampled with
py-spy (`py-spy record --gil --nonblocking -f raw`), for the benchmarks' "scale past
the GIL" figures (issue 16).

py-spy with --gil records a sample only when a thread of the process holds the GIL,
so the GIL-held seconds are samples / rate and the fraction of a window is that over
the window's seconds (one busy thread for 2 s reads ~1.0, a sleeping process ~0: see
`calibrate`). The projected ceiling of one node is throughput / fraction, i.e. the
work done per GIL-held second: what one interpreter could move if cores were free and
the storage kept up. py-spy missing: figures are "n/a", nothing fails; py-spy failing
(no ptrace permission, say): one line in `GilSample.error`.

    python benchmarks/_gil.py calibrate              the spinner and sleeper check
    python benchmarks/_gil.py summary DIR [RESULTS.json]
        the GIL figures of the runs benchmarks/gil_wrap.sh (BENCH_DATAMOUNT for the
        side-by-side bench) recorded in DIR, downloads matched to the results' rows

With GIL_RAW_DIR set, each Sampler also keeps py-spy's raw stacks there (PID-EPOCH.txt):
where the GIL-held samples went, function by function.

Threads: `Sampler` runs py-spy as a child process and waits for it on the caller's
thread. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

RATE = 200  # samples per second: 0.5 % resolution on a 1 s workload, ~2 % of one core
READY_WAIT = 10.0  # seconds for py-spy to attach and print "Sampling process"
STOP_WAIT = 15.0  # seconds for py-spy to write its raw file after SIGINT
WRAP_DELAY = 0.5  # gil_wrap.sh attaches py-spy this long after datamount starts


def pyspy() -> str | None:
    """The py-spy next to this interpreter (the venv's), else on PATH, else None."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def parse_raw(text: str) -> int:
    """Samples in py-spy's raw (collapsed-stack) output: one "frame;frame;... N" line
    per distinct stack, N its count (a GIL-holding thread in native code has an empty
    stack: " N"); malformed lines are skipped."""
    total = 0
    for line in text.splitlines():
        _, _, count = line.rstrip().rpartition(" ")
        if count.isdigit():
            total += int(count)
    return total


def fraction(samples: int, rate: float, seconds: float) -> float | None:
    """GIL-held fraction of a `seconds` window sampled `rate` times a second; None
    for an empty window or rate."""
    if seconds <= 0 or rate <= 0:
        return None
    return samples / rate / seconds


@dataclass
class GilSample:
    """What one py-spy run saw: samples with the GIL held at `rate`, and why not."""

    samples: int = 0
    rate: float = RATE
    error: str = ""  # "py-spy not installed", or py-spy's own failure, one line
    behind: bool = False  # py-spy said it fell behind: the fraction reads low

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def held_seconds(self) -> float:
        return self.samples / self.rate

    def fraction(self, seconds: float) -> float | None:
        return fraction(self.samples, self.rate, seconds) if self.ok else None


def process_tree(pid: int) -> list[int]:
    """The processes `pid` started, and theirs (its lane's fork server and workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` on `cpus` (threads it starts later inherit it)."""
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cpus)


@contextlib.contextmanager
def isolated(pid: int, others: list[int]) -> Iterator[str]:
    """`--isolate`: the GIL share without other processes' preemptions. On a
    machine whose cores are all busy (this 2-core VM: the storage server, the
    reader and the daemon), a thread that holds the GIL is often descheduled for
    another process, and py-spy counts that time as held: the share reads high
    (a cold 1 GiB read: 78-103 samples, 49-64 with the daemon alone on a core).
    Here `pid`'s threads run alone on the last CPU; its child processes,
    `others` (the storage server) and this process (so the readers it starts)
    on the rest; everything is put back on exit. Yields the line that says so
    ('' on a machine of one CPU, where nothing changes)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        yield ""
        return
    alone, rest = {cpus[-1]}, set(cpus[:-1])
    moved = [*process_tree(pid), *(other for other in others if other)]
    pin(pid, alone)
    for other in moved:
        pin(other, rest)
    os.sched_setaffinity(0, rest)
    try:
        yield f"isolated: the daemon alone on CPU {cpus[-1]}, everything else on {sorted(rest)}"
    finally:
        os.sched_setaffinity(0, set(cpus))
        for one in (pid, *moved):
            pin(one, set(cpus))


def _argv(tool: str, out: Path, rate: float) -> list[str]:
    return [tool, "record", "--gil", "--nonblocking", "-r", f"{rate:g}", "-f", "raw",
            "-o", str(out)]  # fmt: skip


def _finish(out: Path, log: Path, code: int | None, rate: float) -> GilSample:
    text = log.read_text(errors="replace") if log.exists() else ""
    behind = "behind in sampling" in text
    if out.exists():
        return GilSample(parse_raw(out.read_text(errors="replace")), rate, behind=behind)
    lines = [ln.removeprefix("py-spy> ").strip() for ln in text.splitlines() if ln.strip()]
    why = next(
        (ln for ln in lines if "rror" in ln or "ermission" in ln), lines[-1] if lines else ""
    )
    return GilSample(rate=rate, error=f"py-spy failed (exit {code}): {why or 'no output'}"[:160])


class Sampler:
    """py-spy attached to a running process `pid` from `start()` to `stop()`.

        with Sampler(pid) as gil: ...workload...
        gil.result  # a GilSample

    start() returns once py-spy samples, so the workload's window is covered."""

    def __init__(self, pid: int, rate: float = RATE, tool: str | None = "auto") -> None:
        self.pid, self.rate = pid, rate
        self.tool = pyspy() if tool == "auto" else tool
        self.result = GilSample(rate=rate, error="" if self.tool else "py-spy not installed")
        self._tmp = Path(tempfile.mkdtemp(prefix="gil-"))
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        if not self.tool:
            return
        out, log = self._tmp / "raw.txt", self._tmp / "log.txt"
        with open(log, "wb") as stderr:
            self._proc = subprocess.Popen(
                [*_argv(self.tool, out, self.rate), "--pid", str(self.pid)],
                stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
            )  # fmt: skip
        deadline = time.monotonic() + READY_WAIT
        while "Sampling process" not in log.read_text(errors="replace"):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                return
            time.sleep(0.02)

    def stop(self) -> GilSample:
        proc, self._proc = self._proc, None
        if proc is None:
            return self.result
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        try:
            code = proc.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        self.result = _finish(self._tmp / "raw.txt", self._tmp / "log.txt", code, self.rate)
        keep = os.environ.get("GIL_RAW_DIR")  # the stacks, for a profile of the GIL's time
        if keep and (self._tmp / "raw.txt").exists():
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(self._tmp / "raw.txt", Path(keep) / f"{self.pid}-{time.time():.0f}.txt")
        shutil.rmtree(self._tmp, ignore_errors=True)
        return self.result

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wrapped(argv: list[str], out: Path, rate: float = RATE) -> list[str]:
    """`argv` run under py-spy writing its raw samples to `out` (argv unchanged when
    py-spy is missing). py-spy starts the command, so its whole life is sampled."""
    tool = pyspy()
    return [*_argv(tool, out, rate), "--", *argv] if tool else list(argv)


def read_wrapped(out: Path, rate: float = RATE) -> GilSample:
    """The GilSample of a `wrapped` run (out missing: py-spy missing or failed)."""
    if not pyspy():
        return GilSample(rate=rate, error="py-spy not installed")
    if not out.exists():
        return GilSample(rate=rate, error="py-spy failed: no raw file written")
    return GilSample(parse_raw(out.read_text(errors="replace")), rate)


# -- the command line: calibrate, wrap, summary ---------------------------------------


def calibrate(seconds: float = 2.0) -> dict[str, float | None]:
    """GIL fractions of a spinner (one busy thread) and a sleeper over `seconds`,
    each attached with Sampler: ~1.0 and ~0 when the method holds."""
    code = {"spinner": "import time\nt=time.time()\nwhile time.time()-t<60: pass",
            "sleeper": "import time\ntime.sleep(60)"}  # fmt: skip
    got: dict[str, float | None] = {}
    for name, src in code.items():
        child = subprocess.Popen([sys.executable, "-c", src])
        try:
            time.sleep(0.3)  # the interpreter's start-up is not the window
            with Sampler(child.pid) as gil:
                start = time.perf_counter()
                time.sleep(seconds)
                window = time.perf_counter() - start
            if not gil.result.ok:
                raise SystemExit(gil.result.error)
            got[name] = gil.result.fraction(window)
        finally:
            child.kill()
            child.wait()
    return got


def wrapped_runs(folder: Path) -> list[dict]:
    """The runs benchmarks/gil_wrap.sh recorded in `folder`: for each <epoch>-<pid>.argv,
    its arguments, start (epoch, once py-spy attached), end (the raw file's mtime:
    py-spy writes it when datamount exits) and GilSample (rate 200, the wrapper's)."""
    runs = []
    for argv_path in sorted(folder.glob("*.argv"), key=lambda p: float(p.stem.split("-")[0])):
        raw = argv_path.with_suffix(".raw")
        start = float(argv_path.stem.split("-")[0]) + WRAP_DELAY
        end = raw.stat().st_mtime if raw.exists() else start
        if raw.exists():
            sample = GilSample(parse_raw(raw.read_text(errors="replace")), RATE)
        else:
            log = argv_path.with_suffix(".log")
            sample = _finish(raw, log, None, RATE)
        args = argv_path.read_text().splitlines()
        runs.append({"argv": args, "start": start, "end": end, "gil": sample})
    return runs


def workload_of(argv: list[str]) -> str:
    """The shared bench's workload of a `datamount download SPEC DEST` (DEST ends in
    dl/<tool>/<A|B|C>: "download-A"), or "mount" for a mount."""
    if argv[:1] == ["download"] and len(argv) >= 3:
        return f"download-{Path(argv[2]).name}"
    return argv[0] if argv else "?"


def summary(folder: Path, results: Path | None) -> None:
    """One line per wrapped run: what, wall s, GIL-held s and share; for downloads
    matched to the shared bench's results JSON (its datamount-dl rows), the projected
    ceiling (bytes or files per GIL-held second). A mount serves several workloads in
    one process, so its figures are the mount's whole life."""
    rows = json.loads(results.read_text()).get("rows", []) if results else []
    done = {r["workload"]: r for r in rows if r.get("kind") == "download"
            and str(r.get("tool", "")).startswith("datamount") and r.get("ok")}  # fmt: skip
    print(f"{'run':<12} {'wall s':>7} {'GIL s':>6} {'GIL %':>6}  projected (from the results)")
    for run in wrapped_runs(folder):
        sample, wall = run["gil"], run["end"] - run["start"]
        name = workload_of(run["argv"])
        if not sample.ok:
            print(f"{name:<12} {wall:7.2f}    n/a    n/a  {sample.error}")
            continue
        held, share = sample.held_seconds, sample.fraction(wall) or 0.0
        projected = ""
        if (row := done.get(name)) and held > 0:
            big = row.get("ops", 0) <= 10
            rate = row["bytes"] / held / 1e9 if big else row.get("ops", 0) / held
            projected = f"{rate:.2f} GB/s" if big else f"{rate:,.0f} files/s"
        print(f"{name:<12} {wall:7.2f} {held:6.2f} {share:6.1%}  {projected}")


def main(argv: list[str]) -> int:
    if argv == ["calibrate"]:
        if not pyspy():
            print("py-spy not installed: GIL figures are n/a")
            return 0
        got = calibrate()
        print(", ".join(f"{k} {v:.3f}" for k, v in got.items() if v is not None))
        return 0
    if argv[:1] == ["summary"] and len(argv) in (2, 3):
        summary(Path(argv[1]), Path(argv[2]) if len(argv) == 3 else None)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
