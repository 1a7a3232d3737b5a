"""What the parent resolved for one FUSE mount, handed to the process that
serves it: the entry, the storage location with its credential, the effective
settings and, for eval_mount, the evaluated MLTable's files. The daemon builds
its stack from the plan alone: it never reads the spec, the workspace or the
environment's secrets again.

The plan travels as one JSON line over the start-up channel (a socket pair
inherited by the daemon), never on a command line: it holds the credential's
secret in clear, so `to_json` is called only to send it there.

No threads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datamount.settings import Settings
from datamount.storage.credentials import Credential, CredentialKind, Secret
from datamount.storage.location import StorageKind, StorageLocation


@dataclass(frozen=True)
class EvalFile:
    """One file of an evaluated MLTable: where it shows, where it lives."""

    eval_path: str
    location: StorageLocation
    size: int
    etag: str


@dataclass(frozen=True)
class MountPlan:
    mode: str  # ro_mount, eval_mount or rw_mount
    name: str  # the spec entry
    direction: str  # input or output
    spec: str  # the spec file (recorded in the state file)
    mountpoint: Path
    location: StorageLocation
    is_file: bool
    settings: Settings  # effective: an rw_mount's attribute TTL already applied
    staging: Path | None = None  # rw_mount: where writes are staged before upload
    eval_files: list[EvalFile] = field(default_factory=list)  # eval_mount
    eval_text: str = ""  # eval_mount: the MLTable file at the layout's root

    @property
    def label(self) -> str:
        return f"{self.direction}s.{self.name}"

    @property
    def path(self) -> Path:
        """What the job uses: the mount point, or a uri_file's one name in it."""
        if not self.is_file:
            return self.mountpoint
        return self.mountpoint / self.location.key.rstrip("/").rpartition("/")[2]

    def secrets(self) -> list[str]:
        """The credentials' secrets, for the log's masking (no workspace registered them)."""
        locations = [self.location, *(f.location for f in self.eval_files)]
        locations += [r for loc in locations for r in loc.replicas]
        return sorted(
            {c.secret.reveal() for c in (loc.credential for loc in locations) if c.secret}
        )

    def to_json(self) -> str:
        """One line, secrets in clear: for the start-up channel only."""
        return json.dumps(
            {
                "mode": self.mode,
                "name": self.name,
                "direction": self.direction,
                "spec": self.spec,
                "mountpoint": str(self.mountpoint),
                "location": _location_out(self.location),
                "is_file": self.is_file,
                "settings": self.settings.model_dump(mode="json"),
                "staging": str(self.staging) if self.staging else None,
                "eval_files": [
                    [f.eval_path, _location_out(f.location), f.size, f.etag]
                    for f in self.eval_files
                ],
                "eval_text": self.eval_text,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> MountPlan:
        data = json.loads(text)
        return cls(
            mode=data["mode"],
            name=data["name"],
            direction=data["direction"],
            spec=data["spec"],
            mountpoint=Path(data["mountpoint"]),
            location=_location_in(data["location"]),
            is_file=data["is_file"],
            settings=Settings.model_validate(data["settings"]),
            staging=Path(data["staging"]) if data["staging"] else None,
            eval_files=[
                EvalFile(path, _location_in(loc), size, etag)
                for path, loc, size, etag in data["eval_files"]
            ],
            eval_text=data["eval_text"],
        )


def _location_out(location: StorageLocation) -> dict[str, Any]:
    credential = location.credential
    return {
        "kind": location.kind.value,
        "path": location.path,
        "account": location.account,
        "container": location.container,
        "endpoint": location.endpoint,
        "endpoint_suffix": location.endpoint_suffix,
        "credential": credential.kind.value,
        "secret": credential.secret.reveal() if credential.secret else None,
        "client_id": credential.client_id,
        "replicas": [_location_out(r) for r in location.replicas],
        "prefer": location.prefer,
    }


def _location_in(data: dict[str, Any]) -> StorageLocation:
    secret = data["secret"]
    credential = Credential(
        CredentialKind(data["credential"]),
        Secret(secret) if secret is not None else None,
        data["client_id"],
    )
    return StorageLocation(
        StorageKind(data["kind"]),
        data["path"],
        data["account"],
        data["container"],
        data["endpoint"],
        data["endpoint_suffix"],
        credential,
        tuple(_location_in(r) for r in data.get("replicas", ())),
        data.get("prefer", 0),
    )
