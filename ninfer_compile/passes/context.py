"""What every pass may read besides the graph (read-only; passes never mutate it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PassContext:
    spec: Any  # resolved ModelSpec
    objects: Mapping[str, Any] | None = None  # artifact directory: name -> TensorObject (None: contract only)
    table: Any = None  # RouteTable (select_routes)
    registry: Any = None  # kernels Registry (None: the default registry)
    fuse_rules: tuple[Mapping[str, Any], ...] | None = None  # None: passes/fuse_rules.yaml
    options: Mapping[str, Any] = field(default_factory=dict)
