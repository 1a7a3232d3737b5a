"""Logging: activity line format, runtime log opened with the settings,
secrets masked in both files, idempotent setup."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from datamount.log import (
    CAPABILITY_LOG,
    RUNTIME_LOG,
    activity,
    clear_secrets,
    redact,
    register_secret,
    setup_logging,
    shutdown_logging,
)
from datamount.storage.credentials import Secret

pytestmark = pytest.mark.unit

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
ACCOUNT_KEY = "c2VjcmV0LWFjY291bnQta2V5LXZhbHVl+/abc=="
SAS = "sv=2022-11-02&ss=b&srt=co&sp=rl&se=2030-01-01T00:00:00Z&sig=AbCdEf%2Bsecretsig%3D"
log = logging.getLogger("datamount.test")


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    shutdown_logging()
    clear_secrets()


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_activity_success_lines(tmp_path: Path) -> None:
    files = setup_logging(tmp_path / "logs", settings_lines=[])
    with activity("mount", input="train"):
        pass
    started, completed = lines(files.capability)
    assert re.fullmatch(rf"{STAMP} ActivityStarted, mount, input=train", started)
    assert re.fullmatch(
        rf"{STAMP} ActivityCompleted: Activity=mount, HowEnded=Success, "
        r"Duration=\d+ \[ms\], input=train",
        completed,
    )


def test_activity_failure_is_recorded_and_reraised(tmp_path: Path) -> None:
    files = setup_logging(tmp_path, settings_lines=[])
    with pytest.raises(ValueError, match="disk full"), activity("download"):
        raise ValueError("disk full\nsecond line")
    started, completed = lines(files.capability)
    assert started.endswith("ActivityStarted, download")
    assert re.fullmatch(
        rf"{STAMP} ActivityCompleted: Activity=download, HowEnded=Failure, "
        r"Duration=\d+ \[ms\], Error=ValueError: disk full",
        completed,
    )


def test_activity_works_as_a_decorator(tmp_path: Path) -> None:
    files = setup_logging(tmp_path, settings_lines=[])

    @activity("unmount")
    def unmount() -> int:
        return 3

    assert unmount() == 3
    assert "Activity=unmount, HowEnded=Success" in lines(files.capability)[-1]


def test_activity_lines_go_to_the_capability_log_only(tmp_path: Path) -> None:
    files = setup_logging(tmp_path, settings_lines=["A=1"])
    with activity("resolve"):
        log.info("resolving %s", "wasbs://c@a.blob.core.windows.net/p")
    assert all("Activity" not in line for line in lines(files.runtime))
    assert all("resolving" not in line for line in lines(files.capability))
    assert "resolving wasbs://c@a.blob.core.windows.net/p" in lines(files.runtime)[-1]


def test_runtime_log_starts_with_the_settings(tmp_path: Path) -> None:
    settings = ["DATASET_MOUNT_READ_BLOCK_SIZE=2MB", "DATASET_MOUNT_CACHE_SIZE=unlimited"]
    files = setup_logging(tmp_path, level="WARNING", settings_lines=settings)
    log.info("hidden below WARNING")
    log.warning("shown")
    first, *rest = lines(files.runtime)
    assert first.endswith("Effective settings:")
    assert [line.split(": ", 1)[1] for line in rest[:2]] == settings
    assert not any("hidden" in line for line in rest)
    assert re.fullmatch(rf"{STAMP} WARNING \S+ datamount.test: shown", rest[-1])


def test_setup_creates_the_folder_and_both_files(tmp_path: Path) -> None:
    files = setup_logging(tmp_path / "a" / "b", settings_lines=[])
    assert files.capability == tmp_path / "a" / "b" / CAPABILITY_LOG
    assert files.runtime == tmp_path / "a" / "b" / RUNTIME_LOG
    assert files.capability.exists() and files.runtime.exists()


def test_setup_is_idempotent(tmp_path: Path) -> None:
    setup_logging(tmp_path, settings_lines=[])
    files = setup_logging(tmp_path, settings_lines=[])
    log.info("once")
    with activity("twice-setup"):
        pass
    assert sum("once" in line for line in lines(files.runtime)) == 1
    assert len(lines(files.capability)) == 2


def test_setup_for_a_new_folder_moves_the_output(tmp_path: Path) -> None:
    old = setup_logging(tmp_path / "old", settings_lines=[])
    new = setup_logging(tmp_path / "new", settings_lines=[])
    log.info("where")
    assert not any("where" in line for line in lines(old.runtime))
    assert any("where" in line for line in lines(new.runtime))


def test_shutdown_closes_handlers_and_nothing_reaches_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = setup_logging(tmp_path, settings_lines=[])
    log.warning("to the file")
    shutdown_logging()
    shutdown_logging()  # idempotent
    log.info("after shutdown")
    text = files.runtime.read_text()
    assert "to the file" in text and "after shutdown" not in text
    assert "to the file" not in capsys.readouterr().err


def test_unknown_level_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        setup_logging(tmp_path, level="LOUD", settings_lines=[])


def test_secrets_never_reach_either_file(tmp_path: Path) -> None:
    register_secret(Secret(ACCOUNT_KEY))
    register_secret("?" + SAS)
    files = setup_logging(tmp_path, level="DEBUG", settings_lines=[f"KEY={ACCOUNT_KEY}"])
    url = f"https://acct.blob.core.windows.net/c/blob?{SAS}"
    log.debug("GET %s", url)
    log.info("conn DefaultEndpointsProtocol=https;AccountName=a;AccountKey=%s;", ACCOUNT_KEY)
    with activity("download", url=url), pytest.raises(RuntimeError):
        raise RuntimeError(f"failed {url} with key {ACCOUNT_KEY}")
    try:
        raise OSError(f"traceback holds {ACCOUNT_KEY}")
    except OSError:
        log.exception("boom")
    text = files.runtime.read_text() + files.capability.read_text()
    for secret in (ACCOUNT_KEY, SAS, "AbCdEf%2Bsecretsig%3D", "AbCdEf+secretsig="):
        assert secret not in text
    assert "***" in text
    assert "boom" in text and "traceback holds ***" in text


def test_unregistered_sas_signature_and_account_key_are_masked(tmp_path: Path) -> None:
    files = setup_logging(tmp_path, settings_lines=[])
    log.info("GET https://a.blob.core.windows.net/c/b?sv=2021-08-06&se=2030&sig=TopSecret%3D&sp=r")
    log.info("AccountName=a;AccountKey=Zm9vYmFyYmF6==;EndpointSuffix=core.windows.net")
    text = files.runtime.read_text()
    assert "TopSecret" not in text and "Zm9vYmFyYmF6" not in text
    assert "sig=***&sp=r" in text and "AccountKey=***;EndpointSuffix" in text


def test_redact() -> None:
    assert redact("https://x/y?sv=1&sig=abc%2F&se=2") == "https://x/y?sv=1&sig=***&se=2"
    assert redact("?sig=abc") == "?sig=***"
    assert redact("SharedAccessSignature=sv=1&sig=x;Blob=y") == "SharedAccessSignature=***;Blob=y"
    assert redact("AccountKey=abc==") == "AccountKey=***"
    assert redact("signature=ok, design=fine") == "signature=ok, design=fine"
    register_secret("my-secret-value")
    register_secret("abc")  # too short to mask safely: ignored
    assert redact("x my-secret-value y abc") == "x *** y abc"
    clear_secrets()
    assert redact("my-secret-value") == "my-secret-value"


def test_register_secret_is_thread_safe() -> None:
    values = [f"secret-number-{i:04d}" for i in range(200)]
    threads = [
        threading.Thread(target=lambda chunk=values[i::4]: [register_secret(v) for v in chunk])
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert redact(" ".join(values)) == " ".join(["***"] * len(values))
