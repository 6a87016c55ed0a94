"""Helpers for contract tests: lightweight fake artifacts and YAML snippets."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import pytest

from ninfer_compile.contracts import ModelSpec


@dataclass(frozen=True)
class FakeTensor:
    name: str
    shape: tuple
    format: str
    layout: str
    offset: int = 0
    bytes: int = 0
    kind: str = "tensor"


@dataclass(frozen=True)
class FakeResource:
    name: str
    encoding: str = "raw-bytes-v1"
    offset: int = 0
    bytes: int = 1
    kind: str = "resource"


@dataclass
class FakeArtifact:
    """Duck-typed stand-in for artifact.reader.Artifact: path, model_id, objects."""

    path: str
    model_id: str
    objects: list


def fake_artifact(spec: ModelSpec, path: str = "fake.ninfer", model_id: Optional[str] = None) -> FakeArtifact:
    """An artifact whose directory matches `spec` exactly, in writer order."""
    objects = []
    for o in spec.objects.values():
        if o.kind == "resource":
            objects.append(FakeResource(o.name))
        else:
            objects.append(FakeTensor(o.name, o.shape, o.format, o.layout))
    return FakeArtifact(path, model_id or spec.model_id, objects)


@pytest.fixture
def make_fake():
    return fake_artifact


__all__ = ["FakeArtifact", "FakeResource", "FakeTensor", "fake_artifact", "replace"]
