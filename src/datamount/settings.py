"""Typed settings of the runtime, read once from an environment mapping.

One job: turn the Azure ML data-runtime variables (docs/configuration.md) and
datamount's own DATAMOUNT_* knobs into one validated, frozen `Settings` value.
`Settings.from_env(environ)` is the only entry point the CLI needs; it never
reads `os.environ` itself (the CLI passes it in), so no module below the CLI
depends on ambient state. No threads.

Units: sizes accept plain bytes or a K/M/G/T suffix (KB, MiB, "1.5 GB", any
case). Like Azure ML, every suffix is binary: 1 KB = 1024 bytes, 1 MB = 1024**2.
An empty variable counts as unset. A bad value raises `SettingsError` with one
line per bad variable, naming it and the value; pydantic's ValidationError
never escapes.
"""

from __future__ import annotations

import math
import os
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError

from datamount.errors import SettingsError

KB = 1024
MB = 1024 * KB
GB = 1024 * MB
TB = 1024 * GB

_UNITS = {"": 1, "B": 1, "K": KB, "M": MB, "G": GB, "T": TB}
_SIZE_RE = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?:([KMGT])(?:I?B)?|(B))?$", re.I)
_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_SECRET_WORDS = ("key", "token", "secret", "sas", "password")
MASK = "***"


def parse_size(text: str) -> int:
    """'1048576', '512KB', '2 MiB', '1.5g', '-10GB' -> bytes (binary units).

    Fractions of a byte are dropped. Raises ValueError on anything else.
    """
    match = _SIZE_RE.match(text.strip())
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    number, unit, _bytes = match.groups()
    return int(Decimal(number) * _UNITS[(unit or "").upper()])


def format_size(n: int) -> str:
    """Bytes -> the shortest exact form parse_size reads back: 2097152 -> '2MB'.

    Uses the largest unit that shows the value with at most two decimals
    exactly ('1.5GB'); otherwise plain bytes.
    """
    sign, magnitude = ("-", -n) if n < 0 else ("", n)
    for suffix, unit in (("TB", TB), ("GB", GB), ("MB", MB), ("KB", KB)):
        if magnitude >= unit and (magnitude * 100) % unit == 0:
            number = f"{Decimal(magnitude * 100 // unit) / 100:f}"
            if "." in number:
                number = number.rstrip("0").rstrip(".")
            return f"{sign}{number}{suffix}"
    return f"{sign}{magnitude}"


def parse_bool(text: str) -> bool:
    """true/false, 1/0, yes/no (any case). Raises ValueError on anything else."""
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"not a boolean: {text!r}")


# --- field types: parse strings, then check bounds; errors become one line each ----


def _error(message: str) -> PydanticCustomError:
    return PydanticCustomError("datamount_setting", message)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _parser(parse: Callable[[str], Any], message: str) -> BeforeValidator:
    """A before-validator: strings go through `parse`; a ValueError becomes `message`."""

    def before(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return parse(value.strip())
        except ValueError:
            raise _error(message) from None

    return BeforeValidator(before)


_TO_SIZE = _parser(parse_size, "not a size (use bytes or a KB/MB/GB suffix)")
_TO_INT = _parser(int, "not an integer")
_TO_FLOAT = _parser(_finite, "not a number")
_TO_BOOL = _parser(parse_bool, "not a boolean (use true/false, 1/0 or yes/no)")


def _mode(text: str) -> int:
    """'0440', '440', '0o440' -> 0o440: permission bits are written in octal."""
    digits = text.lower().removeprefix("0o")
    if not digits or any(c not in "01234567" for c in digits):
        raise ValueError(text)
    return int(digits, 8)


_TO_MODE = _parser(_mode, "not a mode (octal permission bits, e.g. 0440)")


def _exit_codes(text: str) -> tuple[int, ...]:
    """'1, 75' -> (1, 75): exit codes 1-255, comma-separated; '' -> ()."""
    codes = tuple(int(part) for part in text.split(",") if part.strip())
    if any(not 1 <= code <= 255 for code in codes):
        raise ValueError(text)
    return codes


_TO_EXIT_CODES = _parser(
    _exit_codes, "not a list of exit codes (whole numbers 1 to 255, comma-separated)"
)


@dataclass(frozen=True)
class Range:
    """An after-validator: the value lies in [low, high]. `show` writes a bound
    the way the variable is written (a size as '256MB', a mode in octal); the
    settings page lists `text()`."""

    low: float
    high: float
    show: Callable[[Any], str] = str

    def __call__(self, value: Any) -> Any:
        if value is not None and not self.low <= value <= self.high:
            raise _error(f"must be from {self.text()}")
        return value

    def text(self) -> str:
        return f"{self.show(self.low)} to {self.show(self.high)}"


def _octal(value: Any) -> str:
    return f"{int(value):04o}"


def _seconds(value: Any) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _fraction(value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise _error("must be a fraction in (0, 1]")
    return value


def _log_level(text: str) -> str:
    name = {"WARN": "WARNING"}.get(text.upper(), text.upper())
    if name not in _LOG_LEVELS:
        raise ValueError(text)
    return name


# Upper bounds. Threads: a few thousand (each holds a stack and a connection;
# past that the kernel's and the storage account's limits come first).
# Processes: one per core of the largest nodes. Sizes: 1024TB (1 PiB, larger
# than any disk a node mounts). A block: 256MB, 64 x Azure ML's 4MB GET
# chunk: one block is one GET held in RAM. Seconds: one day. Sizes held in RAM
# (the RAM tier, the disk queue, the prefetch window) are also checked
# against the machine's memory, see Settings._fits_memory.
MAX_THREADS = 4096
MAX_PROCESSES = 256
MAX_RETRIES = 100
MAX_BLOCK_COUNT = 4096
MAX_SIZE = 1024 * TB
MAX_BLOCK_SIZE = 256 * MB
MAX_SECONDS = 86400.0
MAX_TTL_MS = 365 * 86400 * 1000
MAX_ID = 2**32 - 2  # (uid_t)-1 means "unchanged" to chown

Size = Annotated[int, _TO_SIZE, AfterValidator(Range(0, MAX_SIZE, format_size))]
SignedSize = Annotated[int, _TO_SIZE, AfterValidator(Range(-MAX_SIZE, MAX_SIZE, format_size))]
Threads = Annotated[int, _TO_INT, AfterValidator(Range(1, MAX_THREADS))]
Processes = Annotated[int, _TO_INT, AfterValidator(Range(1, MAX_PROCESSES))]
Retries = Annotated[int, _TO_INT, AfterValidator(Range(0, MAX_RETRIES))]
BlockCount = Annotated[int, _TO_INT, AfterValidator(Range(0, MAX_BLOCK_COUNT))]
Seconds = Annotated[float, _TO_FLOAT, AfterValidator(Range(0, MAX_SECONDS, _seconds))]
Fraction = Annotated[float, _TO_FLOAT, AfterValidator(_fraction)]
Flag = Annotated[bool, _TO_BOOL]
# Optional values: validators wrap the whole union, so a bad value is one error, not one per branch.
OptionalTtl = Annotated[int | None, _TO_INT, AfterValidator(Range(0, MAX_TTL_MS))]
OptionalSignedSize = Annotated[
    int | None, _TO_SIZE, AfterValidator(Range(-MAX_SIZE, MAX_SIZE, format_size))
]
OptionalId = Annotated[int | None, _TO_INT, AfterValidator(Range(0, MAX_ID))]
OptionalMode = Annotated[int | None, _TO_MODE, AfterValidator(Range(0, 0o777, _octal))]
ExitCodes = Annotated[tuple[int, ...], _TO_EXIT_CODES]
LogLevel = Annotated[
    str, _parser(_log_level, f"not a log level (use one of {', '.join(_LOG_LEVELS)})")
]
BlockSize = Annotated[int, _TO_SIZE, AfterValidator(Range(4 * KB, MAX_BLOCK_SIZE, format_size))]


def field_range(field: Any) -> Range | None:
    """The Range a Settings field is checked against, if any (for the settings page)."""
    for meta in field.metadata:
        if isinstance(getattr(meta, "func", None), Range):
            return meta.func
    return None


def machine_memory() -> int:
    """Physical memory of the machine in bytes (0 when unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


# --- storage levels: DATAMOUNT_STORAGE_LEVEL presets over the cache tiers -----------

# Each level sets these three DATASET_MOUNT_* knobs (field -> value); an
# explicit variable (or CLI override) of the same knob wins. All three keep
# block mode: whole-file mode stays DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=false.
# memory: a 1 GiB RAM tier (8x the default) holds an epoch's blocks, no disk writes;
# memory_disk: the defaults spelled out; disk: no RAM tier, every re-read from disk.
STORAGE_LEVELS: dict[str, dict[str, Any]] = {
    "memory": {
        "block_based_cache_enabled": True,
        "memory_cache_size": 1 * GB,
        "block_file_cache_enabled": False,
    },
    "memory_disk": {
        "block_based_cache_enabled": True,
        "memory_cache_size": 128 * MB,
        "block_file_cache_enabled": True,
    },
    "disk": {
        "block_based_cache_enabled": True,
        "memory_cache_size": 0,
        "block_file_cache_enabled": True,
    },
}
STORAGE_LEVEL_ENV = "DATAMOUNT_STORAGE_LEVEL"


def _apply_storage_level(data: dict[str, Any]) -> dict[str, Any]:
    """The before-validator step: fill the level's knobs that `data` does not
    set (by field name or variable name); a bad level is one error line."""
    raw = data.get("storage_level", data.get(STORAGE_LEVEL_ENV))
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return data
    level = str(raw).strip().lower()
    if level not in STORAGE_LEVELS:
        raise _error(
            f"{STORAGE_LEVEL_ENV}={raw!r}: not a storage level (use {', '.join(STORAGE_LEVELS)})"
        )
    data = {k: v for k, v in data.items() if k != STORAGE_LEVEL_ENV}
    data["storage_level"] = level
    for name, value in STORAGE_LEVELS[level].items():
        alias = Settings.model_fields[name].alias
        if name not in data and alias not in data:
            data[name] = value
    return data


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else format_size(value)


def storage_level_line(settings: Settings) -> str | None:
    """The one log line of the level: the values it set, and any explicit
    variable that won over it; None without a level."""
    level = settings.storage_level
    if level is None:
        return None
    set_by_level: list[str] = []
    explicit: list[str] = []
    for name, value in STORAGE_LEVELS[level].items():
        alias = Settings.model_fields[name].alias
        actual = getattr(settings, name)
        (set_by_level if actual == value else explicit).append(f"{alias}={_show(actual)}")
    line = f"storage level {level}: {' '.join(set_by_level) or 'nothing'}"
    return line + (f" (explicit, wins over the level: {' '.join(explicit)})" if explicit else "")


def _ca_bundle(value: Path | None) -> Path | None:
    """A PEM file (or a c_rehash'ed folder) of CA certificates, checked now:
    a bad one is one SettingsError line, not a TLS failure on first request."""
    if value is None:
        return None
    if value.is_dir():
        return value
    if not value.is_file():
        raise _error("no such file (a PEM file of CA certificates)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=str(value))
    except (OSError, ssl.SSLError):
        raise _error("not a PEM file of CA certificates") from None
    return value


CaBundle = Annotated[Path | None, AfterValidator(_ca_bundle)]


def _port(value: int | None) -> int | None:
    if value is not None and not 0 <= value <= 65535:
        raise _error("not a TCP port (0-65535; 0 picks a free one)")
    return value


def _host(value: str) -> str:
    if not value.strip() or any(c.isspace() or c in "/[]" for c in value.strip()):
        raise _error("not a host name or IP address")
    return value.strip()


MetricsPort = Annotated[int | None, _TO_INT, AfterValidator(_port)]
MetricsHost = Annotated[str, AfterValidator(_host)]


def _cores() -> int:
    return os.cpu_count() or 1


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    """$XDG_CACHE_HOME/datamount, else $HOME/.cache/datamount, else /tmp/datamount-cache."""
    xdg = environ.get("XDG_CACHE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "datamount"
    if environ.get("HOME"):
        return Path(environ["HOME"]) / ".cache" / "datamount"
    return Path("/tmp/datamount-cache")


class Settings(BaseModel):
    """Every knob of the runtime. Field names are snake_case; each is aliased to
    its environment variable. Sizes are bytes."""

    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")

    downloader_threads: Threads = Field(
        default_factory=lambda: _cores() * 4,
        alias="RSLEX_DOWNLOADER_THREADS",
        description=(
            "Concurrent workers of a `download` or an `upload`, of whole-file mode's "
            "downloads and of an rw_mount's uploads. Unset, a download keeps more requests in "
            "flight over a link with a long round trip (up to 32)."
        ),
    )
    http_retry_count: Retries = Field(
        7,
        alias="AZUREML_DATASET_HTTP_RETRY_COUNT",
        description=(
            "Retries of one storage request on a transient failure (connection refused or "
            "reset, timeout, 408, 429, 500, 502, 503, 504), with exponential backoff, equal "
            "jitter and `Retry-After`, and at least until DATAMOUNT_RETRY_MIN_SECONDS have "
            "passed."
        ),
    )
    # None: attributes never expire (read-only mounts); rw mounts pick a finite TTL.
    attribute_cache_ttl_ms: OptionalTtl = Field(
        None,
        alias="DATASET_MOUNT_ATTRIBUTE_CACHE_TTL",
        description=(
            "Milliseconds a mount keeps a file's attributes before it asks storage again; "
            "unset: they never expire on a read-only mount (an rw_mount picks a finite TTL)."
        ),
    )
    reserved_free_disk_space: Size = Field(
        150 * MB,
        alias="DATASET_RESERVED_FREE_DISK_SPACE",
        description=(
            "Disk space the runtime never uses: downloads, the disk cache and rw_mount "
            "staging leave this much free."
        ),
    )
    # None: unlimited. Negative: leave that many bytes of the disk free. See cache_limit().
    cache_size: OptionalSignedSize = Field(
        None,
        alias="DATASET_MOUNT_CACHE_SIZE",
        description=(
            "Bound of a mount's disk cache; unset: unlimited; negative: leave that many bytes"
            " of the disk free."
        ),
    )
    prune_threshold: Fraction = Field(
        1.0,
        alias="DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD",
        description=(
            "The disk cache starts pruning least-recently-used entries when it holds this "
            "fraction of its bound."
        ),
    )
    prune_target: Fraction = Field(
        0.7,
        alias="DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET",
        description=(
            "The disk cache prunes down to this fraction of its bound; at most the threshold."
        ),
    )
    read_block_size: BlockSize = Field(
        2 * MB,
        alias="DATASET_MOUNT_READ_BLOCK_SIZE",
        description="Block size of a mount's reads in block mode.",
    )
    read_buffer_block_count: BlockCount = Field(
        32,
        alias="DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT",
        description=(
            "Blocks a sequential reader's prefetch window grows to, per open file; "
            "sequential streams reading at once share the mount's prefetch budget equally."
        ),
    )
    read_threads: Threads = Field(
        default_factory=lambda: _cores() * 4,
        alias="DATASET_MOUNT_READ_THREADS",
        description=(
            "Workers that fetch a mount's blocks (reads someone waits for before prefetch). "
            "Unset, a ro_mount keeps more requests in flight over a link with a long round "
            "trip (up to 64)."
        ),
    )
    block_based_cache_enabled: Flag = Field(
        True,
        alias="DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED",
        description=(
            "Block mode; false: whole-file mode (an open downloads the whole file into the "
            "cache folder)."
        ),
    )
    memory_cache_size: Size = Field(
        128 * MB,
        alias="DATASET_MOUNT_MEMORY_CACHE_SIZE",
        description="RAM tier of a mount's block cache; 0 turns it off.",
    )
    block_file_cache_enabled: Flag = Field(
        True,
        alias="DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED",
        description="Disk tier of the block cache, under `<cache>/blocks/`.",
    )
    block_file_cache_max_queue_size: Size = Field(
        512 * MB,
        alias="DATASET_MOUNT_BLOCK_FILE_CACHE_MAX_QUEUE_SIZE",
        description=(
            "RAM of blocks waiting for the disk writers; when it is full a block is not "
            "written to disk (reads never wait)."
        ),
    )
    block_file_cache_write_threads: Threads = Field(
        default_factory=lambda: _cores() * 2,
        alias="DATASET_MOUNT_BLOCK_FILE_CACHE_WRITE_THREADS",
        description="Disk-writer threads of the disk tier.",
    )
    unmount_timeout_seconds: Seconds = Field(
        30.0,
        alias="DATASET_UNMOUNT_TIMEOUT_SECONDS",
        description=(
            "How long an unmount (the command, SIGTERM or SIGINT to a daemon) waits for open "
            "files, and an rw_mount's uploads, before it forces the unmount."
        ),
    )
    # A storage read that receives no byte for this long is aborted and retried.
    stall_timeout_seconds: Seconds = Field(
        30.0,
        alias="DATAMOUNT_STALL_TIMEOUT_SECONDS",
        description="A storage read that receives no byte for this long is aborted and retried.",
    )
    # fsync every downloaded file before its rename (durable across a power loss);
    # false: the rename alone (atomic for a process crash), at page-cache speed.
    download_fsync: Flag = Field(
        True,
        alias="DATAMOUNT_DOWNLOAD_FSYNC",
        description=(
            "fsync every downloaded file before its rename (durable across a power loss); "
            "false: the rename alone (atomic for a process crash), at page-cache speed."
        ),
    )
    # > 1: a download's small files are fetched by that many worker processes
    # (transfer.processlane), each with its own connection pool and GIL; 1: in-process.
    download_processes: Processes = Field(
        1,
        alias="DATAMOUNT_DOWNLOAD_PROCESSES",
        description=(
            "> 1: a download's small files are fetched by that many worker processes, each "
            "with its own connection pool and GIL; 1: in-process."
        ),
    )
    # > 1: a ro_mount's block fetches (whole small files, blocks, runs of blocks)
    # are made by that many worker processes (read/fetchlane.py), each with its own
    # connection pool and GIL; 1: in the daemon.
    mount_processes: Processes = Field(
        1,
        alias="DATAMOUNT_MOUNT_PROCESSES",
        description=(
            "> 1: a ro_mount's block fetches (whole small files, blocks, runs of blocks) are "
            "made by that many worker processes, each with its own connection pool and GIL; "
            "1: in the daemon."
        ),
    )

    # Retries ride out an outage of at least this long (storage.retry).
    retry_min_seconds: Seconds = Field(
        90.0,
        alias="DATAMOUNT_RETRY_MIN_SECONDS",
        description=(
            "A transient storage failure is retried until at least this many seconds have "
            "passed, and at least AZUREML_DATASET_HTTP_RETRY_COUNT times, whichever is "
            "later; 0 with a retry count of 1 fails fast."
        ),
    )
    # -- access to a mount (the peers' allow-other, uid, gid, file-mode, dir-mode) --
    mount_allow_other: Flag = Field(
        False,
        alias="DATAMOUNT_MOUNT_ALLOW_OTHER",
        description=(
            "Open a mount to other users (FUSE `allow_other`, always with "
            "`default_permissions`: the kernel enforces the owner and modes); false: only "
            "the user who mounted it."
        ),
    )
    mount_uid: OptionalId = Field(
        None,
        alias="DATAMOUNT_MOUNT_UID",
        description="Owner of a mount's files and folders; unset: the user who mounted it.",
    )
    mount_gid: OptionalId = Field(
        None,
        alias="DATAMOUNT_MOUNT_GID",
        description=(
            "Group of a mount's files and folders; unset: the group of the user who mounted it."
        ),
    )
    mount_file_mode: OptionalMode = Field(
        None,
        alias="DATAMOUNT_MOUNT_FILE_MODE",
        description=(
            "Permission bits of a mount's files, in octal; unset: 0444 on a read-only mount, "
            "0755 on an rw_mount (a script written to an output runs)."
        ),
    )
    mount_dir_mode: OptionalMode = Field(
        None,
        alias="DATAMOUNT_MOUNT_DIR_MODE",
        description=(
            "Permission bits of a mount's folders, in octal; unset: 0555 on a read-only "
            "mount, 0755 on an rw_mount."
        ),
    )
    mount_max_restarts: Retries = Field(
        5,
        alias="DATAMOUNT_MOUNT_MAX_RESTARTS",
        description=(
            "Times a mount whose daemon died is mounted again in place, with the same plan "
            "and cache folder, before it is given up; 0: a dead daemon's mount stays stale."
        ),
    )

    # -- `datamount run`: a command that dies of a transient cause is run again --
    run_max_restarts: Retries = Field(
        0,
        alias="DATAMOUNT_RUN_MAX_RESTARTS",
        description=(
            "Times `datamount run` runs a job's command again after it ended for a transient "
            "reason (killed by SIGKILL, as the OOM killer does: exit 137; or an exit code of "
            "DATAMOUNT_RUN_RESTART_EXIT_CODES), its inputs still mounted and its outputs in "
            "place (`--max-restarts` wins); 0, as an Azure ML command job: never."
        ),
    )
    run_max_retries: Retries = Field(
        0,
        alias="DATAMOUNT_RUN_MAX_RETRIES",
        description=(
            "Times `datamount run` runs a whole job again once its command ended for a "
            "transient reason with its restarts spent: the inputs unmounted and prepared "
            "anew (caches kept), the outputs in place (`--max-retries` wins); 0: never."
        ),
    )
    run_restart_exit_codes: ExitCodes = Field(
        (),
        alias="DATAMOUNT_RUN_RESTART_EXIT_CODES",
        description=(
            "Exit codes of a job's command that count as transient beside 137 (SIGKILL), "
            "comma-separated; any other ends the run at once."
        ),
    )
    pipeline_parallel: Processes = Field(
        2,
        alias="DATAMOUNT_PIPELINE_PARALLEL",
        description="Steps of a pipeline job that `datamount run` runs at once.",
    )
    # -- operability (issue 13): Prometheus metrics of daemons and long transfers --
    # None: no metrics endpoint. 0: a free port (the daemon records its URL, see
    # `datamount status --json`). Binds DATAMOUNT_METRICS_HOST (loopback by default).
    metrics_port: MetricsPort = Field(
        None,
        alias="DATAMOUNT_METRICS_PORT",
        description=(
            "Port of the Prometheus metrics endpoint; unset: none; 0: a free port (shown by "
            "`datamount status --json`). It binds DATAMOUNT_METRICS_HOST."
        ),
    )
    metrics_host: MetricsHost = Field(
        "127.0.0.1",
        alias="DATAMOUNT_METRICS_HOST",
        description=(
            "Address the metrics endpoint binds (`0.0.0.0` for a scraper in another pod)."
        ),
    )

    cache_dir: Path = Field(
        default_factory=lambda: default_cache_dir({}),
        alias="DATAMOUNT_CACHE_DIR",
        description=(
            "Cache folder: blocks, whole-file copies, staging, resume manifests, mount state "
            "(`--cache-dir` wins)."
        ),
    )
    log_dir: Path = Field(
        alias="DATAMOUNT_LOG_DIR", description=("Log folder (`--log-dir` wins).")
    )  # default <cache_dir>/logs, see below
    # None: the CLI uses ./configs/workspace.yaml
    workspace: Path | None = Field(
        None,
        alias="DATAMOUNT_WORKSPACE",
        description="The workspace file (`--workspace` wins); unset: ./configs/workspace.yaml.",
    )
    log_level: LogLevel = Field(
        "INFO", alias="DATAMOUNT_LOG_LEVEL", description=("Level of the runtime log.")
    )
    # CAs trusted for HTTPS beside the system store (storage.tls), as the Azure SDK reads it.
    ca_bundle: CaBundle = Field(
        None,
        alias="REQUESTS_CA_BUNDLE",
        description="CAs trusted for HTTPS beside the system store, as the Azure SDK reads it.",
    )
    # A preset over the cache tiers (STORAGE_LEVELS); applied in _storage_level.
    storage_level: str | None = Field(
        None,
        alias="DATAMOUNT_STORAGE_LEVEL",
        description=(
            "A preset over the cache tiers: `memory` (a RAM tier of 1 GB, no disk tier), "
            "`memory_disk` or `disk`; a tier setting given explicitly wins over the preset."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _storage_level(cls, data: Any) -> Any:
        return _apply_storage_level(data) if isinstance(data, dict) else data

    @model_validator(mode="before")
    @classmethod
    def _default_log_dir(cls, data: Any) -> Any:
        if isinstance(data, dict) and not {"log_dir", "DATAMOUNT_LOG_DIR"} & data.keys():
            cache_dir = data.get("cache_dir", data.get("DATAMOUNT_CACHE_DIR"))
            base = default_cache_dir({}) if cache_dir is None else Path(cache_dir)
            data = {**data, "log_dir": base / "logs"}
        return data

    @model_validator(mode="after")
    def _target_within_threshold(self) -> Settings:
        if self.prune_target > self.prune_threshold:
            raise _error(
                f"DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET={self.prune_target}: must not exceed "
                f"DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD={self.prune_threshold}"
            )
        return self

    @model_validator(mode="after")
    def _fits_memory(self, info: ValidationInfo) -> Settings:
        """Sizes held in RAM fit the machine's memory (from_env's `memory_bytes`)."""
        memory = (info.context or {}).get("memory_bytes", 0)
        if not memory:
            return self
        window = self.read_buffer_block_count * self.read_block_size
        held = {
            "DATASET_MOUNT_MEMORY_CACHE_SIZE": self.memory_cache_size,
            "DATASET_MOUNT_BLOCK_FILE_CACHE_MAX_QUEUE_SIZE": self.block_file_cache_max_queue_size,
            "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT x DATASET_MOUNT_READ_BLOCK_SIZE": window,
        }
        for name, size in held.items():
            if size > memory:
                raise _error(
                    f"{name}={format_size(size)}: must not exceed this machine's memory "
                    f"({memory / GB:.1f}GB)"
                )
        return self

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        *,
        cpu_count: int | None = None,
        memory_bytes: int | None = None,
        **overrides: Any,
    ) -> Settings:
        """Read the known variables from `environ` (others are ignored).

        `cpu_count` fixes the cores the thread defaults scale with (default:
        os.cpu_count()); `memory_bytes` the memory the sizes held in RAM must
        fit (default: the machine's; 0: unchecked). `overrides` are field names
        (e.g. cache_dir from a CLI flag) and win over the environment; an
        override of None is ignored so the CLI can pass its optional flags
        straight through.
        """
        cores = cpu_count if cpu_count is not None else _cores()
        if cores < 1:
            raise ValueError(f"cpu_count must be >= 1, not {cores}")
        unknown = overrides.keys() - cls.model_fields.keys()
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        data: dict[str, Any] = {
            "downloader_threads": cores * 4,
            "read_threads": cores * 4,
            "block_file_cache_write_threads": cores * 2,
            "cache_dir": default_cache_dir(environ),
        }
        names = cls.env_names()
        for name, env_name in names.items():
            value = environ.get(env_name, "")
            if value.strip():
                data.pop(name, None)
                data[env_name] = value
        for name, value in overrides.items():
            if value is not None:
                data.pop(names[name], None)
                data[name] = value
        try:
            memory = machine_memory() if memory_bytes is None else memory_bytes
            return cls.model_validate(data, context={"memory_bytes": memory})
        except ValidationError as exc:
            raise SettingsError(_problems(exc, data, names)) from None

    @classmethod
    def env_names(cls) -> dict[str, str]:
        """Field name -> environment variable name."""
        return {name: f.alias or name.upper() for name, f in cls.model_fields.items()}

    def cache_limit(self, free_bytes: int, used_bytes: int) -> int:
        """Bytes the disk cache may hold in total, now that it holds `used_bytes`
        and its filesystem has `free_bytes` free.

        The cache never eats into reserved_free_disk_space; a positive cache_size
        caps it; a negative cache_size keeps that many bytes of the disk free
        (whichever of the two reserves is larger wins).
        """
        reserve = self.reserved_free_disk_space
        if self.cache_size is not None and self.cache_size < 0:
            reserve = max(reserve, -self.cache_size)
        limit = used_bytes + max(0, free_bytes - reserve)
        if self.cache_size is not None and self.cache_size >= 0:
            limit = min(limit, self.cache_size)
        return limit

    def describe(self) -> list[str]:
        """The effective settings as 'ENV_NAME=value' lines for the runtime log."""
        lines = []
        for name, env_name in self.env_names().items():
            value = getattr(self, name)
            if any(word in f"{name} {env_name}".lower() for word in _SECRET_WORDS):
                shown = MASK
            elif value is None:
                shown = _UNSET.get(name, "unset")
            elif isinstance(value, float) and value.is_integer():
                shown = str(int(value))
            elif isinstance(value, bool):
                shown = str(value).lower()
            elif isinstance(value, tuple):
                shown = ",".join(map(str, value)) or "none"
            elif name in _MODE_FIELDS:
                shown = _octal(value)
            elif name in _SIZE_FIELDS:
                shown = format_size(value)
            else:
                shown = str(value)
            lines.append(f"{env_name}={shown}")
        return lines


_SIZE_FIELDS = frozenset(
    name for name, field in Settings.model_fields.items() if _TO_SIZE in field.metadata
)
_MODE_FIELDS = frozenset(
    name for name, field in Settings.model_fields.items() if _TO_MODE in field.metadata
)
_UNSET = {
    "cache_size": "unlimited",
    "attribute_cache_ttl_ms": "never",
    "mount_uid": "the mounting user",
    "mount_gid": "the mounting user's group",
    "mount_file_mode": "0444 (rw_mount 0755)",
    "mount_dir_mode": "0555 (rw_mount 0755)",
}


def _problems(
    exc: ValidationError, data: Mapping[str, Any], aliases: Mapping[str, str]
) -> list[str]:
    """One line per bad variable: NAME='value': what is wrong."""
    problems: list[str] = []
    seen: set[str] = set()
    for error in exc.errors():
        loc = error["loc"]
        if not loc:
            problems.append(error["msg"])
            continue
        key = str(loc[0])
        if key in seen:
            continue  # one line per variable: the first problem is enough to fix it
        seen.add(key)
        label = f"{aliases[key]} (override {key})" if key in aliases else key
        value = data.get(key, error.get("input"))
        problems.append(f"{label}={value!r}: {error['msg']}")
    return problems
