"""Composition root: builds the per-run objects (settings, workspace, stores)
from what the CLI parsed, and holds the operations the commands run.

The only module that wires layers together; nothing imports it but `cli`.
No threads of its own yet.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from datamount.errors import InvalidInput, SpecError, UriError
from datamount.location import StorageLocation
from datamount.log import activity
from datamount.settings import Settings
from datamount.spec import DataInput, JobSpec, load_spec
from datamount.uris import LocationKind, parse
from datamount.workspace import Workspace, find_workspace

log = logging.getLogger("datamount.app")


@dataclass(frozen=True)
class Context:
    """What every command gets: settings read once, and where to find the workspace."""

    settings: Settings
    environ: Mapping[str, str]
    cwd: Path
    workspace_flag: str | None = None

    def workspace_path(self) -> Path:
        flag = self.workspace_flag or (
            str(self.settings.workspace) if self.settings.workspace else None
        )
        return find_workspace(flag, self.environ, self.cwd)

    def workspace_is_explicit(self) -> bool:
        return bool(self.workspace_flag or self.settings.workspace)

    def load_workspace(self, *, required: bool = True) -> Workspace | None:
        """The workspace; with required=False a missing default file yields None."""
        path = self.workspace_path()
        if not required and not self.workspace_is_explicit() and not path.exists():
            return None
        workspace = Workspace.load(path, self.environ)
        log.info(
            "workspace %s: %d datastores, %d data assets",
            path,
            len(workspace.config.datastores),
            len(workspace.config.data_assets),
        )
        return workspace


def resolve_entry(spec: JobSpec, entry: DataInput, workspace: Workspace) -> StorageLocation:
    """Where `entry`'s bytes live, with the credential to reach them."""
    identity = entry.identity or spec.identity
    base_dir = spec.source.parent if spec.source else None
    return workspace.resolve(
        entry.location,
        where=f"{entry.direction}s.{entry.name}.path",
        identity=identity.type.value if identity else None,
        client_id=identity.client_id if identity else None,
        base_dir=base_dir,
        expected_type=entry.type.value,
    )


def all_entries(spec: JobSpec) -> list[DataInput]:
    return [*spec.data_inputs.values(), *spec.outputs.values()]


@dataclass(frozen=True)
class Validation:
    spec: JobSpec
    workspace_checked: Path | None


def validate(ctx: Context, spec_path: Path) -> Validation:
    """Check the spec, and its datastores/assets when a workspace is at hand.

    Pure: no network. Every problem of every entry is reported at once.
    """
    with activity("validate"):
        spec = load_spec(spec_path)
        workspace = ctx.load_workspace(required=False)
        if workspace is None:
            return Validation(spec, None)
        problems: list[str] = []
        for entry in all_entries(spec):
            try:
                resolve_entry(spec, entry, workspace)
            except InvalidInput as exc:
                problems += exc.problems
        if problems:
            raise SpecError(problems)
        return Validation(spec, workspace.source)


def resolve(ctx: Context, target: str, input_name: str | None) -> list[tuple[str, str]]:
    """`direct` mode: the resolved URI of one spec entry, or of a bare URI.

    Returns (name, uri) pairs; one pair unless the spec has several entries
    and `input_name` is None and the caller asked for all.
    """
    with activity("resolve"):
        path = Path(target)
        if not path.is_file() and _looks_like_uri(target):
            if input_name:
                raise UriError(f"--input {input_name}: only applies to a spec file, not a URI")
            workspace = ctx.load_workspace()
            assert workspace is not None
            location = workspace.resolve(parse(target, "URI"), where="URI", base_dir=ctx.cwd)
            _log_resolved("URI", target, location)
            return [("uri", location.uri())]
        spec = load_spec(path)
        workspace = ctx.load_workspace()
        assert workspace is not None
        entry = spec.entry(input_name)
        location = resolve_entry(spec, entry, workspace)
        _log_resolved(f"{entry.direction}s.{entry.name}", entry.path, location)
        return [(entry.name, location.uri())]


def _log_resolved(what: str, raw: str, location: StorageLocation) -> None:
    log.info(
        "resolved %s (%s) -> %s (%s, credential %s)",
        what,
        raw,
        location.uri(),
        location.kind.value,
        location.credential.describe(),
    )


def _looks_like_uri(text: str) -> bool:
    if "://" in text or text.startswith("azureml:"):
        return True
    try:
        return parse(text).kind is not LocationKind.LOCAL
    except InvalidInput:
        return False
