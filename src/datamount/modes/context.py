"""The run context: what every command gets (settings read once, the
environment, the working folder, where the workspace is), the workspace loaded
at most once per context, and the resolution of spec entries and bare paths or
URIs to storage locations with their credentials (the `validate` and
`resolve` commands, cli/validate.py, are nothing but this resolution).

No threads.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from datamount.errors import InvalidInput, SettingsError, SpecError, UriError
from datamount.jobspec.job import DataInput, DataType, JobSpec, load_spec
from datamount.jobspec.uris import LocationKind, parse
from datamount.settings import Settings
from datamount.storage import ObjectStore, latency, store_for
from datamount.storage.location import StorageKind, StorageLocation
from datamount.storage.retry import RetryPolicy
from datamount.workspace.datastores import Workspace, find_workspace

log = logging.getLogger("datamount.app")


@dataclass(frozen=True)
class Context:
    """What every command gets: settings read once, and where to find the workspace."""

    settings: Settings
    environ: Mapping[str, str]
    cwd: Path
    workspace_flag: str | None = None
    run_name: str | None = None  # `run`: this run's unique name (default output paths)
    # The loaded workspace, per `required` (a context made by dataclasses.replace starts
    # empty); `run` prepares entries on several threads.
    _loaded: dict[bool, Workspace | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    def load_spec(self, path: Path) -> JobSpec:
        return load_spec(path, run_name=self.run_name)

    def workspace_path(self) -> Path:
        flag = self.workspace_flag or (
            str(self.settings.workspace) if self.settings.workspace else None
        )
        return find_workspace(flag, self.environ, self.cwd)

    def workspace_is_explicit(self) -> bool:
        return bool(self.workspace_flag or self.settings.workspace)

    def load_workspace(self, *, required: bool = True) -> Workspace | None:
        """The workspace, read once per context; with required=False a missing
        default file yields None."""
        with self._lock:
            return self._load_workspace(required)

    def _load_workspace(self, required: bool) -> Workspace | None:
        if True in self._loaded:
            return self._loaded[True]
        if required in self._loaded:
            return self._loaded[required]
        path = self.workspace_path()
        if not required and not self.workspace_is_explicit() and not path.exists():
            self._loaded[False] = None
            return None
        workspace = Workspace.load(path, self.environ)
        log.info(
            "workspace %s: %d datastores, %d data assets",
            path,
            len(workspace.config.datastores),
            len(workspace.config.data_assets),
        )
        self._loaded[True] = workspace
        return workspace

    def workspace(self) -> Workspace:
        """The workspace when there is one, else an empty one (local and public paths)."""
        return self.load_workspace(required=False) or Workspace.empty()

    def resolve(self, spec: JobSpec, entry: DataInput) -> StorageLocation:
        """Where `entry`'s bytes live, with the credential to reach them; with
        `replicas:`, every copy, and the one to read first: RANK % copies."""
        location = resolve_entry(spec, entry, self.workspace(), rank=self.rank())
        if location.replicas:
            copies = location.replicas
            log.info(
                "%ss.%s: %d replicas; this node (RANK %d) reads %s first",
                entry.direction, entry.name, len(copies), self.rank(),
                copies[location.prefer].uri(),
            )  # fmt: skip
        return location

    def rank(self) -> int:
        """This node's RANK, as torchrun and Azure ML set it (0 when unset)."""
        raw = self.environ.get("RANK", "").strip()
        if not raw:
            return 0
        if not raw.isdigit():
            raise SettingsError(f"RANK: expected a non-negative integer, got {raw!r}")
        return int(raw)

    def retry(self) -> RetryPolicy:
        return RetryPolicy.from_settings(self.settings)

    def in_flight(
        self,
        store: ObjectStore,
        key: str,
        variable: str,
        base: int,
        cap: int = latency.MAX_IN_FLIGHT,
    ) -> int:
        """Requests to keep in flight to `store`: `base` (the setting of
        `variable`) when the user set it, else sized to the round trip
        (storage.latency), at most `cap`, with one log line."""
        if self.environ.get(variable, "").strip():
            return base
        rtt = latency.probe(store, key)
        count = latency.in_flight(base, rtt, cap)
        log.info("storage round trip %.1f ms: %d requests in flight (%s unset; its default %d)",
                 rtt * 1000, count, variable, base)  # fmt: skip
        return count

    def store(self, location: StorageLocation, retry: RetryPolicy) -> ObjectStore:
        return store_for(self.settings, location, retry)

    def secret_variables(self) -> frozenset[str]:
        """The environment variables the workspace file reads: a process that
        gets its locations resolved (a mount daemon) must not inherit them."""
        workspace = self._loaded.get(True)
        return workspace.variables if workspace is not None else frozenset()


def resolve_entry(
    spec: JobSpec, entry: DataInput, workspace: Workspace, *, rank: int = 0
) -> StorageLocation:
    """Where `entry`'s bytes live, with the credential to reach them; its
    `replicas:` resolved too (each a problem of its own), copy `rank % n` preferred."""
    identity = entry.identity or spec.identity
    base_dir = spec.source.parent if spec.source else None
    where = f"{entry.direction}s.{entry.name}"
    paths = [(entry.location, f"{where}.path")]
    paths += [(r, f"{where}.replicas[{i}]") for i, r in enumerate(entry.replica_locations)]
    problems: list[str] = []
    copies: list[StorageLocation] = []
    for location, here in paths:
        try:
            copies.append(
                workspace.resolve(
                    location,
                    where=here,
                    identity=identity.type.value if identity else None,
                    client_id=identity.client_id if identity else None,
                    base_dir=base_dir,
                    expected_type=entry.type.value,
                )
            )
        except InvalidInput as exc:
            if len(paths) == 1:
                raise
            problems += exc.problems
    if problems:
        raise SpecError(problems)
    if len(copies) == 1:
        return copies[0]
    return dataclasses.replace(copies[0], replicas=tuple(copies), prefer=rank % len(copies))


def all_entries(spec: JobSpec) -> list[DataInput]:
    return [*spec.data_inputs.values(), *spec.outputs.values()]


@dataclass(frozen=True)
class Target:
    """A resolved data location plus what the spec says about it."""

    location: StorageLocation
    is_file: bool | None  # None: decide from the store (bare URIs)
    label: str


def target(ctx: Context, source: str, name: str | None, direction: str) -> Target:
    """A spec file (+ --input/--output NAME) or a bare path/URI, resolved."""
    path = Path(source)
    if path.is_file() and path.suffix in (".yaml", ".yml"):
        spec = ctx.load_spec(path)
        entry = spec.entry(name)
        location = ctx.resolve(spec, entry)
        return Target(location, entry.type is DataType.URI_FILE, f"{entry.direction}s.{entry.name}")
    if name:
        raise UriError(f"--{direction} {name}: only applies to a spec file, not a path or URI")
    parsed = parse(source, direction)
    # A local path needs no datastore: a workspace file that cannot be read
    # (a variable it names is unset) does not stand in its way.
    workspace = Workspace.empty() if parsed.kind is LocationKind.LOCAL else ctx.workspace()
    location = workspace.resolve(parsed, where=direction, base_dir=ctx.cwd)
    is_file = True if location.kind is StorageKind.HTTP else None
    return Target(location, is_file, source)
