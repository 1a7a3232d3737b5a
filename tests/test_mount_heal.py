"""A mount whose daemon dies comes back by itself (mount.supervise).

Real Azurite behind a FaultProxy (so storage requests can be counted) and
real FUSE mounts made by the CLI: the daemon is killed with SIGKILL under a
reader that reopens on error; every byte read is compared, the proxy shows
the new daemons read the blocks the first one cached on disk, and `status`,
the metrics and the runtime log count the restarts. Past
DATAMOUNT_MOUNT_MAX_RESTARTS the supervisor gives up with one line.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from azurite import free_port
from datamount.mount.control import (
    alive,
    is_stale,
    read_state,
    read_supervision,
    state_file,
    supervisor_file,
)
from datamount.mount.plan import MountPlan
from datamount.mount.supervise import STEADY, Supervised, backoff, death, streak_after
from datamount.settings import Settings
from datamount.storage.credentials import Credential
from datamount.storage.location import StorageKind, StorageLocation
from faultproxy import FaultProxy
from fuse_helpers import Mounts, daemons_of, datamount, mount_env, mounted, spec_file, wait_for

BS = 64 * 1024
BODY = random.Random(20261202).randbytes(40 * BS + 123)  # 41 blocks
NBLOCKS = -(-len(BODY) // BS)
RUNTIME_LOG = "datamount-runtime.log"


def env_for(azurite, proxy: FaultProxy, tmp_path: Path, container, **extra: str) -> dict[str, str]:  # noqa: ANN001
    service = SimpleNamespace(account=azurite.account, key=azurite.key, endpoint=proxy.endpoint)
    return mount_env(service, tmp_path, container.container_name,
                     DATASET_MOUNT_READ_BLOCK_SIZE="64KB", **extra)  # fmt: skip


def mount(tmp_path: Path, mp: Path, env: dict[str, str]) -> None:
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/ds/")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert mounted(mp)


def block_files(cache: Path) -> list[Path]:
    return [p for p in (cache / "blocks").rglob("*.blk") if p.parent.name != "tmp"]


def status(env: dict[str, str]) -> dict:
    out = datamount("status", "--json", env=env)
    assert out.returncode == 0, out.stderr
    (entry,) = [json.loads(line) for line in out.stdout.splitlines()]
    return entry


def runtime_log(tmp_path: Path) -> str:
    return (tmp_path / "cache" / "logs" / RUNTIME_LOG).read_text()


def serving_again(cache: Path, mp: Path, dead: int) -> bool:
    """A new daemon serves `mp` (its state file names another, live pid)."""
    state = read_state(cache, mp)
    return state is not None and state.pid != dead and alive(state.pid) and not is_stale(mp)


def _errno_of(call) -> int:  # noqa: ANN001
    try:
        call()
    except OSError as exc:
        return exc.errno or 0
    return 0


class Reader(threading.Thread):
    """Reads `path` whole, over and over, through O_DIRECT handles (every
    byte from the daemon); on an error it records the errno, reopens and
    goes on at the same offset. `passes` counts whole reads, each compared.
    `pause()` stops it after a read, with its handle open, until `resume()`:
    so a death can be made to land on an open handle every time."""

    def __init__(self, path: Path) -> None:
        super().__init__(name="reader", daemon=True)
        self.path = path
        self.errors: list[int] = []  # errno of every failed open or read, in order
        self.failed_reads: list[int] = []  # errno of reads on a handle that had worked
        self.read_again: list[int] = []  # errno of one more read on that handle
        self.passes = 0
        self.wrong = 0
        self.done = threading.Event()
        self._pause = threading.Event()  # asked: stop after the next read
        self._paused = threading.Event()  # stopped, its handle open
        self._resume = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            data = self._read_whole()
            if data is None:
                return
            self.passes += 1
            if data != BODY:
                self.wrong += 1

    def pause(self) -> None:
        """Return once the reader stopped after a read, its handle open."""
        self._paused.clear()
        self._pause.set()
        assert self._paused.wait(30), "the reader never stopped"

    def resume(self) -> None:
        self._resume.set()

    def _read_whole(self) -> bytes | None:
        parts: list[bytes] = []
        offset = 0
        while not self.done.is_set():
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            except OSError as exc:
                self.errors.append(exc.errno or 0)
                time.sleep(0.02)
                continue
            try:
                while chunk := os.pread(fd, 4 * BS, offset):
                    parts.append(chunk)
                    offset += len(chunk)
                    if self._pause.is_set():
                        self._pause.clear()
                        self._paused.set()
                        self._resume.wait()
                        self._resume.clear()
                return b"".join(parts)
            except OSError as exc:
                self.errors.append(exc.errno or 0)
                self.failed_reads.append(exc.errno or 0)
                self.read_again.append(_errno_of(lambda f=fd, o=offset: os.pread(f, BS, o)))
            finally:
                os.close(fd)
        return None

    def stop(self) -> None:
        self.done.set()
        self.join(30)
        assert not self.is_alive()


def kill_and_wait_back(mounts: Mounts, mp: Path, reader: Reader) -> int:
    """SIGKILL the daemon while the reader holds a handle it has read
    through, wait for a new daemon to serve and for the reader to finish two
    more whole passes; the dead daemon's pid."""
    pid = mounts.daemon(mp)
    reader.pause()
    try:
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: not alive(pid), 30), "the daemon outlived SIGKILL"
    finally:
        reader.resume()
    assert wait_for(lambda: serving_again(mounts.cache_dir, mp, pid), 30), "not mounted again"
    passes = reader.passes
    assert wait_for(lambda: reader.passes >= passes + 2, 30), "the reader made no progress"
    return pid


def _bound(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in text.splitlines())
        if name and not name.startswith("#")
    }


# -- the supervisor's arithmetic ------------------------------------------------


@pytest.mark.unit
def test_backoff_is_immediate_first_then_doubles_up_to_its_cap() -> None:
    assert [backoff(n) for n in range(1, 9)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


@pytest.mark.unit
def test_a_daemon_that_served_long_enough_ends_the_backoff_streak() -> None:
    assert streak_after(3, STEADY - 1) == 3  # died quickly again: 4 s before the next
    assert streak_after(3, STEADY) == 0  # served a minute: the next restart is immediate
    assert backoff(streak_after(3, STEADY) + 1) == 0.0


@pytest.mark.unit
def test_death_says_the_signal_or_the_exit_status() -> None:
    assert death(-signal.SIGKILL) == "killed by SIGKILL"
    assert death(1) == "exited with status 1"
    assert death(-200) == "killed by signal 200"


@pytest.mark.unit
def test_the_supervisor_reads_its_fields_from_a_real_plan_line(tmp_path: Path) -> None:
    blob = StorageLocation(
        StorageKind.BLOB, "data/", "acct", "box", "https://acct.blob.example", "example",
        Credential.account_key("a2V5"),
    )  # fmt: skip
    settings = Settings.from_env(
        {"DATAMOUNT_MOUNT_MAX_RESTARTS": "7", "DATAMOUNT_LOG_LEVEL": "DEBUG"}, cache_dir=tmp_path
    )
    plan = MountPlan(mode="ro_mount", name="train", direction="input", spec="s.yaml",
                     mountpoint=tmp_path / "m", location=blob, is_file=False,
                     settings=settings)  # fmt: skip
    assert Supervised.from_json(plan.to_json()) == Supervised(
        mountpoint=tmp_path / "m", mode="ro_mount", label="inputs.train", cache_dir=tmp_path,
        log_dir=settings.log_dir, log_level="DEBUG", max_restarts=7,
    )  # fmt: skip
    with pytest.raises(KeyError):
        Supervised.from_json('{"mode": "ro_mount"}')


# -- real mounts ---------------------------------------------------------------


@pytest.mark.fuse
@pytest.mark.slow
def test_three_kills_under_a_reader_every_byte_exact_and_the_cache_reused(
    azurite, container, proxy: FaultProxy, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"ds/f.bin": BODY})
    port = free_port()
    env = env_for(azurite, proxy, tmp_path, container, DATAMOUNT_METRICS_PORT=str(port))
    cache = tmp_path / "cache"
    mp = mounts.point(tmp_path / "mnt")
    mount(tmp_path, mp, env)
    first = mounts.daemon(mp)
    with open(mp / "f.bin", "rb") as f:
        assert f.read() == BODY
    assert wait_for(lambda: len(block_files(cache)) == NBLOCKS)  # all on disk
    proxy.reset()

    reader = Reader(mp / "f.bin")
    reader.start()
    try:
        assert wait_for(lambda: reader.passes >= 2, 30)
        dead = [kill_and_wait_back(mounts, mp, reader) for _ in range(3)]
    finally:
        reader.stop()

    assert reader.wrong == 0 and reader.passes >= 8
    # On a handle open at a death, a read in flight fails with ECONNABORTED
    # (the kernel aborted the connection), every later call with ENOTCONN, as
    # do opens on the stale mount; an open in the instant between its detach
    # and the new mount sees the empty folder under it (ENOENT).
    assert len(reader.failed_reads) == 3  # one per death: each landed on an open handle
    assert set(reader.failed_reads) <= {errno.ECONNABORTED, errno.ENOTCONN}
    assert set(reader.read_again) == {errno.ENOTCONN}  # the handle stays dead: reopen
    assert errno.ENOTCONN in reader.errors
    assert set(reader.errors) <= {errno.ENOTCONN, errno.ECONNABORTED, errno.ENOENT}
    assert proxy.ranged_gets("ds/f.bin") == []  # every block from the first daemon's disk cache
    assert dead[0] == first and len({*dead, mounts.daemon(mp)}) == 4  # a new daemon each time

    entry = status(env)
    assert entry["restarts"] == 3 and entry["state"] == "serving"
    out = datamount("status", env=env)
    assert "3 restarts" in out.stdout
    metrics = scrape(f"http://127.0.0.1:{port}/metrics")
    assert metrics["datamount_mount_restarts_total"] == 3.0
    assert metrics["datamount_storage_bytes_total"] == 0.0
    log = runtime_log(tmp_path)
    assert log.count("starting it again") == 3
    assert "restart 1 of 5)" in log and "in 1 s (restart 2 of 5)" in log
    assert "in 2 s (restart 3 of 5)" in log

    supervisor = read_supervision(cache, mp)
    assert supervisor is not None and alive(supervisor.pid)
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert "unmounted" in out.stderr
    assert not mounted(mp)
    assert wait_for(lambda: not alive(supervisor.pid))
    assert daemons_of(mp) == []
    assert not state_file(cache, mp).exists()
    assert not supervisor_file(state_file(cache, mp)).exists()


@pytest.mark.fuse
@pytest.mark.slow
def test_deaths_past_the_budget_give_up_with_one_line(
    azurite, container, proxy: FaultProxy, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"ds/f.bin": BODY})
    env = env_for(azurite, proxy, tmp_path, container, DATAMOUNT_MOUNT_MAX_RESTARTS="2")
    cache = tmp_path / "cache"
    mp = mounts.point(tmp_path / "mnt")
    mount(tmp_path, mp, env)
    supervisor = read_supervision(cache, mp)
    assert supervisor is not None
    for _ in range(2):
        pid = mounts.daemon(mp)
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda p=pid: serving_again(cache, mp, p), 30)
        assert (mp / "f.bin").read_bytes() == BODY
    last = mounts.daemon(mp)
    os.kill(last, signal.SIGKILL)
    assert wait_for(lambda: not alive(supervisor.pid), 30), "the supervisor did not give up"
    assert is_stale(mp)
    assert daemons_of(mp) == []

    errors = [line for line in runtime_log(tmp_path).splitlines() if " ERROR " in line]
    assert len(errors) == 1
    assert errors[0].endswith(
        f"the mount daemon of {mp} killed by SIGKILL; gave up after 2 restarts "
        "(DATAMOUNT_MOUNT_MAX_RESTARTS=2): the mount stays stale until `datamount unmount` "
        "or the next mount clears it"
    )
    entry = status(env)
    assert entry["restarts"] == 2
    assert entry["state"] == (
        "stale (daemon killed by SIGKILL; gave up after 2 restarts "
        "(DATAMOUNT_MOUNT_MAX_RESTARTS=2); the next mount clears it)"
    )

    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert "cleared a stale mount" in out.stderr
    assert not mounted(mp) and daemons_of(mp) == []
    assert not supervisor_file(state_file(cache, mp)).exists()


@pytest.mark.fuse
def test_no_restarts_leaves_the_mount_stale_as_before(
    azurite, container, proxy: FaultProxy, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"ds/f.bin": b"once"})
    env = env_for(azurite, proxy, tmp_path, container, DATAMOUNT_MOUNT_MAX_RESTARTS="0")
    mp = mounts.point(tmp_path / "mnt")
    mount(tmp_path, mp, env)
    supervisor = read_supervision(mounts.cache_dir, mp)
    assert supervisor is not None
    os.kill(mounts.daemon(mp), signal.SIGKILL)
    assert wait_for(lambda: not alive(supervisor.pid), 30)
    assert is_stale(mp)
    assert "gave up after 0 restarts (DATAMOUNT_MOUNT_MAX_RESTARTS=0)" in status(env)["state"]
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert "cleared a stale mount" in out.stderr
    assert not mounted(mp) and daemons_of(mp) == []


@pytest.mark.fuse
def test_sigterm_to_the_supervisor_drains_and_unmounts(
    azurite, container, proxy: FaultProxy, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"ds/f.bin": b"drained"})
    env = env_for(azurite, proxy, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    mount(tmp_path, mp, env)
    pid = mounts.daemon(mp)
    supervisor = read_supervision(mounts.cache_dir, mp)
    assert supervisor is not None and supervisor.pid != pid
    assert (mp / "f.bin").read_bytes() == b"drained"
    os.kill(supervisor.pid, signal.SIGTERM)
    assert wait_for(lambda: not alive(pid) and not alive(supervisor.pid), 30)
    assert not mounted(mp) and not is_stale(mp)
    assert daemons_of(mp) == []
    assert "starting it again" not in runtime_log(tmp_path)
    assert not state_file(mounts.cache_dir, mp).exists()
    assert not supervisor_file(state_file(mounts.cache_dir, mp)).exists()


@pytest.mark.fuse
def test_an_rw_mount_is_not_restarted_and_its_unmount_still_fails(
    azurite, container, proxy: FaultProxy, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    spec = tmp_path / "out.yaml"
    spec.write_text("outputs:\n  model: {type: uri_folder, mode: rw_mount, "
                    "path: 'azureml://datastores/store/paths/out/'}\n")  # fmt: skip
    env = env_for(azurite, proxy, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    supervisor = read_supervision(mounts.cache_dir, mp)
    assert supervisor is not None
    pid = mounts.daemon(mp)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not alive(supervisor.pid), 30)
    assert is_stale(mp)
    errors = [line for line in runtime_log(tmp_path).splitlines() if " ERROR " in line]
    assert len(errors) == 1 and errors[0].endswith(
        f"the mount daemon of {mp} killed by SIGKILL; an rw_mount is not restarted (its "
        "writes in progress are lost): the mount stays stale until `datamount unmount` "
        "or the next mount clears it"
    )
    assert status(env)["restarts"] == 0
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 4, out.stderr
    assert f"daemon (pid {pid}) died" in out.stderr
    assert not mounted(mp) and daemons_of(mp) == []


@pytest.mark.fuse
@pytest.mark.slow
def test_a_daemon_that_fails_to_start_again_counts_as_a_death(
    azurite, container, proxy: FaultProxy, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    """The second restart finds its metrics port taken (during the 1 s
    backoff) and fails; the third, 2 s later, mounts again."""
    azurite.seed(container, {"ds/f.bin": BODY})
    port = free_port()
    env = env_for(azurite, proxy, tmp_path, container, DATAMOUNT_METRICS_PORT=str(port))
    cache = tmp_path / "cache"
    mp = mounts.point(tmp_path / "mnt")
    mount(tmp_path, mp, env)
    first = mounts.daemon(mp)
    os.kill(first, signal.SIGKILL)
    assert wait_for(lambda: serving_again(cache, mp, first), 30)
    second = mounts.daemon(mp)
    with socket.socket() as squatter:
        os.kill(second, signal.SIGKILL)
        assert wait_for(lambda: not alive(second))
        # the dead daemon's socket closes with its last thread: bind as soon as it did
        assert wait_for(lambda: _bound(squatter, port), 0.8), "the port stayed taken"
        squatter.listen()
        assert wait_for(lambda: "failed to start again" in runtime_log(tmp_path), 30)
    assert wait_for(lambda: serving_again(cache, mp, second), 30)
    assert (mp / "f.bin").read_bytes() == BODY
    record = read_supervision(cache, mp)
    assert record is not None and (record.deaths, record.restarts) == (3, 3)
    assert record.last_death.startswith("failed to start again: ")
    assert f"127.0.0.1:{port}" in record.last_death
    assert "in 2 s (restart 3 of 5)" in runtime_log(tmp_path)
    assert status(env)["restarts"] == 3
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert not mounted(mp) and daemons_of(mp) == []
