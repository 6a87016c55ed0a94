"""Closed NInfer v1 registries: numeric formats, tensor layouts, resource encodings, geometry.

Everything here is pure integer arithmetic on Python ints (no torch/numpy import), so the
`inspect` command and the reader can validate a directory without paying for heavy imports.

Contracts:
- `FORMATS` is the closed registry of the seven persistent numeric formats; names are identities,
  never parsed into components.
- `encoded_size(format, shape)` is the exact `bytes` a tensor object must declare; it raises
  `ArtifactError` for an unregistered format, an illegal rank, a non-positive dimension, or a
  size that cannot be represented as a signed 64-bit file offset.
- `row_split_geometry(format, n, k)` gives every plane offset/size of `row-split-k128-v1`.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Literal, Sequence

from ..errors import ArtifactError

MAGIC = b"NINFER\x00\x01"
PREFIX_BYTES = 16
PAYLOAD_ALIGN = 4096
TENSOR_ALIGN = 256
RESOURCE_ALIGN = 1
# Internal plane boundaries of row-split-k128-v1 (base / high / scale planes).
PLANE_ALIGN = 256
# Row-split pads K to this multiple.
ROW_SPLIT_K_ALIGN = 128

CONTIGUOUS = "contiguous-le-v1"
ROW_SPLIT = "row-split-k128-v1"
RAW_BYTES = "raw-bytes-v1"
TENSOR_LAYOUTS = frozenset({CONTIGUOUS, ROW_SPLIT})
RESOURCE_ENCODINGS = frozenset({RAW_BYTES})

# Rank limits per layout (inclusive).
LAYOUT_RANKS: dict[str, tuple[int, int]] = {CONTIGUOUS: (0, 16), ROW_SPLIT: (2, 2)}

# Largest offset / size accepted anywhere: a signed 64-bit file offset. Every derived quantity
# (products, aligned sums) is checked against it so absurd directories fail cleanly.
MAX_FILE_BYTES = (1 << 63) - 1


@dataclass(frozen=True)
class FormatSpec:
    """One registered numeric format.

    kind "direct": one little-endian word of `elem_bytes` per element (`contiguous-le-v1`).
    kind "grouped": signed `bits`-wide codes in groups of `group` along K, one binary16 scale per
    group, legal codes `[qmin, qmax]` (`qmax` is also the canonical encoder's denominator),
    stored in `row-split-k128-v1` with 32 base bytes and `high_bytes_per_group` high bytes per group.
    """

    name: str
    kind: Literal["direct", "grouped"]
    layout: str
    elem_bytes: int | None
    bits: int | None
    group: int | None
    qmin: int | None
    qmax: int | None
    high_bytes_per_group: int

    @property
    def base_bytes_per_group(self) -> int:
        """Base-plane bytes of one group (32 for every grouped format; 0 for direct)."""
        return 32 if self.kind == "grouped" else 0


FORMATS: dict[str, FormatSpec] = {
    "BF16": FormatSpec("BF16", "direct", CONTIGUOUS, 2, None, None, None, None, 0),
    "FP32": FormatSpec("FP32", "direct", CONTIGUOUS, 4, None, None, None, None, 0),
    "I32": FormatSpec("I32", "direct", CONTIGUOUS, 4, None, None, None, None, 0),
    "Q4G64_F16S": FormatSpec("Q4G64_F16S", "grouped", ROW_SPLIT, None, 4, 64, -8, 7, 0),
    "Q5G64_F16S": FormatSpec("Q5G64_F16S", "grouped", ROW_SPLIT, None, 5, 64, -16, 15, 8),
    "Q6G64_F16S": FormatSpec("Q6G64_F16S", "grouped", ROW_SPLIT, None, 6, 64, -32, 31, 16),
    # W8 deliberately excludes -128: the interval is symmetric [-127, 127].
    "W8G32_F16S": FormatSpec("W8G32_F16S", "grouped", ROW_SPLIT, None, 8, 32, -127, 127, 0),
}
GROUPED_FORMATS = frozenset(n for n, f in FORMATS.items() if f.kind == "grouped")


def align_up(x: int, a: int) -> int:
    """Smallest multiple of `a` that is >= `x` (x >= 0, a > 0)."""
    return -(-x // a) * a


def ceil_div(x: int, a: int) -> int:
    return -(-x // a)


def display(value: object, limit: int = 120) -> str:
    """Render a name or string for a one-line message: quoted, control characters escaped,
    long values shortened (names come from untrusted JSON)."""
    text = str(value)
    if text.isprintable() and "'" not in text:
        shown = f"'{text}'"
    else:
        shown = ascii(text)
    if len(shown) > limit:
        shown = shown[: limit - 4] + "...'"
    return shown


def shape_text(shape: Sequence[int]) -> str:
    """Compact `[2,130]` spelling used in messages and by `inspect`."""
    return "[" + ",".join(str(d) for d in shape) + "]"


def format_spec(name: str) -> FormatSpec:
    """The registered format `name`; ArtifactError if it is not in the closed registry."""
    spec = FORMATS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ArtifactError(
            f"format {display(name)} is not registered (registered: {', '.join(FORMATS)})"
        )
    return spec


def _checked(value: int, what: str) -> int:
    if value > MAX_FILE_BYTES:
        raise ArtifactError(f"{what} is {value}, above the 2^63-1 limit")
    return value


def _dims(shape: Sequence[int], fmt: FormatSpec) -> tuple[int, ...]:
    """Normalise `shape` to a tuple of positive ints and apply the layout's rank rule."""
    try:
        items = list(shape)
    except TypeError:
        raise ArtifactError(f"shape {shape!r} is not a sequence of integers") from None
    lo, hi = LAYOUT_RANKS[fmt.layout]
    if not lo <= len(items) <= hi:
        want = f"exactly {lo}" if lo == hi else f"{lo}..{hi}"
        raise ArtifactError(
            f"rank {len(items)} is illegal for {fmt.name} in {fmt.layout} (rank {want})"
        )
    dims = []
    for d in items:
        if isinstance(d, bool):
            raise ArtifactError(f"shape dimension {d!r} is a boolean, not an integer")
        try:
            d = operator.index(d)
        except TypeError:
            raise ArtifactError(f"shape dimension {d!r} is not an integer") from None
        if d <= 0:
            raise ArtifactError(f"shape dimension {d} is not positive")
        dims.append(_checked(d, "shape dimension"))
    return tuple(dims)


@dataclass(frozen=True)
class RowSplitGeometry:
    """Physical geometry of one `row-split-k128-v1` payload for a logical `[n, k]` matrix.

    Plane byte ranges are `[base_offset, +base_bytes)`, `[high_offset, +high_bytes)` (empty for
    Q4/W8) and `[scale_offset, +scale_bytes)`; `total` is the object's exact `bytes`.
    """

    n: int
    k: int
    k_pad: int
    group: int
    groups_per_row: int
    base_bytes: int
    high_bytes: int
    scale_bytes: int
    base_offset: int
    high_offset: int
    scale_offset: int
    total: int
    base_row_bytes: int
    high_row_bytes: int
    scale_row_bytes: int
    format: str = ""

    @property
    def logical_groups(self) -> int:
        """Groups per row holding at least one logical column: ceil(k / group)."""
        return ceil_div(self.k, self.group)


def row_split_geometry(format: str, n: int, k: int) -> RowSplitGeometry:
    """Plane geometry (storage-layouts §3.6) of a grouped `format` tensor of shape `[n, k]`."""
    fmt = format_spec(format)
    if fmt.kind != "grouped":
        raise ArtifactError(f"format {fmt.name} is direct; it cannot use {ROW_SPLIT}")
    n, k = _dims((n, k), fmt)
    k_pad = align_up(k, ROW_SPLIT_K_ALIGN)
    groups_per_row = k_pad // fmt.group
    base_row = groups_per_row * fmt.base_bytes_per_group
    high_row = groups_per_row * fmt.high_bytes_per_group
    scale_row = groups_per_row * 2
    base_bytes, high_bytes, scale_bytes = n * base_row, n * high_row, n * scale_row
    high_offset = align_up(base_bytes, PLANE_ALIGN)
    scale_offset = high_offset + align_up(high_bytes, PLANE_ALIGN)
    total = _checked(scale_offset + scale_bytes, f"encoded size of {fmt.name} [{n},{k}]")
    return RowSplitGeometry(
        format=fmt.name, n=n, k=k, k_pad=k_pad, group=fmt.group, groups_per_row=groups_per_row,
        base_bytes=base_bytes, high_bytes=high_bytes, scale_bytes=scale_bytes,
        base_offset=0, high_offset=high_offset, scale_offset=scale_offset, total=total,
        base_row_bytes=base_row, high_row_bytes=high_row, scale_row_bytes=scale_row,
    )


def normalize_shape(format: str, shape: Sequence[int]) -> tuple[int, ...]:
    """`shape` as a tuple of positive ints legal for `format`'s layout (ArtifactError otherwise)."""
    return _dims(shape, format_spec(format))


def encoded_size(format: str, shape: Sequence[int]) -> int:
    """Exact payload length of a `format` tensor of logical `shape` in its registered layout."""
    fmt = format_spec(format)
    dims = _dims(shape, fmt)
    if fmt.kind == "direct":
        elements = 1
        for d in dims:
            # Python ints do not overflow; check after every product so a 16-dim shape of huge
            # values stays a small number of big-int operations and fails with a clear message.
            elements = _checked(elements * d, f"element count of {shape_text(dims)}")
        return _checked(elements * fmt.elem_bytes, f"encoded size of {fmt.name} {shape_text(dims)}")
    return row_split_geometry(fmt.name, dims[0], dims[1]).total


def object_alignment(kind: str) -> int:
    """Payload-relative offset alignment of a tensor (256) or raw-bytes resource (1)."""
    return TENSOR_ALIGN if kind == "tensor" else RESOURCE_ALIGN


def payload_offset_for(json_bytes: int) -> int:
    """Start of the payload region for a directory of `json_bytes` bytes."""
    return align_up(PREFIX_BYTES + json_bytes, PAYLOAD_ALIGN)
