"""Byte codecs for the two registered tensor layouts.

- `contiguous-le-v1` (BF16, FP32, I32): C-order little-endian words. Decoding reinterprets the
  bytes as integer words and views them as the target dtype, so every bit (NaN payloads,
  signalling bits, signed zeros, subnormals) survives; nothing ever goes through a float cast.
- `row-split-k128-v1` (Q4/Q5/Q6 G64, W8 G32): three planes (base nibbles/bytes, lane-major
  high-bit stream, fp16 LE scales), each starting on a 256-byte boundary, K padded to 128.

All packing is vectorised with numpy (a [34816, 5120] Q4 tensor decodes in one to two seconds).
Errors are `ArtifactError` with a message naming the format and shape; callers add file/object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..errors import ArtifactError
from .formats import (
    FORMATS,
    FormatSpec,
    RowSplitGeometry,
    format_spec,
    normalize_shape,
    row_split_geometry,
    shape_text,
)

# Integer word type that carries each direct format's bits, and the torch dtype it is viewed as.
_DIRECT_WORDS: dict[str, tuple[np.dtype, torch.dtype, torch.dtype]] = {
    # format: (little-endian numpy word, torch carrier int dtype, torch logical dtype)
    "BF16": (np.dtype("<i2"), torch.int16, torch.bfloat16),
    "FP32": (np.dtype("<i4"), torch.int32, torch.float32),
    "I32": (np.dtype("<i4"), torch.int32, torch.int32),
}
_NATIVE = {2: np.dtype(np.int16), 4: np.dtype(np.int32)}


def _buffer(buf: object, what: str) -> memoryview:
    try:
        view = memoryview(buf)
    except TypeError:
        raise ArtifactError(f"{what}: payload of type {type(buf).__name__} is not a bytes-like buffer") from None
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


# ----------------------------------------------------------------------------------------------
# Direct formats
# ----------------------------------------------------------------------------------------------

def decode_direct(format: str, shape: Sequence[int], buf: object) -> torch.Tensor:
    """Decode a `contiguous-le-v1` payload to a tensor of the format's dtype and logical `shape`.

    BF16 → torch.bfloat16, FP32 → torch.float32, I32 → torch.int32; exact word bits; the result
    owns its memory (it is not a view of `buf`, so the artifact may be closed afterwards).
    """
    fmt = format_spec(format)
    if fmt.kind != "direct":
        raise ArtifactError(f"format {fmt.name} is grouped; decode it with decode_row_split")
    dims = normalize_shape(fmt.name, shape)
    words, carrier, logical = _DIRECT_WORDS[fmt.name]
    view = _buffer(buf, fmt.name)
    count = 1
    for d in dims:
        count *= d
    if view.nbytes != count * fmt.elem_bytes:
        raise ArtifactError(f"{fmt.name} {shape_text(dims)} needs {count * fmt.elem_bytes} bytes, "
                            f"payload has {view.nbytes}")
    # astype(native int) copies (detaching from the mmap) and byte-swaps on big-endian hosts.
    host = np.frombuffer(view, dtype=words, count=count).astype(_NATIVE[fmt.elem_bytes], copy=True)
    out = torch.from_numpy(host).view(logical) if logical != carrier else torch.from_numpy(host)
    return out.reshape(dims)


def encode_direct(format: str, tensor: torch.Tensor) -> bytes:
    """Encode `tensor` as `contiguous-le-v1` words of `format`.

    The tensor dtype must be exactly the format's dtype (bf16 for BF16, float32 for FP32, int32
    for I32): conversions between types are a recipe decision and never happen implicitly.
    """
    fmt = format_spec(format)
    if fmt.kind != "direct":
        raise ArtifactError(f"format {fmt.name} is grouped; encode it with encode_row_split")
    if not isinstance(tensor, torch.Tensor):
        raise ArtifactError(f"{fmt.name}: expected a torch.Tensor, got {type(tensor).__name__}")
    words, carrier, logical = _DIRECT_WORDS[fmt.name]
    if tensor.dtype != logical:
        raise ArtifactError(f"{fmt.name} needs a {logical} tensor, got {tensor.dtype}; convert it "
                            f"explicitly before encoding")
    normalize_shape(fmt.name, tuple(tensor.shape))  # rank 0..16, positive dims
    ints = tensor.detach().to("cpu").contiguous().view(carrier).reshape(-1).numpy()
    return ints.astype(words, copy=False).tobytes()


# ----------------------------------------------------------------------------------------------
# Grouped formats: row-split-k128-v1
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class QuantizedTensor:
    """Logical content of a grouped tensor: signed codes and binary16 scales.

    codes:  [N, K] int8 (logical columns only; physical padding discarded)
    scales: [N, ceil(K / G)] float16 (the multiplier of each logical group)
    """

    format: str
    codes: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)  # type: ignore[return-value]

    def dequantize(self) -> torch.Tensor:
        """Exact oracle reconstruction: float32(scale) * float32(code), shape [N, K] float32."""
        group = FORMATS[self.format].group
        n, k = self.codes.shape
        groups = self.scales.shape[1]
        scale32 = self.scales.to(torch.float32)  # [N, groups], f16 -> f32 is exact
        code32 = self.codes.to(torch.float32)  # [N, K], every legal code is exact in f32
        if groups * group != k:  # partial last group: pad with code 0, dropped again below
            code32 = torch.nn.functional.pad(code32, (0, groups * group - k))
        out = code32.view(n, groups, group) * scale32.unsqueeze(2)  # [N, groups, G]
        out = out.view(n, groups * group)
        return out if groups * group == k else out[:, :k].contiguous()


def _grouped(format: str) -> FormatSpec:
    fmt = format_spec(format)
    if fmt.kind != "grouped":
        raise ArtifactError(f"format {fmt.name} is direct; it has no row-split planes")
    return fmt


def _row_range(geom: RowSplitGeometry, rows: tuple[int, int] | None) -> tuple[int, int]:
    if rows is None:
        return 0, geom.n
    try:
        begin, count = (int(v) for v in rows)
    except (TypeError, ValueError):
        raise ArtifactError(f"row range {rows!r} is not (begin, count)") from None
    if begin < 0 or count <= 0 or begin + count > geom.n:
        raise ArtifactError(f"row range begin={begin} count={count} is outside rows [0, {geom.n}) "
                            f"of {geom.format} [{geom.n},{geom.k}]")
    return begin, count


def row_view_spans(format: str, shape: Sequence[int], row_begin: int,
                   row_count: int) -> dict[str, tuple[int, int]]:
    """Payload-relative `(offset, nbytes)` of each plane's span for rows
    `[row_begin, row_begin + row_count)` of a `[N, K]` grouped tensor.

    Keys: "base", "high" (only for Q5/Q6, whose high plane is nonempty), "scale".
    """
    fmt = _grouped(format)
    n, k = normalize_shape(fmt.name, shape)
    geom = row_split_geometry(fmt.name, n, k)
    begin, count = _row_range(geom, (row_begin, row_count))
    spans = {"base": (geom.base_offset + begin * geom.base_row_bytes, count * geom.base_row_bytes)}
    if geom.high_row_bytes:
        spans["high"] = (geom.high_offset + begin * geom.high_row_bytes, count * geom.high_row_bytes)
    spans["scale"] = (geom.scale_offset + begin * geom.scale_row_bytes, count * geom.scale_row_bytes)
    return spans


def slice_row_split(format: str, shape: Sequence[int], buf: object, row_begin: int,
                    row_count: int) -> bytes:
    """Standalone payload of rows `[row_begin, +row_count)`: the three row spans re-laid out with
    planes recomputed for N=row_count (storage-layouts §3.7); no code is decoded or repacked."""
    fmt = _grouped(format)
    n, k = normalize_shape(fmt.name, shape)
    view = _checked_payload(fmt, row_split_geometry(fmt.name, n, k), buf)
    spans = row_view_spans(fmt.name, (n, k), row_begin, row_count)
    sub = row_split_geometry(fmt.name, row_count, k)
    out = bytearray(sub.total)
    for plane, start in (("base", sub.base_offset), ("high", sub.high_offset), ("scale", sub.scale_offset)):
        if plane in spans:
            off, nbytes = spans[plane]
            out[start:start + nbytes] = view[off:off + nbytes]
    return bytes(out)


def _checked_payload(fmt: FormatSpec, geom: RowSplitGeometry, buf: object) -> memoryview:
    view = _buffer(buf, fmt.name)
    if view.nbytes != geom.total:
        raise ArtifactError(f"{fmt.name} [{geom.n},{geom.k}] in row-split-k128-v1 needs {geom.total} "
                            f"bytes, payload has {view.nbytes}")
    return view


def _plane(view: memoryview, offset: int, nbytes: int, rows: int) -> np.ndarray:
    """A plane's row span as a read-only [rows, bytes_per_row] uint8 array (no copy)."""
    return np.frombuffer(view, dtype=np.uint8, count=nbytes, offset=offset).reshape(rows, -1)


def decode_row_split(format: str, shape: Sequence[int], buf: object,
                     rows: tuple[int, int] | None = None) -> QuantizedTensor:
    """Decode a complete `row-split-k128-v1` payload `buf` of logical shape `[N, K]`.

    `rows=(begin, count)` decodes only those rows, touching only their three plane row spans.
    Returns codes [count, K] int8 and scales [count, ceil(K/G)] float16; physical columns >= K
    and wholly physical groups are discarded. No value validation (the trusted converter owns
    code/scale invariants); the payload length is checked.
    """
    fmt = _grouped(format)
    n, k = normalize_shape(fmt.name, shape)
    geom = row_split_geometry(fmt.name, n, k)
    view = _checked_payload(fmt, geom, buf)
    begin, count = _row_range(geom, rows)
    spans = row_view_spans(fmt.name, (n, k), begin, count)

    base = _plane(view, *spans["base"], count)  # [R, groups_per_row * 32] uint8
    if fmt.bits == 8:
        codes = base.view(np.int8)  # [R, K_pad]: one two's-complement byte per lane
    else:
        # u: [R, K_pad] uint8 unsigned b-bit words; even lane = low nibble, odd lane = high nibble.
        u = np.empty((count, geom.k_pad), dtype=np.uint8)
        u[:, 0::2] = base & 0x0F
        u[:, 1::2] = base >> 4
        if fmt.bits > 4:
            high = _plane(view, *spans["high"], count)  # [R, groups_per_row * H] uint8
            # Lane-major bit stream, stream bit t in bit t%8 of byte t//8 == little bit order.
            bits = np.unpackbits(high, axis=1, bitorder="little")  # [R, K_pad * (b - 4)]
            bits = bits.reshape(count, geom.k_pad, fmt.bits - 4)
            for j in range(fmt.bits - 4):
                u |= bits[:, :, j] << np.uint8(4 + j)
        # Sign-extend the b-bit word: shift it to the top of an int8, arithmetic-shift back.
        shift = 8 - fmt.bits
        codes = (u << np.uint8(shift)).view(np.int8) >> np.int8(shift)
    scale_words = np.frombuffer(view, dtype="<u2", count=spans["scale"][1] // 2,
                                offset=spans["scale"][0]).reshape(count, geom.groups_per_row)
    logical_groups = geom.logical_groups
    scales16 = scale_words[:, :logical_groups].astype(np.int16)  # copy, native order
    # Always copy: W8 codes are otherwise a read-only view of the mapped file.
    codes_t = torch.from_numpy(np.array(codes[:, :k], dtype=np.int8, order="C", copy=True))
    return QuantizedTensor(fmt.name, codes_t, torch.from_numpy(scales16).view(torch.float16))


def _check_codes_scales(fmt: FormatSpec, codes: torch.Tensor, scales: torch.Tensor) -> tuple[int, int]:
    if not isinstance(codes, torch.Tensor) or not isinstance(scales, torch.Tensor):
        raise ArtifactError(f"{fmt.name}: codes and scales must be torch tensors")
    if codes.dtype != torch.int8:
        raise ArtifactError(f"{fmt.name}: codes must be int8, got {codes.dtype}")
    if scales.dtype != torch.float16:
        raise ArtifactError(f"{fmt.name}: scales must be float16, got {scales.dtype}")
    if codes.dim() != 2:
        raise ArtifactError(f"{fmt.name}: codes must be [N, K], got shape {shape_text(codes.shape)}")
    n, k = normalize_shape(fmt.name, tuple(codes.shape))
    groups = -(-k // fmt.group)
    if tuple(scales.shape) != (n, groups):
        raise ArtifactError(f"{fmt.name}: scales must be [{n},{groups}] for codes [{n},{k}], got "
                            f"{shape_text(scales.shape)}")
    return n, k


def encode_row_split(format: str, codes: torch.Tensor, scales: torch.Tensor) -> bytes:
    """Complete `row-split-k128-v1` payload for codes [N, K] int8 and scales [N, ceil(K/G)] f16.

    Validates the scheme invariants the layout must preserve: codes inside `[qmin, qmax]` (W8
    never -128), scales +0 or finite positive binary16, and a +0 scale only over all-zero codes.
    Padding lanes get code 0, wholly physical groups scale 0x0000, plane gaps zero bytes.
    """
    fmt = _grouped(format)
    n, k = _check_codes_scales(fmt, codes, scales)
    geom = row_split_geometry(fmt.name, n, k)
    c = codes.detach().to("cpu").contiguous().numpy()  # [N, K] int8
    s = scales.detach().to("cpu").contiguous().view(torch.int16).numpy().view(np.uint16)  # [N, G] bits
    lo, hi = int(c.min()), int(c.max())
    if lo < fmt.qmin or hi > fmt.qmax:
        bad = np.argwhere((c < fmt.qmin) | (c > fmt.qmax))[0]
        raise ArtifactError(f"{fmt.name}: code {int(c[bad[0], bad[1]])} at row {bad[0]} column {bad[1]} "
                            f"is outside [{fmt.qmin}, {fmt.qmax}]")
    # Valid scale words: +0 (0x0000) or finite positive (sign clear, exponent != 0x1F).
    invalid = (s & 0x8000).astype(bool) | ((s & 0x7C00) == 0x7C00)
    if invalid.any():
        r, g = np.argwhere(invalid)[0]
        raise ArtifactError(f"{fmt.name}: scale word 0x{int(s[r, g]):04x} at row {r} group {g} is not "
                            f"+0 or a finite positive binary16")
    zero_scale = s == 0
    if zero_scale.any():
        padded = np.zeros((n, geom.logical_groups * fmt.group), dtype=np.int8)
        padded[:, :k] = c
        nonzero_codes = padded.reshape(n, geom.logical_groups, fmt.group).any(axis=2)
        clash = zero_scale & nonzero_codes
        if clash.any():
            r, g = np.argwhere(clash)[0]
            raise ArtifactError(f"{fmt.name}: row {r} group {g} has scale +0 but nonzero codes")

    out = np.zeros(geom.total, dtype=np.uint8)
    # u: [N, K_pad] unsigned b-bit words; padding lanes are code 0.
    u = np.zeros((n, geom.k_pad), dtype=np.uint8)
    u[:, :k] = c.view(np.uint8)
    if fmt.bits == 8:
        base = u
    else:
        u &= np.uint8((1 << fmt.bits) - 1)
        base = (u[:, 0::2] & 0x0F) | ((u[:, 1::2] & 0x0F) << 4)  # [N, K_pad/2]
    out[geom.base_offset:geom.base_offset + geom.base_bytes] = base.reshape(-1)
    if fmt.high_bytes_per_group:
        width = fmt.bits - 4
        # Stream order per lane: bit 4 first, then bit 5 (Q6).
        bits = np.stack([(u >> np.uint8(4 + j)) & 1 for j in range(width)], axis=2)  # [N, K_pad, w]
        high = np.packbits(bits.reshape(n, geom.k_pad * width), axis=1, bitorder="little")
        out[geom.high_offset:geom.high_offset + geom.high_bytes] = high.reshape(-1)
    words = np.zeros((n, geom.groups_per_row), dtype="<u2")  # wholly physical groups: 0x0000
    words[:, :geom.logical_groups] = s
    out[geom.scale_offset:geom.scale_offset + geom.scale_bytes] = words.reshape(-1).view(np.uint8)
    return out.tobytes()
