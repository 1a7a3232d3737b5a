"""mount.daemon.limit_malloc_arenas: the daemon caps glibc's malloc arenas at start,
and MALLOC_ARENA_MAX from the environment wins."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from datamount.mount import daemon

pytestmark = pytest.mark.unit


def test_caps_the_arenas_and_says_so(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    with caplog.at_level(logging.INFO, logger="datamount.daemon"):
        daemon.limit_malloc_arenas()
    assert f"malloc arenas: at most {daemon.MALLOC_ARENAS}" in caplog.text


def test_the_environment_wins(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    with caplog.at_level(logging.INFO, logger="datamount.daemon"):
        daemon.limit_malloc_arenas()
    assert "MALLOC_ARENA_MAX=4 from the environment" in caplog.text


def test_threads_share_the_capped_arenas() -> None:
    """In a fresh process: after the cap, 8 threads allocating at once use at most 2
    arenas (glibc's malloc_info lists one <heap> per arena)."""
    code = """
import ctypes, os, tempfile, threading
from datamount.mount.daemon import limit_malloc_arenas
limit_malloc_arenas()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.fdopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = libc.fflush.argtypes = None
barrier = threading.Barrier(8)
def work():
    barrier.wait()
    for _ in range(2000):
        libc.free(libc.malloc(1 << 16))
ts = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
with tempfile.TemporaryFile("w+") as f:
    fp = libc.fdopen(os.dup(f.fileno()), b"w")
    libc.malloc_info(0, ctypes.c_void_p(fp)); libc.fclose(ctypes.c_void_p(fp))
    f.seek(0); print(f.read().count("<heap nr="))
"""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert 1 <= int(out.stdout.strip()) <= daemon.MALLOC_ARENAS
