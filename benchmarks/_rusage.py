"""Run one command and report its own wall time, CPU seconds and peak RSS as JSON.

    python -I -S benchmarks/_rusage.py REPORT.json -- COMMAND [ARG...]

Why a launcher: on Linux, exec() seeds a process's ru_maxrss with the high-water
RSS of the memory image it replaces, so a child forked (or vforked) from the
benchmark inherits the benchmark's own peak (2.6 GiB after seeding) as its
"peak RSS" (measured: /bin/true reported 510 MiB under a 500 MiB parent). This
launcher is a bare interpreter (~8 MiB, stdlib only, no site), so the floor it
passes on is below any contender's real footprint. It forks and execs COMMAND,
reaps it with os.wait4 (rusage of that child alone), writes
{"seconds", "cpu", "maxrss_kib", "status"} to REPORT.json and exits with the
command's exit code. The command gets SIGTERM if the launcher dies.
Single-threaded; imports nothing outside the standard library.
"""

import ctypes
import json
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def main() -> int:
    report, sep, *argv = sys.argv[1:]
    if sep != "--" or not argv:
        print("usage: _rusage.py REPORT.json -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: die with the launcher, then become COMMAND
        try:
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            os.execvp(argv[0], argv)
        except OSError as exc:
            print(f"cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
        os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    seconds = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    result = {
        "seconds": seconds,
        "cpu": usage.ru_utime + usage.ru_stime,
        "maxrss_kib": usage.ru_maxrss,  # KiB on Linux
        "status": code,
    }
    with open(report, "w") as out:
        json.dump(result, out)
    return code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as shells do


if __name__ == "__main__":
    sys.exit(main())
