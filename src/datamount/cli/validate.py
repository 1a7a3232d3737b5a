"""`datamount validate` and `datamount resolve`: the commands that only
resolve. `validate` checks a spec (a command job) or another YAML kind
(cli/assets.py) and, when a workspace is at hand, every datastore and asset it
names; `resolve` prints the URI an entry or a bare URI resolves to (direct
mode). Pure: no network. No threads.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from datamount.cli.parser import PROG
from datamount.errors import InvalidInput, SpecError, UriError, only_unreadable
from datamount.jobspec.job import JobSpec
from datamount.jobspec.uris import LocationKind, parse
from datamount.log import activity
from datamount.modes.context import Context, all_entries, resolve_entry
from datamount.storage.location import StorageLocation

log = logging.getLogger("datamount.app")


def run(ctx: Context, args: argparse.Namespace) -> None:
    """`validate SPEC` or `resolve SPEC [--input NAME]`."""
    if args.command == "resolve":
        for _name, uri in resolve(ctx, args.spec, args.input):
            print(uri)
        return
    from datamount.cli import assets

    kind = assets.file_kind(Path(args.spec))
    if kind != "job":
        print(assets.validate_file(ctx, Path(args.spec), kind))
        return
    result = validate(ctx, Path(args.spec))
    spec = result.spec
    if spec is None:  # valid as the SDK reads it, but some path datamount can never read
        for line in result.unreadable:
            print(f"{PROG}: warning: {line}", file=sys.stderr)
        print(
            f"{args.spec}: valid for the Azure ML SDK, but {len(result.unreadable)} of its paths "
            "name nothing datamount can read (mount, download and run refuse them)"
        )
        return
    checked = (
        f"datastores and assets checked against {result.workspace_checked}"
        if result.workspace_checked
        else f"workspace not checked: {ctx.workspace_path()} not found"
    )
    print(
        f"{args.spec}: valid ({spec.shape} spec, {len(spec.data_inputs)} data inputs, "
        f"{len(spec.outputs)} outputs; {checked})"
    )


@dataclass(frozen=True)
class Validation:
    spec: JobSpec | None  # None: only `unreadable` paths stand in the way
    workspace_checked: Path | None
    unreadable: tuple[str, ...] = ()


def validate(ctx: Context, spec_path: Path) -> Validation:
    """Check the spec, and its datastores/assets when a workspace is at hand.

    Pure: no network. Every problem of every entry is reported at once.
    """
    with activity("validate"):
        try:
            spec = ctx.load_spec(spec_path)
        except SpecError as exc:
            if not only_unreadable(exc):
                raise
            return Validation(None, None, tuple(exc.problems))
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
        spec = ctx.load_spec(path)
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
