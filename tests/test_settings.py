"""Settings: the documented defaults (docs/configuration.md), parsing of every variable, one clear
error line per bad variable, overrides, and no reads of os.environ."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from datamount.errors import EXIT_INVALID, SettingsError
from datamount.settings import (
    GB,
    KB,
    MB,
    Settings,
    default_cache_dir,
    format_size,
    parse_bool,
    parse_size,
)

pytestmark = pytest.mark.unit

CORES = 3


def from_env(env: dict[str, str], **overrides: object) -> Settings:
    return Settings.from_env(env, cpu_count=CORES, **overrides)


def problems(env: dict[str, str], **overrides: object) -> list[str]:
    with pytest.raises(SettingsError) as info:
        from_env(env, **overrides)
    assert info.value.exit_code == EXIT_INVALID
    return info.value.problems


def test_defaults_follow_the_design_table() -> None:
    s = from_env({"HOME": "/home/u"})
    assert s.downloader_threads == CORES * 4
    assert s.http_retry_count == 7
    assert s.attribute_cache_ttl_ms is None
    assert s.reserved_free_disk_space == 150 * 1024 * 1024
    assert s.cache_size is None
    assert s.prune_threshold == 1.0
    assert s.prune_target == 0.7
    assert s.read_block_size == 2 * 1024 * 1024
    assert s.read_buffer_block_count == 32
    assert s.read_threads == CORES * 4
    assert s.block_based_cache_enabled is True
    assert s.memory_cache_size == 128 * 1024 * 1024
    assert s.block_file_cache_enabled is True
    assert s.block_file_cache_max_queue_size == 512 * 1024 * 1024
    assert s.block_file_cache_write_threads == CORES * 2
    assert s.unmount_timeout_seconds == 30
    assert s.stall_timeout_seconds == 30
    assert s.download_fsync is True
    assert s.cache_dir == Path("/home/u/.cache/datamount")
    assert s.log_dir == Path("/home/u/.cache/datamount/logs")
    assert s.workspace is None
    assert s.log_level == "INFO"


def test_every_variable_is_read_from_the_environment() -> None:
    env = {
        "RSLEX_DOWNLOADER_THREADS": "5",
        "AZUREML_DATASET_HTTP_RETRY_COUNT": "0",
        "DATASET_MOUNT_ATTRIBUTE_CACHE_TTL": "60000",
        "DATASET_RESERVED_FREE_DISK_SPACE": "1GB",
        "DATASET_MOUNT_CACHE_SIZE": "20GB",
        "DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD": "0.9",
        "DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET": "0.5",
        "DATASET_MOUNT_READ_BLOCK_SIZE": "8MB",
        "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "0",
        "DATASET_MOUNT_READ_THREADS": "16",
        "DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "false",
        "DATASET_MOUNT_MEMORY_CACHE_SIZE": "0",
        "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "no",
        "DATASET_MOUNT_BLOCK_FILE_CACHE_MAX_QUEUE_SIZE": "64MB",
        "DATASET_MOUNT_BLOCK_FILE_CACHE_WRITE_THREADS": "1",
        "DATASET_UNMOUNT_TIMEOUT_SECONDS": "2.5",
        "DATAMOUNT_STALL_TIMEOUT_SECONDS": "7",
        "DATAMOUNT_DOWNLOAD_FSYNC": "false",
        "DATAMOUNT_CACHE_DIR": "/c",
        "DATAMOUNT_LOG_DIR": "/l",
        "DATAMOUNT_WORKSPACE": "/w/ws.yaml",
        "DATAMOUNT_LOG_LEVEL": "debug",
    }
    s = from_env(env)
    assert s.downloader_threads == 5
    assert s.http_retry_count == 0
    assert s.attribute_cache_ttl_ms == 60000
    assert s.reserved_free_disk_space == GB
    assert s.cache_size == 20 * GB
    assert (s.prune_threshold, s.prune_target) == (0.9, 0.5)
    assert s.read_block_size == 8 * MB
    assert s.read_buffer_block_count == 0
    assert s.read_threads == 16
    assert s.block_based_cache_enabled is False
    assert s.memory_cache_size == 0
    assert s.block_file_cache_enabled is False
    assert s.block_file_cache_max_queue_size == 64 * MB
    assert s.block_file_cache_write_threads == 1
    assert s.unmount_timeout_seconds == 2.5
    assert s.stall_timeout_seconds == 7
    assert s.download_fsync is False
    assert (s.cache_dir, s.log_dir) == (Path("/c"), Path("/l"))
    assert s.workspace == Path("/w/ws.yaml")
    assert s.log_level == "DEBUG"


def test_log_dir_follows_the_cache_dir_and_xdg_wins_over_home() -> None:
    s = from_env({"DATAMOUNT_CACHE_DIR": "/data/cache"})
    assert s.log_dir == Path("/data/cache/logs")
    assert default_cache_dir({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/datamount")
    assert default_cache_dir({"XDG_CACHE_HOME": "rel", "HOME": "/h"}) == Path("/h/.cache/datamount")
    assert default_cache_dir({}) == Path("/tmp/datamount-cache")


def test_unknown_and_empty_variables_are_ignored() -> None:
    s = from_env({"SOMETHING_ELSE": "x", "DATASET_MOUNT_READ_BLOCK_SIZE": "", "PATH": "/bin"})
    assert s.read_block_size == 2 * MB


def test_thread_defaults_scale_with_cpu_count() -> None:
    s = Settings.from_env({}, cpu_count=1)
    assert (s.downloader_threads, s.read_threads, s.block_file_cache_write_threads) == (4, 4, 2)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1048576", 1048576),
        ("0", 0),
        ("4096B", 4096),
        ("1KB", KB),
        ("1kb", KB),
        ("1K", KB),
        ("1KiB", KB),
        ("2MB", 2 * MB),
        ("2 MB", 2 * MB),
        ("2m", 2 * MB),
        ("2MiB", 2 * MB),
        ("3GB", 3 * GB),
        ("3gib", 3 * GB),
        ("1.5GB", 3 * GB // 2),
        (".5K", 512),
        (" 7G ", 7 * GB),
        ("-10GB", -10 * GB),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "MB", "1.2.3", "1 X", "1KBB", "1e3", "--1"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_format_size() -> None:
    assert format_size(2 * MB) == "2MB"
    assert format_size(150 * MB) == "150MB"
    assert format_size(3 * GB // 2) == "1.5GB"
    assert format_size(-10 * GB) == "-10GB"
    assert format_size(1000) == "1000"
    assert format_size(0) == "0"


@given(st.integers(min_value=-(2**50), max_value=2**50))
def test_format_size_round_trips(n: int) -> None:
    assert parse_size(format_size(n)) == n


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("TRUE", True), ("1", True), ("yes", True), ("Yes", True)]
    + [("false", False), ("False", False), ("0", False), ("no", False), ("NO", False)],
)
def test_parse_bool(text: str, expected: bool) -> None:
    assert parse_bool(text) is expected


@pytest.mark.parametrize("text", ["", "2", "maybe", "y", "truee"])
def test_parse_bool_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_bool(text)


def test_negative_cache_size_means_leave_that_much_free() -> None:
    s = from_env({"DATASET_MOUNT_CACHE_SIZE": "-10GB"})
    assert s.cache_size == -10 * GB
    # 100 GB free, cache holds 5 GB: it may grow until 10 GB stay free.
    assert s.cache_limit(free_bytes=100 * GB, used_bytes=5 * GB) == 95 * GB
    assert s.cache_limit(free_bytes=4 * GB, used_bytes=5 * GB) == 5 * GB


def test_cache_limit_honours_size_and_reserved_space() -> None:
    unlimited = from_env({})
    assert unlimited.cache_limit(free_bytes=GB, used_bytes=0) == GB - 150 * MB
    assert unlimited.cache_limit(free_bytes=100 * MB, used_bytes=7) == 7
    bounded = from_env({"DATASET_MOUNT_CACHE_SIZE": "2GB"})
    assert bounded.cache_limit(free_bytes=100 * GB, used_bytes=GB) == 2 * GB
    assert bounded.cache_limit(free_bytes=GB, used_bytes=0) == GB - 150 * MB
    # The larger of the two reserves wins.
    small = from_env({"DATASET_MOUNT_CACHE_SIZE": "-1MB"})
    assert small.cache_limit(free_bytes=GB, used_bytes=0) == GB - 150 * MB


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("RSLEX_DOWNLOADER_THREADS", "many", "not an integer"),
        ("RSLEX_DOWNLOADER_THREADS", "0", "must be from 1 to 4096"),
        ("AZUREML_DATASET_HTTP_RETRY_COUNT", "-1", "must be from 0 to 100"),
        ("AZUREML_DATASET_HTTP_RETRY_COUNT", "3.5", "not an integer"),
        ("DATASET_MOUNT_ATTRIBUTE_CACHE_TTL", "soon", "not an integer"),
        ("DATASET_MOUNT_ATTRIBUTE_CACHE_TTL", "-5", "must be from 0 to"),
        ("DATASET_RESERVED_FREE_DISK_SPACE", "-1MB", "must be from 0 to 1024TB"),
        ("DATASET_RESERVED_FREE_DISK_SPACE", "lots", "not a size"),
        ("DATASET_MOUNT_CACHE_SIZE", "big", "not a size"),
        ("DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD", "1.5", "(0, 1]"),
        ("DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD", "0", "(0, 1]"),
        ("DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET", "x", "not a number"),
        ("DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET", "-0.1", "(0, 1]"),
        ("DATASET_MOUNT_READ_BLOCK_SIZE", "abc", "not a size (use bytes or a KB/MB/GB suffix)"),
        ("DATASET_MOUNT_READ_BLOCK_SIZE", "1KB", "must be from 4KB to 256MB"),
        ("DATASET_MOUNT_READ_BLOCK_SIZE", "-2MB", "must be from 4KB to 256MB"),
        ("DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT", "-1", "must be from 0 to 4096"),
        ("DATASET_MOUNT_READ_THREADS", "0", "must be from 1 to 4096"),
        ("DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED", "maybe", "not a boolean"),
        ("DATASET_MOUNT_MEMORY_CACHE_SIZE", "-128MB", "must be from 0 to"),
        ("DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED", "2", "not a boolean"),
        ("DATASET_MOUNT_BLOCK_FILE_CACHE_MAX_QUEUE_SIZE", "1ZB", "not a size"),
        ("DATASET_MOUNT_BLOCK_FILE_CACHE_WRITE_THREADS", "-2", "must be from 1 to 4096"),
        ("DATASET_UNMOUNT_TIMEOUT_SECONDS", "-1", "must be from 0 to 86400"),
        ("DATASET_UNMOUNT_TIMEOUT_SECONDS", "nan", "not a number"),
        ("RSLEX_DOWNLOADER_THREADS", "100000000000", "must be from 1 to 4096"),
        ("DATASET_MOUNT_READ_BLOCK_SIZE", "4096GB", "must be from 4KB to 256MB"),
        ("DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT", "99999999999", "must be from 0 to 4096"),
        ("DATASET_MOUNT_CACHE_SIZE", "-2000TB", "must be from -1024TB to 1024TB"),
        ("DATAMOUNT_DOWNLOAD_PROCESSES", "1000", "must be from 1 to 256"),
        ("DATAMOUNT_RETRY_MIN_SECONDS", "1e9", "must be from 0 to 86400"),
        ("DATAMOUNT_MOUNT_UID", "-1", "must be from 0 to 4294967294"),
        ("DATAMOUNT_MOUNT_GID", "root", "not an integer"),
        ("DATAMOUNT_MOUNT_FILE_MODE", "0999", "not a mode (octal permission bits, e.g. 0440)"),
        ("DATAMOUNT_MOUNT_DIR_MODE", "1777", "must be from 0000 to 0777"),
        ("DATAMOUNT_MOUNT_ALLOW_OTHER", "everyone", "not a boolean"),
        ("DATAMOUNT_MOUNT_MAX_RESTARTS", "1000", "must be from 0 to 100"),
        ("DATAMOUNT_LOG_LEVEL", "loud", "not a log level"),
    ],
)
def test_invalid_value_names_variable_and_value(name: str, value: str, why: str) -> None:
    (line,) = problems({name: value})
    assert line.startswith(f"{name}={value!r}: ")
    assert why in line


def test_block_size_error_message_is_exact() -> None:
    assert problems({"DATASET_MOUNT_READ_BLOCK_SIZE": "abc"}) == [
        "DATASET_MOUNT_READ_BLOCK_SIZE='abc': not a size (use bytes or a KB/MB/GB suffix)"
    ]


def test_every_bad_variable_is_reported_and_no_validation_error_escapes() -> None:
    env = {
        "DATASET_MOUNT_READ_BLOCK_SIZE": "abc",
        "DATASET_MOUNT_READ_THREADS": "zero",
        "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "perhaps",
        "DATASET_MOUNT_CACHE_SIZE": "-",
    }
    lines = problems(env)
    assert len(lines) == 4
    for name, value in env.items():
        assert any(line.startswith(f"{name}={value!r}") for line in lines), name


def test_prune_target_above_threshold_is_rejected() -> None:
    (line,) = problems(
        {
            "DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD": "0.6",
            "DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET": "0.8",
        }
    )
    assert "DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET=0.8" in line
    assert "DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD=0.6" in line
    equal = {
        "DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD": "0.8",
        "DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET": "0.8",
    }
    assert from_env(equal).prune_target == 0.8


def test_overrides_win_over_the_environment() -> None:
    env = {"DATAMOUNT_CACHE_DIR": "/env/cache", "DATASET_MOUNT_READ_THREADS": "2"}
    s = from_env(env, cache_dir=Path("/flag/cache"), read_threads="9", workspace=None)
    assert s.cache_dir == Path("/flag/cache")
    assert s.log_dir == Path("/flag/cache/logs")
    assert s.read_threads == 9


def test_bad_override_is_a_settings_error_and_unknown_override_a_type_error() -> None:
    (line,) = problems({}, read_threads="x")
    assert "DATASET_MOUNT_READ_THREADS" in line and "'x'" in line
    with pytest.raises(TypeError):
        from_env({}, no_such_setting=1)


def test_from_env_does_not_read_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATASET_MOUNT_READ_BLOCK_SIZE", "8MB")
    monkeypatch.setenv("DATAMOUNT_CACHE_DIR", "/from/os/environ")
    monkeypatch.setenv("XDG_CACHE_HOME", "/from/os/xdg")
    s = from_env({})
    assert s.read_block_size == 2 * MB
    assert s.cache_dir == Path("/tmp/datamount-cache")
    assert Settings(cache_dir=Path("/c")).read_block_size == 2 * MB


def test_settings_are_frozen() -> None:
    s = from_env({})
    with pytest.raises(ValidationError):
        s.read_threads = 1


def test_describe_lists_every_variable_with_readable_values() -> None:
    lines = from_env({"HOME": "/h", "DATASET_MOUNT_CACHE_SIZE": "-10GB"}).describe()
    assert len(lines) == len(Settings.model_fields)
    assert "DATASET_MOUNT_READ_BLOCK_SIZE=2MB" in lines
    assert "DATASET_RESERVED_FREE_DISK_SPACE=150MB" in lines
    assert "DATASET_MOUNT_CACHE_SIZE=-10GB" in lines
    assert "DATASET_MOUNT_ATTRIBUTE_CACHE_TTL=never" in lines
    assert "DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=true" in lines
    assert "RSLEX_DOWNLOADER_THREADS=12" in lines
    assert "DATASET_UNMOUNT_TIMEOUT_SECONDS=30" in lines
    assert "DATAMOUNT_CACHE_DIR=/h/.cache/datamount" in lines
    assert "DATAMOUNT_LOG_LEVEL=INFO" in lines


def test_describe_masks_fields_that_look_secret() -> None:
    class WithSecret(Settings):
        storage_account_key: str = "hunter2-very-secret"

    lines = WithSecret.from_env({}).describe()
    assert any(line.endswith("=***") for line in lines)
    assert not any("hunter2" in line for line in lines)


def test_modes_are_octal_and_logged_in_octal() -> None:
    settings = from_env({"DATAMOUNT_MOUNT_FILE_MODE": "440", "DATAMOUNT_MOUNT_DIR_MODE": "0o750"})
    assert (settings.mount_file_mode, settings.mount_dir_mode) == (0o440, 0o750)
    lines = settings.describe()
    assert "DATAMOUNT_MOUNT_FILE_MODE=0440" in lines
    assert "DATAMOUNT_MOUNT_DIR_MODE=0750" in lines


def test_sizes_held_in_ram_must_fit_the_machines_memory() -> None:
    env = {
        "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "4000",
        "DATASET_MOUNT_READ_BLOCK_SIZE": "256MB",
    }
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env, cpu_count=CORES, memory_bytes=8 * GB)
    assert info.value.problems == [
        "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT x DATASET_MOUNT_READ_BLOCK_SIZE=1000GB: "
        "must not exceed this machine's memory (8.0GB)"
    ]
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"DATASET_MOUNT_MEMORY_CACHE_SIZE": "9GB"}, memory_bytes=8 * GB)
    assert info.value.problems == [
        "DATASET_MOUNT_MEMORY_CACHE_SIZE=9GB: must not exceed this machine's memory (8.0GB)"
    ]
    assert Settings.from_env(env, memory_bytes=0).read_buffer_block_count == 4000


_HOSTILE = st.one_of(
    st.sampled_from(
        [
            "0",
            "-1",
            "1e400",
            "nan",
            "inf",
            "-inf",
            "99999999999999999999",
            "1.5",
            "0x10",
            "4096GB",
            "-4096TB",
            "1ZB",
            "\x00",
            "\u00e9\u00e9",
            "yes please",
            " ",
            "1 2",
            "0o777",
        ]
    ),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.text(max_size=12),
)
_NUMERIC = [
    name
    for name, field in Settings.model_fields.items()
    if name not in {"cache_dir", "log_dir", "workspace", "ca_bundle", "metrics_host"}
]


@given(name=st.sampled_from(_NUMERIC), value=_HOSTILE)
def test_every_setting_refuses_hostile_values_in_one_line_or_keeps_them_in_range(
    name: str, value: str
) -> None:
    """Huge, negative, zero, float and garbage values: a SettingsError of one line
    naming the variable, or a value within the field's documented range."""
    from datamount.settings import field_range

    variable = Settings.env_names()[name]
    try:
        settings = Settings.from_env({variable: value}, cpu_count=CORES, memory_bytes=8 * GB)
    except SettingsError as exc:
        assert len(exc.problems) == 1
        assert "\n" not in exc.problems[0]
        assert variable in exc.problems[0]
        return
    bounds = field_range(Settings.model_fields[name])
    actual = getattr(settings, name)
    if bounds is not None and actual is not None:
        assert bounds.low <= actual <= bounds.high


def test_every_numeric_setting_has_an_upper_bound() -> None:
    from datamount.settings import field_range

    unbounded = [
        name
        for name, field in Settings.model_fields.items()
        if field.annotation in (int, float, int | None, float | None)
        and field_range(field) is None
        and name not in {"prune_threshold", "prune_target", "metrics_port"}
    ]
    assert unbounded == []
