"""Shared fixtures: a real Azurite blob service for the session, a fresh
container per test. Tests that use them are marked `azurite` automatically
(select or skip them with `-m azurite` / `-m "not azurite"`)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest
from azure.storage.blob import ContainerClient

from azurite import Azurite, AzuriteMissing


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    service = Azurite(tmp_path_factory.mktemp("azurite"))
    try:
        service.start()
    except AzuriteMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture
def container(azurite: Azurite) -> Iterator[ContainerClient]:
    client = azurite.create_container(f"t{uuid.uuid4().hex[:24]}")
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            client.delete_container()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "azurite" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.azurite)
