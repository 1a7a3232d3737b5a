"""`datamount run` restarts a command that ended for a transient reason:
real Azurite behind a FaultProxy (request counts), real FUSE for the
ro_mount input and the rw_mount checkpoint folder.

A command that SIGKILLs itself twice after writing a checkpoint, then
succeeds: 3 attempts, each reading the checkpoints of the ones before back
exact; the input's bytes fetched once (the mount and its cache stay between
attempts); the upload output written once, at the end. A permanent failure
stops after one attempt; a spent budget gives the last attempt's exit code
and a summary line; a pipeline step restarts the same way; a job retry mounts
the input again over its warm cache.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from faultproxy import FaultProxy
from fuse_helpers import datamount, mount_env

pytestmark = [pytest.mark.azurite, pytest.mark.fuse, pytest.mark.usefixtures("run_scratch")]

DATA = random.Random(28).randbytes(3 * 1024 * 1024 + 17)

# Attempt n appends its line to the checkpoint, checks every earlier line is
# there, and SIGKILLs itself while n < $DIE_UNTIL (as the OOM killer would).
TRAIN = """\
set -eu
data="$1"; ckpt="$2"; model="$3"
n="$DATAMOUNT_RUN_ATTEMPT"
sha=$(sha256sum "$data" | cut -d' ' -f1)
if [ -f "$ckpt/state.txt" ]; then cp "$ckpt/state.txt" /tmp/dm-restart-$$; else : > /tmp/dm-restart-$$; fi
expected=""
i=1; while [ "$i" -lt "$n" ]; do expected="${expected}attempt $i $sha
"; i=$((i + 1)); done
[ "$(cat /tmp/dm-restart-$$)" = "$(printf %s "$expected")" ] || { echo "bad checkpoint"; exit 5; }
printf 'attempt %s %s\\n' "$n" "$sha" >> /tmp/dm-restart-$$
cp /tmp/dm-restart-$$ "$ckpt/state.txt.tmp" && mv "$ckpt/state.txt.tmp" "$ckpt/state.txt"
rm -f /tmp/dm-restart-$$
if [ "$n" -lt "${DIE_UNTIL:-0}" ]; then kill -KILL $$; fi
cp "$ckpt/state.txt" "$model/final.txt"
exit "${EXIT_WITH:-0}"
"""


def job(tmp_path: Path, **variables: str) -> Path:
    code = tmp_path / "src"
    code.mkdir(exist_ok=True)
    (code / "train.sh").write_text(TRAIN)
    spec = {
        "$schema": "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json",
        "name": "restarts",
        "code": "src",
        "command": "bash train.sh ${{inputs.data}} ${{outputs.ckpt}} ${{outputs.model}}",
        "environment_variables": variables,
        "inputs": {"data": {"type": "uri_file", "mode": "ro_mount",
                            "path": "azureml://datastores/store/paths/in/data.bin"}},
        "outputs": {
            "ckpt": {"type": "uri_folder", "mode": "rw_mount",
                     "path": "azureml://datastores/store/paths/ckpt/"},
            "model": {"type": "uri_folder", "mode": "upload",
                      "path": "azureml://datastores/store/paths/model/"},
        },
    }  # fmt: skip
    path = tmp_path / "job.yml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def via_proxy(azurite, container, proxy: FaultProxy, tmp_path: Path) -> dict[str, str]:  # noqa: ANN001
    container.upload_blob("in/data.bin", DATA, overwrite=True)
    via = SimpleNamespace(account=azurite.account, key=azurite.key, endpoint=proxy.endpoint)
    proxy.reset()
    return mount_env(via, tmp_path, container.container_name)


def data_bytes_fetched(proxy: FaultProxy) -> int:
    total = 0
    for r in proxy.requests:
        if r.method == "GET" and r.path.split("?")[0].endswith("/in/data.bin"):
            first, _, last = (
                (r.range or f"bytes=0-{len(DATA) - 1}").removeprefix("bytes=").partition("-")
            )
            total += min(int(last or len(DATA) - 1), len(DATA) - 1) - int(first) + 1
    return total


def puts_of(proxy: FaultProxy, name: str) -> int:
    return sum(
        1 for r in proxy.requests if r.method == "PUT" and f"/{name}" in r.path.split("?")[0]
    )


def three_attempts_exact(container, proxy: FaultProxy) -> None:  # noqa: ANN001
    """Each of 3 attempts read the checkpoints of the ones before back exact;
    the input's bytes came from storage once for all of them (its cache was
    kept); the upload output was written once, after the last attempt."""
    sha = hashlib.sha256(DATA).hexdigest()
    final = "".join(f"attempt {n} {sha}\n" for n in (1, 2, 3)).encode()
    assert container.download_blob("ckpt/state.txt").readall() == final
    assert container.download_blob("model/final.txt").readall() == final
    assert data_bytes_fetched(proxy) == len(DATA)
    assert puts_of(proxy, "model/final.txt") == 1


def test_a_command_killed_twice_resumes_from_its_checkpoint_and_succeeds(
    via_proxy: dict[str, str],
    container,
    proxy: FaultProxy,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    spec = job(tmp_path, DIE_UNTIL="3")
    out = datamount("run", str(spec), "--max-restarts", "2", env=via_proxy)
    assert out.returncode == 0, out.stderr
    err = out.stderr.splitlines()
    assert sum("attempt 1 of 3: was killed by SIGKILL (exit 137); restarting in 1 s" in x
               for x in err) == 1, err  # fmt: skip
    assert sum("attempt 2 of 3: was killed by SIGKILL (exit 137); restarting in 2 s" in x
               for x in err) == 1, err  # fmt: skip
    assert any(x.endswith("the command ran 3 attempts of 3; the last exited with 0") for x in err)
    three_attempts_exact(container, proxy)


def test_a_permanent_failure_and_a_spent_budget(
    via_proxy: dict[str, str],
    container,
    proxy: FaultProxy,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    # Exit 5 is no transient reason: one attempt, its code.
    spec = job(tmp_path, EXIT_WITH="5")
    env = {**via_proxy, "DATAMOUNT_RUN_MAX_RESTARTS": "4"}
    out = datamount("run", str(spec), env=env)
    assert out.returncode == 5, out.stderr
    assert "restarting" not in out.stderr
    assert any(
        x.endswith("the command ran 1 attempt of 5; the last exited with 5 (not transient)")
        for x in out.stderr.splitlines()
    ), out.stderr
    # Listed as transient: run again until the budget is spent; the last code wins.
    container.delete_blob("ckpt/state.txt")
    env["DATAMOUNT_RUN_RESTART_EXIT_CODES"] = "5"
    env["DATAMOUNT_RUN_MAX_RESTARTS"] = "1"
    out = datamount("run", str(spec), env=env)
    assert out.returncode == 5, out.stderr
    assert any(
        x.endswith("the command ran 2 attempts of 2; the last exited with 5 "
                   "(transient, restarts spent)") for x in out.stderr.splitlines()
    ), out.stderr  # fmt: skip
    assert out.stderr.count("restarting in") == 1


def test_a_bad_max_restarts_is_one_line(via_proxy: dict[str, str], tmp_path: Path) -> None:
    out = datamount("run", str(job(tmp_path)), "--max-restarts", "-1", env=via_proxy)
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1].endswith(
        "argument --max-restarts: must be from 0 to 100: '-1'"
    )


def test_a_pipeline_step_restarts_without_its_finished_predecessor(
    via_proxy: dict[str, str],
    container,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    marker = tmp_path / "first-runs"
    count = tmp_path / "count"
    steps = {
        "first": {
            "type": "command",
            "command": f"echo ran >> {marker}; echo x > ${{{{outputs.done}}}}/x",
        },
        "second": {
            "type": "command",
            # Killed on its first attempt, fine on its second.
            "command": f"echo $DATAMOUNT_RUN_ATTEMPT >> {count}; "
            '[ "$DATAMOUNT_RUN_ATTEMPT" -ge 2 ] || kill -KILL $$',
            "inputs": {"after": "${{parent.jobs.first.outputs.done}}"},
        },  # fmt: skip
    }
    steps["first"]["outputs"] = {"done": {"type": "uri_folder"}}
    spec = tmp_path / "pipe.yml"
    spec.write_text(
        yaml.safe_dump(
            {"type": "pipeline", "jobs": steps, "settings": {"default_datastore": "azureml:store"}}
        )
    )
    out = datamount("run", str(spec), "--max-restarts", "1", env=via_proxy)
    assert out.returncode == 0, out.stderr
    assert marker.read_text() == "ran\n"  # the predecessor ran once
    assert count.read_text() == "1\n2\n"


def test_a_job_retry_prepares_the_inputs_again_and_keeps_the_outputs(
    via_proxy: dict[str, str],
    container,
    proxy: FaultProxy,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    """One restart, then the whole job again (--max-retries 1): attempts 1 and
    2 die, attempt 3 runs in the second job run with the input mounted anew
    over its warm cache and the checkpoints of both earlier attempts."""
    spec = job(tmp_path, DIE_UNTIL="3")
    out = datamount("run", str(spec), "--max-restarts", "1", "--max-retries", "1",
                    env=via_proxy)  # fmt: skip
    assert out.returncode == 0, out.stderr
    err = out.stderr.splitlines()
    assert sum("attempt 1 of 2: was killed by SIGKILL (exit 137); restarting in 1 s" in x
               for x in err) == 1, err  # fmt: skip
    assert any(x.endswith(
        "job run 1 of 2: the command was killed by SIGKILL (exit 137) with its restarts "
        "spent; preparing the inputs again (outputs stay in place)") for x in err), err  # fmt: skip
    assert sum("inputs.data (ro_mount): " in x for x in err) == 2, err  # mounted twice
    assert any(x.endswith("the job ran 2 times of 2; the last attempt exited with 0") for x in err)
    three_attempts_exact(container, proxy)  # mounted twice over one cache: fetched once
