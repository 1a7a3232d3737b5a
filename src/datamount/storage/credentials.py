"""How a resolved location authenticates: a value type whose secrets never
appear in repr(), str(), logs or errors.

The storage layer turns a `Credential` into
an SDK credential; nothing else reveals the secret. Immutable; no threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from datamount.log import Secret

__all__ = ["Credential", "CredentialKind", "Secret"]


class CredentialKind(StrEnum):
    ANONYMOUS = "anonymous"
    ACCOUNT_KEY = "account_key"
    SAS = "sas"
    USER_IDENTITY = "user_identity"  # DefaultAzureCredential, Azure CLI first
    MANAGED_IDENTITY = "managed_identity"


@dataclass(frozen=True)
class Credential:
    kind: CredentialKind = CredentialKind.ANONYMOUS
    secret: Secret | None = None  # account key or SAS token
    client_id: str | None = None  # managed identity client id, if given

    @classmethod
    def anonymous(cls) -> Credential:
        return cls(CredentialKind.ANONYMOUS)

    @classmethod
    def account_key(cls, key: str) -> Credential:
        return cls(CredentialKind.ACCOUNT_KEY, Secret(key))

    @classmethod
    def sas(cls, token: str) -> Credential:
        return cls(CredentialKind.SAS, Secret(token.lstrip("?")))

    def describe(self) -> str:
        """A loggable description: the kind only, never the secret."""
        if self.kind is CredentialKind.MANAGED_IDENTITY and self.client_id:
            return f"managed_identity(client_id={self.client_id})"
        return self.kind.value
