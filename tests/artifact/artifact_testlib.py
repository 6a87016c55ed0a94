"""Shared builders for the artifact tests: a small valid directory and raw-file writers that
let a test put arbitrary (malformed) JSON or framing bytes on disk."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from ninfer_compile.artifact.codecs import QuantizedTensor
from ninfer_compile.artifact.formats import MAGIC, PAYLOAD_ALIGN, align_up
from ninfer_compile.artifact.quantize import quantize_maxabs

# Object i of VALID_ROOT; offsets follow the writer's rules (tensors 256-aligned, resources 1).
VALID_ROOT = {
    "model_id": "tiny-test",
    "objects": [
        {"name": "w/q5", "kind": "tensor", "shape": [2, 130], "format": "Q5G64_F16S",
         "layout": "row-split-k128-v1", "offset": 0, "bytes": 528},
        {"name": "w/bf16", "kind": "tensor", "shape": [3, 4], "format": "BF16",
         "layout": "contiguous-le-v1", "offset": 768, "bytes": 24},
        {"name": "tok", "kind": "resource", "encoding": "raw-bytes-v1", "offset": 792, "bytes": 10},
        {"name": "w/i32", "kind": "tensor", "shape": [], "format": "I32",
         "layout": "contiguous-le-v1", "offset": 1024, "bytes": 4},
    ],
}
VALID_PAYLOAD_BYTES = 1028


def valid_root() -> dict:
    return copy.deepcopy(VALID_ROOT)


def raw_artifact(path: Path, root: object = None, *, json_text: bytes | None = None,
                 payload_bytes: int | None = None, payload: bytes | None = None,
                 json_bytes_field: int | None = None, magic: bytes = MAGIC) -> Path:
    """Write prefix + JSON + zero padding + payload exactly as given (no validation).

    `root` is serialised compactly unless `json_text` is given; the payload is `payload` or
    `payload_bytes` zero bytes (default: enough for VALID_ROOT)."""
    if json_text is None:
        json_text = json.dumps(root, separators=(",", ":")).encode()
    length = len(json_text) if json_bytes_field is None else json_bytes_field
    head = magic + length.to_bytes(8, "little") + json_text
    head += bytes(align_up(len(head), PAYLOAD_ALIGN) - len(head))
    if payload is None:
        payload = bytes(VALID_PAYLOAD_BYTES if payload_bytes is None else payload_bytes)
    path.write_bytes(head + payload)
    return path


def sample_items(seed: int = 0) -> list[tuple[str, object]]:
    """One object of every format plus a resource, with awkward shapes (partial groups)."""
    g = torch.Generator().manual_seed(seed)
    items: list[tuple[str, object]] = [
        ("direct/bf16", torch.randn(3, 5, generator=g).to(torch.bfloat16)),
        ("direct/fp32", torch.randn(7, generator=g)),
        ("direct/i32", torch.randint(-2**31, 2**31 - 1, (2, 3, 4), generator=g, dtype=torch.int32)),
        ("frontend/tokenizer.json", b'{"tokens": ["a", "b"]}'),
    ]
    for fmt, shape in [("Q4G64_F16S", (3, 130)), ("Q5G64_F16S", (2, 200)),
                       ("Q6G64_F16S", (1, 64)), ("W8G32_F16S", (3, 33))]:
        codes, scales = quantize_maxabs(fmt, torch.randn(*shape, generator=g))
        items.append((f"quant/{fmt}", QuantizedTensor(fmt, codes, scales)))
    items.append(("direct/scalar", torch.tensor(1.5, dtype=torch.float32)))
    return items
