"""The Azure ML SDK as the oracle: every spec under tests/specs/ goes through
`azure.ai.ml.load_job` and `datamount validate`, and the verdicts (accept or
reject) agree.

Each file says in its first comment lines what the SDK answers (`# sdk:
accept|reject`), asserted here so the corpus cannot drift from the SDK it
describes. `# deliberate: <reason>` marks a case where datamount answers the
opposite on purpose (README, "Where datamount differs from the SDK");
`# pending: <build item>` one that issue 15 has not reached yet (an xfail
that fails once it passes, so the marker is removed with the work).

`load_job` parses and validates offline, with no workspace and no config
file; the `no_network` fixture makes any connection beyond loopback fail
the test.
"""

from __future__ import annotations

import logging
import re
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from datamount.cli.validate import validate
from datamount.errors import InvalidInput
from datamount.modes.context import Context
from datamount.settings import Settings

SPECS = Path(__file__).resolve().parent / "specs"
CORPUS = sorted(p for p in SPECS.rglob("*.yml") if "data" not in p.relative_to(SPECS).parts)
LOOPBACK = ("::1", "localhost")
HEADER = re.compile(r"^#\s*(sdk|deliberate|pending):\s*(.+?)\s*$")


def _header(path: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        match = HEADER.match(line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any socket connection to a non-loopback address fails the test."""
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> None:
        host = address[0] if isinstance(address, tuple) else address
        inet = self.family in (socket.AF_INET, socket.AF_INET6)
        loopback = isinstance(host, str) and (host.startswith("127.") or host in LOOPBACK)
        if inet and not loopback:
            pytest.fail(f"the oracle tried the network: connect to {address!r}")
        real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


@pytest.fixture(scope="module")
def load_job() -> Iterator[Any]:
    """The SDK's loader, imported once (its import takes about a second) and
    with its experimental-class chatter silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from azure.ai.ml import load_job as sdk_load_job
    sdk_logger = logging.getLogger("azure.ai.ml")
    level = sdk_logger.level
    sdk_logger.setLevel(logging.CRITICAL)
    yield sdk_load_job
    sdk_logger.setLevel(level)


def sdk_verdict(load_job: Any, path: Path) -> str:
    try:
        load_job(path)
    except Exception:  # the SDK raises marshmallow and its own errors alike
        return "reject"
    return "accept"


def datamount_verdict(path: Path, tmp_path: Path) -> str:
    """`datamount validate` without a workspace: the spec alone is judged."""
    environ = {"HOME": str(tmp_path)}
    settings = Settings.from_env(
        environ, cache_dir=str(tmp_path / "cache"), log_dir=str(tmp_path / "logs")
    )
    try:
        validate(Context(settings, environ, tmp_path), path)
    except InvalidInput:
        return "reject"
    return "accept"


@pytest.mark.unit
def test_the_corpus_covers_the_table() -> None:
    """Every type × mode × direction cell has its file, and the corpus holds
    at least 150 cases."""
    types = ["uri_file", "uri_folder", "mltable", "custom_model", "mlflow_model", "triton_model"]
    modes = ["ro_mount", "rw_mount", "download", "upload", "direct", "eval_mount", "eval_download"]
    for direction in ("input", "output"):
        for kind in types:
            for mode in [*modes, "mount"]:
                assert (SPECS / "table" / f"{direction}-{kind}-{mode}.yml").is_file()
    assert len(CORPUS) >= 150
    for path in CORPUS:
        assert _header(path).get("sdk") in ("accept", "reject"), path


@pytest.mark.oracle
@pytest.mark.usefixtures("no_network")
@pytest.mark.filterwarnings("ignore:The `context` parameter is deprecated")  # SDK on marshmallow 3
@pytest.mark.parametrize("path", CORPUS, ids=lambda p: str(p.relative_to(SPECS)))
def test_same_verdict_as_the_sdk(path: Path, load_job: Any, tmp_path: Path) -> None:
    header = _header(path)
    sdk = sdk_verdict(load_job, path)
    assert sdk == header["sdk"], f"the SDK now says {sdk}: fix the corpus header"
    expected = sdk
    if "deliberate" in header:
        expected = "reject" if sdk == "accept" else "accept"
    got = datamount_verdict(path, tmp_path)
    if "pending" in header and got != expected:
        pytest.xfail(f"pending: {header['pending']}")
    if "pending" in header:
        pytest.fail(f"{path.name} now gets {got} as intended: remove its `# pending:` line")
    assert got == expected, header.get("deliberate", "datamount and the SDK disagree")


@pytest.mark.unit
def test_no_network_fails_a_connection_beyond_loopback(no_network: None) -> None:
    with pytest.raises(pytest.fail.Exception, match="tried the network"):
        socket.create_connection(("192.0.2.1", 9), timeout=0.1)  # TEST-NET-1: never routed
