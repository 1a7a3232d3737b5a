"""The benchmarks' "scale past the GIL" and memory figures (issue 16). mount.py: per
datamount workload, the daemon's CPU per GiB and per 1,000 files, the fraction of
the workload's wall time the daemon held the GIL (py-spy, benchmarks/_gil.py), the
projected ceiling of one node (throughput / that fraction) against the issue's
targets, and the daemon's peak RSS against its one memory budget + 100 MiB.
transfer.py: every download contender's CPU per GiB and per 1,000 files, and the GIL
share and projected ceiling of `datamount download`.

Reads the runtime log for the RAM tier's size. Single-threaded, caller's thread.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MiB, GB = 1 << 20, 1_000_000_000
LARGE_TARGET_GB_S = 3.0  # issue 16: projected >= 3 GB/s for large files
SMALL_TARGET_FILES_S = 10_000  # and >= 10,000 small files/s
RSS_SLACK_MIB = 100  # issue 16: peak RSS <= the memory budget + 100 MiB
LARGE, SMALL = (1, 2, 11, 12), (4, 7, 8, 9)  # workloads reading A whole / the files of B
_RAM_TIER = re.compile(r"read path: .*RAM tier (\d+) B")


def ram_tier(log_dir: Path) -> int | None:
    """The RAM tier's bytes from the daemon's start-up "read path" line, if logged."""
    for path in sorted(log_dir.glob("**/datamount-runtime.log")):
        for match in _RAM_TIER.finditer(path.read_text(errors="replace")):
            return int(match.group(1))
    return None


def budget_mib(budget: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(the budget's total, its peak use so far) in MiB from the stats file's
    "budget" object ({"limits": {area: bytes}, "peak": bytes}); None when absent."""
    limits = budget.get("limits") or {}
    total = sum(limits.values()) / MiB if limits else None
    peak = budget.get("peak")
    return total, None if peak is None else peak / MiB


def _f(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def report(best: Mapping[tuple[int, str], Any], names: Mapping[int, str], *, gil: bool) -> None:
    """Print both tables for the datamount rows of `best` (mount.Row objects)."""
    rows = [r for (w, who), r in sorted(best.items()) if who == "datamount"]
    rows = [r for r in rows if r.seconds > 0 and not r.failed and not r.problems]
    if not rows:
        return
    print("\nscale past the GIL (issue 16; daemon only; GIL = share of the workload's wall time "
          "some daemon thread held it,\nsampled by py-spy; projected = throughput / GIL share, "
          "assuming free cores and a storage that keeps up):")  # fmt: skip
    print(f"  {'workload':<18} {'MB/s':>8} {'dm CPU':>6} {'s/GiB':>6} {'s/1k f':>6} "
          f"{'GIL %':>6} {'projected':>14}  target")  # fmt: skip
    for r in rows:
        cpu = r.server_cpu
        per_gib = cpu / (r.bytes / (1 << 30)) if cpu is not None and r.bytes else None
        per_k = cpu / r.ops * 1000 if cpu is not None and r.ops and r.workload in SMALL else None
        share, held = None, None
        if not gil:
            why = "--no-gil"
        elif r.gil is None or not r.gil.ok:
            why = r.gil.error if r.gil else "not sampled"
        else:
            held, share = r.gil.held_seconds, r.gil.held_seconds / r.seconds
            why = "py-spy fell behind: reads low" if r.gil.behind else ""
            why += oversubscribed(held, cpu).removeprefix("; " if not why else "")
        projected, target = "n/a", ""
        if held:
            if r.workload in SMALL:
                got = r.ops / held
                projected = f"{got:,.0f} files/s"
                mark = "PASS" if got >= SMALL_TARGET_FILES_S else "FAIL"
                target = f"[{mark}] >= {SMALL_TARGET_FILES_S:,} files/s"
            elif r.bytes:
                got = r.bytes / held / GB
                projected = f"{got:.2f} GB/s"
                if r.workload in LARGE:
                    mark = "PASS" if got >= LARGE_TARGET_GB_S else "FAIL"
                    target = f"[{mark}] >= {LARGE_TARGET_GB_S:g} GB/s"
            else:
                projected = f"{r.ops / held:,.0f} ops/s"
        elif held == 0.0 and share is not None:
            projected = "unbounded"  # no GIL sample at all (the kernel served it)
        mbps = r.bytes / r.seconds / 1e6 if r.bytes else None
        print(f"  {names[r.workload]:<18} {_f(mbps, '8.1f'):>8} {_f(cpu, '.2f'):>6} "
              f"{_f(per_gib, '.2f'):>6} {_f(per_k, '.2f'):>6} {_f(share, '6.1%'):>6} "
              f"{projected:>14}  {target}{'; ' if target and why else ''}{why}")  # fmt: skip
    print("memory (issue 16: daemon peak RSS <= the one memory budget + 100 MiB; the RAM tier "
          "is outside the budget):")  # fmt: skip
    print(f"  {'workload':<18} {'peak RSS':>8} {'budget':>7} {'peak use':>8} {'RAM tier':>8} "
          f"{'RSS/(budget+100)':>17}  target")  # fmt: skip
    for r in rows:
        limit = None if r.budget_mib is None else r.budget_mib + RSS_SLACK_MIB
        ratio = r.server_rss / limit if r.server_rss and limit else None
        mark = "n/a " if ratio is None else "PASS" if ratio <= 1 else "FAIL"
        print(f"  {names[r.workload]:<18} {_f(r.server_rss, '.0f'):>8} "
              f"{_f(r.budget_mib, '.0f'):>7} {_f(r.budget_peak_mib, '.0f'):>8} "
              f"{_f(r.ram_tier_mib, '.0f'):>8} {_f(ratio, '.2f'):>17}  [{mark}] "
              f"<= {_f(limit, '.0f')} MiB")  # fmt: skip
    print("  (MiB; peak use = the most bytes the budget held at once since the mount began)")


def print_download(ds: Any, best: Mapping[str, Any], gil: tuple[Any, Any] | None) -> None:
    """transfer.py, after each download table (`best`: _common.Run by contender, `gil`:
    a Run and its _gil.GilSample): CPU s per GiB and per 1,000 files of every contender,
    and datamount's GIL share with the projected ceiling against issue 16's targets."""
    files = len(ds.files)
    parts = [
        f"{name} {run.cpu / (ds.total / (1 << 30)):.2f} s/GiB"
        + (f", {run.cpu / files * 1000:.2f} s/1k files" if files > 1 else "")
        for name, run in best.items()
        if run is not None
    ]
    print("  CPU: " + "; ".join(parts))
    if gil is None:
        return
    run, sample = gil
    share = sample.fraction(run.seconds) or 0.0
    held = sample.held_seconds
    small = files > 1 and ds.total / files < 8 * (1 << 20)
    if held <= 0:
        print(f"  GIL: datamount held it {share:.1%} of {run.seconds:.2f} s (no sample)")
        return
    got = files / held if small else ds.total / held / 1e9
    goal = SMALL_TARGET_FILES_S if small else LARGE_TARGET_GB_S
    unit = "files/s" if small else "GB/s"
    mark = "PASS" if got >= goal else "FAIL"
    late = "; py-spy fell behind: reads low" if sample.behind else ""
    late += oversubscribed(held, run.cpu)
    print(f"  GIL: datamount download held it {share:.1%} of {run.seconds:.2f} s (py-spy run, "
          f"start-up included); projected {got:,.{0 if small else 2}f} {unit} [{mark}] >= "
          f"{goal:,} {unit}{late}")  # fmt: skip


def oversubscribed(held: float, cpu: float | None) -> str:
    """A note when the GIL was held longer than the process used CPU: a thread holding
    it waited for a core (more runnable threads than cores), so the share reads high."""
    if cpu is None or held <= cpu:
        return ""
    return f"; GIL held {held:.2f} s > {cpu:.2f} CPU s: cores oversubscribed, reads high"
