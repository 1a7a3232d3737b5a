"""Many nodes on one machine: 4 processes with their own RANK, cache folders
and mounts, against 2 Azurite instances standing for 2 accounts, each behind
a FaultProxy that counts its requests (and can answer 503 to everything).

The input is one folder replicated on both accounts (`replicas:`); node r
reads replica r % 2. Checked: every file or record is read exactly once per
epoch across the group, the reads split evenly between the accounts, a killed
node resumes from its saved state_dict() and finishes its shard, and an
account answering 503 to everything sends its nodes to the other one with
every byte still correct.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from azurite import Azurite, AzuriteMissing
from datamount.modes.download import Shard
from faultproxy import FaultProxy, _Head
from fuse_helpers import EXE, Mounts, tracked_mounts

pytestmark = pytest.mark.azurite

NODES = 4
CLI_TIMEOUT = 60


class DownProxy(FaultProxy):
    """A FaultProxy that, once `down` is set, answers 503 to every request."""

    down = False

    def _rule(self, head: _Head) -> tuple[str, int]:
        return ("fail", 503) if self.down else super()._rule(head)

    def _answer(self, client: socket.socket, head: _Head, action: str, status: int) -> None:
        if not self.down:
            return super()._answer(client, head, action, status)
        body = b"" if head.first.startswith(b"HEAD") else b"ServerBusy"
        client.sendall(
            b"HTTP/1.1 503 Service Unavailable\r\nx-ms-error-code: ServerBusy\r\n"
            b"Retry-After: 0\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        self._record(head, status, "down")


def _names() -> list[str]:
    """20 record files, 5 in each node's `--shard auto` part: an even split."""
    per = {r: [] for r in range(NODES)}  # type: dict[int, list[str]]
    i = 0
    while min(len(v) for v in per.values()) < 5:
        name = f"part-{i:03d}.jsonl"
        rank = next(r for r in range(NODES) if Shard(r, NODES).holds(name))
        if len(per[rank]) < 5:
            per[rank].append(name)
        i += 1
    return sorted(n for v in per.values() for n in v)


FILES = {
    name: "".join(
        json.dumps({"id": f"{name}:{j}", "pad": "x" * (50 + j)}) + "\n" for j in range(8)
    ).encode()
    for name in _names()
}
RECORDS = {json.loads(line)["id"] for data in FILES.values() for line in data.splitlines()}


@pytest.fixture(scope="module")
def accounts(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Account A: the session's Azurite; B: one of its own. The same files in
    container `train` of both, each account behind its own DownProxy."""
    second = Azurite(tmp_path_factory.mktemp("azurite_b"))
    try:
        second.start()
    except AzuriteMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    container = f"train{uuid.uuid4().hex[:16]}"
    try:
        for service in (azurite, second):
            service.seed(service.create_container(container), FILES)
        with DownProxy(azurite.port) as a, DownProxy(second.port) as b:
            yield {"a": a, "b": b, "container": container, "key": azurite.key}
    finally:
        second.stop()


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[Mounts]:
    yield from tracked_mounts(tmp_path)


def _spec(tmp_path: Path, accounts: dict, mode: str) -> Path:
    ws = tmp_path / "ws.yaml"
    ws.write_text(
        "datastores:\n"
        + "".join(
            f"  {n}: {{account_name: devstoreaccount1, container_name: {accounts['container']}, "
            f"endpoint: '{accounts[n].endpoint}', credentials: {{account_key: '${{TEST_KEY}}'}}}}\n"
            for n in "ab"
        )
    )
    spec = tmp_path / f"{mode}.yaml"
    spec.write_text(
        "type: uri_folder\npath: azureml://datastores/a/paths/\n"
        f"replicas: [azureml://datastores/b/paths/]\nmode: {mode}\n"
    )
    return spec


def _env(tmp_path: Path, accounts: dict, rank: int) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("DATASET_", "DATAMOUNT_"))}
    return {
        **keep,
        "TEST_KEY": accounts["key"],
        "DATAMOUNT_WORKSPACE": str(tmp_path / "ws.yaml"),
        "DATAMOUNT_CACHE_DIR": str(tmp_path / f"cache{rank}"),
        "AZUREML_DATASET_HTTP_RETRY_COUNT": "1",  # a 503 account is given up on fast
        "DATAMOUNT_RETRY_MIN_SECONDS": "0",
        "RANK": str(rank),
        "WORLD_SIZE": str(NODES),
    }


def _run_all(commands: list[tuple[list[str], dict[str, str]]]) -> list[str]:
    """Run the node processes at once; their stdout, each checked to exit 0."""
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for argv, env in commands
    ]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=CLI_TIMEOUT)
        assert proc.returncode == 0, err[-2000:]
        outs.append(out)
    return outs


def _ranged(proxy: FaultProxy, status: int = 206) -> list[str]:
    return [r.path.rpartition("/")[2] for r in proxy.ranged_gets() if r.status == status]


def _tree(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_download_shard_auto_on_4_nodes_over_2_accounts(tmp_path: Path, accounts: dict) -> None:
    a, b = accounts["a"], accounts["b"]
    spec = _spec(tmp_path, accounts, "download")
    a.reset(), b.reset()
    _run_all(
        [
            (
                [EXE, "download", str(spec), str(tmp_path / f"n{r}"), "--shard", "auto"],
                _env(tmp_path, accounts, r),
            )
            for r in range(NODES)
        ]  # fmt: skip
    )
    got = [_tree(tmp_path / f"n{r}") for r in range(NODES)]
    assert sum(len(g) for g in got) == len(FILES)  # none twice ...
    assert {k: v for g in got for k, v in g.items()} == FILES  # ... none missing, bytes equal
    for r, files in enumerate(got):
        assert sorted(files) == sorted(n for n in FILES if Shard(r, NODES).holds(n))
    # nodes 0 and 2 read account A, 1 and 3 account B: 10 files each
    assert sorted(_ranged(a)) == sorted([*got[0], *got[2]])
    assert sorted(_ranged(b)) == sorted([*got[1], *got[3]])

    # account A answers 503 to everything: its nodes fail over to B
    a.reset(), b.reset()
    a.down = True
    try:
        _run_all(
            [
                (
                    [EXE, "download", str(spec), str(tmp_path / f"m{r}"), "--shard", "auto"],
                    _env(tmp_path, accounts, r) | {"DATAMOUNT_CACHE_DIR": str(tmp_path / f"c{r}")},
                )
                for r in range(NODES)
            ]  # fmt: skip
        )
    finally:
        a.down = False
    again = {k: v for r in range(NODES) for k, v in _tree(tmp_path / f"m{r}").items()}
    assert again == FILES
    assert sorted(_ranged(b)) == sorted(FILES)
    assert a.requests and all(r.status == 503 for r in a.requests)


READER = """
import json, os, signal, sys
from datamount.data import RecordDataset

mountpoint, out, rank, stop_after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = RecordDataset(mountpoint, seed=7, shuffle=True, rank=rank, world_size=4)
lines = open(out).read().splitlines() if os.path.exists(out) else []
if lines:
    rows.load_state_dict(json.loads(lines[-1])["state"])
with open(out, "a") as f:
    for n, row in enumerate(rows):
        f.write(json.dumps({"row": row, "state": rows.state_dict()}) + "\\n")
        f.flush()
        if n + 1 == stop_after:
            os.kill(os.getpid(), signal.SIGKILL)  # a node dies mid-epoch
"""


@pytest.mark.slow
@pytest.mark.fuse
def test_4_mounted_nodes_read_once_and_a_killed_one_resumes(
    tmp_path: Path, accounts: dict, mounts: Mounts
) -> None:
    a, b = accounts["a"], accounts["b"]
    spec = _spec(tmp_path, accounts, "ro_mount")
    points = [mounts.point(tmp_path / f"mnt{r}") for r in range(NODES)]
    envs = [_env(tmp_path, accounts, r) for r in range(NODES)]
    reader = tmp_path / "reader.py"
    reader.write_text(READER)
    try:
        _run_all([([EXE, "mount", str(spec), str(points[r])], envs[r]) for r in range(NODES)])
        for mp in points:  # every node lists its mount while both accounts answer
            assert sorted(os.listdir(mp)) == sorted(FILES)
            for name in FILES:
                (mp / name).stat()
        a.reset(), b.reset()
        outs = [tmp_path / f"rows{r}.jsonl" for r in range(NODES)]

        def read(stop: dict[int, int]) -> list[subprocess.Popen[str]]:
            return [
                subprocess.Popen(
                    [
                        sys.executable,
                        str(reader),
                        str(points[r]),
                        str(outs[r]),
                        str(r),
                        str(stop.get(r, 0)),
                    ],
                    env=envs[r],
                    stderr=subprocess.PIPE,
                    text=True,
                )  # fmt: skip
                for r in range(NODES)
            ]

        # epoch 0, account A healthy; node 1 is killed after 3 records
        procs = read({1: 3})
        codes = [p.wait(CLI_TIMEOUT) for p in procs]
        assert codes[1] == -9 and codes[0] == codes[2] == codes[3] == 0
        ranged_a, ranged_b = len(_ranged(a)), len(_ranged(b))
        # node 1 resumes from its saved state and finishes its shard
        assert subprocess.run(
            [sys.executable, str(reader), str(points[1]), str(outs[1]), "1", "0"],
            env=envs[1], capture_output=True, timeout=CLI_TIMEOUT,
        ).returncode == 0  # fmt: skip
        ids = [json.loads(line)["row"]["id"] for o in outs for line in o.read_text().splitlines()]
        assert len(ids) == len(RECORDS) and set(ids) == RECORDS  # exactly once across the group
        # the reads split evenly: nodes 0 and 2 on A, 1 and 3 on B (before node 1's resume)
        assert ranged_a > 0 and ranged_b > 0
        assert abs(ranged_a - ranged_b) <= max(ranged_a, ranged_b) // 3
    finally:
        for r, mp in enumerate(points):
            subprocess.run([EXE, "unmount", str(mp)], env=envs[r], capture_output=True,
                           timeout=CLI_TIMEOUT)  # fmt: skip


@pytest.mark.fuse
def test_mounted_nodes_fail_over_mid_read_with_the_version_check(
    tmp_path: Path, accounts: dict, mounts: Mounts
) -> None:
    a, b = accounts["a"], accounts["b"]
    spec = _spec(tmp_path, accounts, "ro_mount")
    ranks = [0, 2]  # the nodes of account A
    points = {r: mounts.point(tmp_path / f"mnt{r}") for r in ranks}
    envs = {r: _env(tmp_path, accounts, r) for r in ranks}
    try:
        _run_all([([EXE, "mount", str(spec), str(points[r])], envs[r]) for r in ranks])
        for mp in points.values():  # listed from A while it answers
            assert sorted(os.listdir(mp)) == sorted(FILES)
            for name in FILES:
                (mp / name).stat()
        b.reset()
        a.down = True
        try:
            for mp in points.values():
                assert {n: (mp / n).read_bytes() for n in FILES} == FILES
        finally:
            a.down = False
        assert sorted(_ranged(b)) == sorted([*FILES, *FILES])  # every file once per node, from B
        heads = [r for r in b.requests if r.method == "HEAD"]
        assert len(heads) == 2 * len(FILES)  # each checked (size + Content-MD5) before reading
    finally:
        for r, mp in points.items():
            subprocess.run([EXE, "unmount", str(mp)], env=envs[r], capture_output=True,
                           timeout=CLI_TIMEOUT)  # fmt: skip
