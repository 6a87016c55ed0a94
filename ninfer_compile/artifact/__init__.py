"""NInfer v1 artifacts: registries, validating mmap reader, codecs, canonical quantizer, writer.

The directory-level modules (`formats`, `reader`, `writer`) import neither torch nor numpy, so
`ninfer-compile inspect` starts fast; codec and quantizer names are resolved lazily on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .formats import (
    FORMATS,
    MAGIC,
    PAYLOAD_ALIGN,
    RESOURCE_ENCODINGS,
    TENSOR_ALIGN,
    TENSOR_LAYOUTS,
    FormatSpec,
    RowSplitGeometry,
    encoded_size,
    row_split_geometry,
)
from .reader import Artifact, ResourceObject, TensorObject
from .writer import (
    ArtifactWriter,
    DirectoryPlan,
    ObjectSpec,
    PlannedObject,
    ResourceSpec,
    TensorSpec,
    plan_directory,
    write_artifact,
)

# Names whose modules import torch/numpy: loaded on first attribute access (PEP 562).
_LAZY = {
    "QuantizedTensor": "codecs",
    "decode_direct": "codecs",
    "encode_direct": "codecs",
    "decode_row_split": "codecs",
    "encode_row_split": "codecs",
    "row_view_spans": "codecs",
    "slice_row_split": "codecs",
    "quantize_maxabs": "quantize",
    "ENCODER_PROFILE": "quantize",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "FORMATS", "MAGIC", "PAYLOAD_ALIGN", "RESOURCE_ENCODINGS", "TENSOR_ALIGN", "TENSOR_LAYOUTS",
    "FormatSpec", "RowSplitGeometry", "encoded_size", "row_split_geometry",
    "Artifact", "ResourceObject", "TensorObject",
    "ArtifactWriter", "DirectoryPlan", "ObjectSpec", "PlannedObject", "ResourceSpec", "TensorSpec",
    "plan_directory", "write_artifact", *_LAZY,
]
