"""`ninfer-compile inspect ARTIFACT [--dump NAME --out FILE]`.

Without `--dump`: prints the model id, framing (JSON length, payload offset, file size), one line
per object (index, payload offset, bytes, kind, format or encoding, shape, name), totals per
format/encoding (count, bytes) and the grand total. Only the prefix and JSON are read, and torch
is never imported, so a 1124-object directory prints in well under a second.

With `--dump NAME --out FILE`: a tensor is written with numpy.save in its logical shape as
float32 (BF16 widened exactly, grouped formats dequantized) or int32 (I32); a resource's raw
bytes are written to FILE as-is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import ArtifactError
from .formats import display, shape_text
from .reader import Artifact, TensorObject


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", metavar="ARTIFACT", help="path of a .ninfer file")
    parser.add_argument("--dump", metavar="NAME", help="object to decode and write to --out")
    parser.add_argument("--out", metavar="FILE", help="output file for --dump (.npy for tensors)")


def run(args: argparse.Namespace) -> int:
    if (args.dump is None) != (args.out is None):
        raise ArtifactError("inspect: --dump NAME and --out FILE must be given together")
    with Artifact.open(args.artifact) as artifact:
        if args.dump is not None:
            dump_object(artifact, args.dump, Path(args.out))
            return 0
        sys.stdout.write(render(artifact))
    return 0


def render(artifact: Artifact) -> str:
    """The directory listing printed by `inspect` (one string, written at once)."""
    lines = [
        f"artifact:       {artifact.path}",
        f"model_id:       {artifact.model_id}",
        f"json bytes:     {artifact.json_bytes}",
        f"payload offset: {artifact.payload_offset}",
        f"file size:      {artifact.file_size}",
        f"objects:        {len(artifact.objects)}",
        "",
        f"{'#':>5} {'offset':>14} {'bytes':>14}  {'kind':<8} {'format':<18} {'shape':<18} name",
    ]
    totals: dict[str, list[int]] = {}
    for index, obj in enumerate(artifact.objects):
        if isinstance(obj, TensorObject):
            kind, fmt, shape = "tensor", obj.format, shape_text(obj.shape)
        else:
            kind, fmt, shape = "resource", obj.encoding, "-"
        name = obj.name if obj.name.isprintable() else display(obj.name)
        lines.append(f"{index:>5} {obj.offset:>14} {obj.bytes:>14}  {kind:<8} {fmt:<18} {shape:<18} {name}")
        entry = totals.setdefault(fmt, [0, 0])
        entry[0] += 1
        entry[1] += obj.bytes
    lines += ["", "totals by format:"]
    for fmt in sorted(totals):
        count, nbytes = totals[fmt]
        lines.append(f"  {fmt:<18} {count:>6} objects {nbytes:>16} bytes  ({nbytes / 2**20:,.1f} MiB)")
    all_bytes = sum(t[1] for t in totals.values())
    lines.append(f"  {'total':<18} {len(artifact.objects):>6} objects {all_bytes:>16} bytes  "
                 f"({all_bytes / 2**20:,.1f} MiB)")
    return "\n".join(lines) + "\n"


def dump_object(artifact: Artifact, name: str, out: Path) -> None:
    """Write object `name` to `out` (tensor → .npy, resource → raw bytes)."""
    obj = artifact.object(name)
    if isinstance(obj, TensorObject):
        import numpy as np
        import torch

        value = artifact.load(name)  # grouped: dequantized f32; direct: bf16/f32/i32
        if value.dtype != torch.int32:
            value = value.to(torch.float32)  # exact widening for BF16
        try:
            np.save(out, value.numpy(), allow_pickle=False)
        except OSError as exc:
            raise ArtifactError(f"{out}: cannot write dump of {display(name)}: {exc.strerror or exc}") from None
        return
    data = artifact.resource_bytes(name)
    try:
        out.write_bytes(data)
    except OSError as exc:
        raise ArtifactError(f"{out}: cannot write dump of {display(name)}: {exc.strerror or exc}") from None
