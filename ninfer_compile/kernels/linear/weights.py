"""Linear-family weight operands: `QuantWeight` over the stored `row-split-k128-v1` planes.

No repack: a `QuantWeight` holds the three planes exactly as the artifact stores them
(storage-layouts §3), as uint8 tensors on any device. A row view of a fused parent
(e.g. `query = query_key[0:6144]`) is three plane *slices* (zero-copy), so the kernels read
the parent's bytes in place.

Plane addressing the kernels rely on (per row, `g = groups_per_row`):
- base:  `g * 32` bytes; Q4/Q5/Q6 lane `2j` in the low nibble of byte `j`, lane `2j+1` in the
  high nibble (so one little-endian 32-bit word holds lanes `8w .. 8w+7`, lane `8w+i` in bits
  `4i..4i+3`); W8 one byte per lane (a word holds lanes `4w .. 4w+3`).
- high:  Q5 `g * 8` bytes (a word holds the 5th bit of lanes `32w .. 32w+31`, lane-major);
  Q6 `g * 16` bytes (a word holds bits 4,5 of lanes `16w .. 16w+15`, 2 bits per lane).
- scale: `g` little-endian binary16 multipliers.
Every plane span starts on a 256-byte boundary and every row span is a multiple of 16 bytes, so
int32 / float16 views of the slices are always legal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ...artifact.formats import row_split_geometry
from ...errors import ArtifactError, RouteError

__all__ = ["QuantWeight", "from_payload", "QUANT_FORMATS", "FORMAT_BITS", "as_linear_weight"]

# format -> (code bits, group, lanes per 32-bit base word)
FORMAT_BITS = {"Q4G64_F16S": 4, "Q5G64_F16S": 5, "Q6G64_F16S": 6, "W8G32_F16S": 8}
QUANT_FORMATS = tuple(FORMAT_BITS)


@dataclass(eq=False)
class QuantWeight:
    """The device planes of one row-split object or a row view of one.

    `base`, `high` (None for Q4/W8) and `scale` are 1-D uint8 tensors holding exactly this
    weight's row spans (slices of the parent's planes for a view: no copy). `row_begin` /
    `parent_n` record where a view sits in its parent (0 / n for a whole object).
    """

    format: str
    n: int
    k: int
    k_pad: int
    groups_per_row: int
    base: torch.Tensor
    high: torch.Tensor | None
    scale: torch.Tensor
    row_begin: int = 0
    parent_n: int | None = None
    _views: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.format not in FORMAT_BITS:
            raise RouteError(f"QuantWeight: format {self.format!r} is not a row-split format")
        if self.parent_n is None:
            self.parent_n = self.n
        for name in ("base", "scale") + (("high",) if self.high is not None else ()):
            t = getattr(self, name)
            if t.dtype != torch.uint8 or t.dim() != 1:
                raise RouteError(f"QuantWeight: {name} plane must be a 1-D uint8 tensor")
        if self.base.numel() != self.n * self.base_row_bytes:
            raise RouteError(f"QuantWeight {self.format} [{self.n},{self.k}]: base plane has "
                             f"{self.base.numel()} bytes, expected {self.n * self.base_row_bytes}")
        if self.scale.numel() != self.n * self.scale_row_bytes:
            raise RouteError(f"QuantWeight {self.format} [{self.n},{self.k}]: scale plane has "
                             f"{self.scale.numel()} bytes, expected {self.n * self.scale_row_bytes}")
        hb = self.high_row_bytes
        if hb and (self.high is None or self.high.numel() != self.n * hb):
            raise RouteError(f"QuantWeight {self.format} [{self.n},{self.k}]: high plane missing or "
                             f"wrong size (expected {self.n * hb} bytes)")

    # -- geometry -----------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return FORMAT_BITS[self.format]

    @property
    def group(self) -> int:
        return 32 if self.bits == 8 else 64

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    @property
    def device(self) -> torch.device:
        return self.base.device

    @property
    def base_row_bytes(self) -> int:
        return self.groups_per_row * 32

    @property
    def high_row_bytes(self) -> int:
        return self.groups_per_row * {4: 0, 5: 8, 6: 16, 8: 0}[self.bits]

    @property
    def scale_row_bytes(self) -> int:
        return self.groups_per_row * 2

    @property
    def nbytes(self) -> int:
        """Bytes a full pass over this weight reads (all three planes)."""
        return self.n * (self.base_row_bytes + self.high_row_bytes + self.scale_row_bytes)

    # -- typed views used by the launchers (cached; metadata only, no device allocation) --
    def words(self) -> torch.Tensor:
        v = self._views.get("base")
        if v is None:
            v = self._views["base"] = self.base.view(torch.int32)
        return v

    def high_words(self) -> torch.Tensor:
        if self.high is None:
            return self.words()  # dummy pointer, never read
        v = self._views.get("high")
        if v is None:
            v = self._views["high"] = self.high.view(torch.int32)
        return v

    def scales(self) -> torch.Tensor:
        v = self._views.get("scale")
        if v is None:
            v = self._views["scale"] = self.scale.view(torch.float16)
        return v

    # -- views / movement -----------------------------------------------------------------
    def rows(self, begin: int, count: int) -> "QuantWeight":
        """A zero-copy view of rows `[begin, begin + count)` (storage-layouts §3.7)."""
        if begin < 0 or count <= 0 or begin + count > self.n:
            raise RouteError(f"QuantWeight {self.format} [{self.n},{self.k}]: row view "
                             f"[{begin}, {begin + count}) is outside the {self.n} rows")
        b, h, s = self.base_row_bytes, self.high_row_bytes, self.scale_row_bytes
        return QuantWeight(
            format=self.format, n=count, k=self.k, k_pad=self.k_pad,
            groups_per_row=self.groups_per_row,
            base=self.base[begin * b:(begin + count) * b],
            high=None if self.high is None else self.high[begin * h:(begin + count) * h],
            scale=self.scale[begin * s:(begin + count) * s],
            row_begin=self.row_begin + begin, parent_n=self.parent_n,
        )

    def to(self, device) -> "QuantWeight":
        """Copy the planes to `device` (load time only). A view's planes are copied as spans."""
        return QuantWeight(
            format=self.format, n=self.n, k=self.k, k_pad=self.k_pad,
            groups_per_row=self.groups_per_row,
            base=self.base.to(device), high=None if self.high is None else self.high.to(device),
            scale=self.scale.to(device), row_begin=self.row_begin, parent_n=self.parent_n,
        )


def _as_uint8(payload) -> torch.Tensor:
    if isinstance(payload, torch.Tensor):
        if payload.dtype != torch.uint8 or payload.dim() != 1:
            raise ArtifactError("payload tensor must be 1-D uint8")
        return payload
    mv = memoryview(payload).cast("B")
    return torch.frombuffer(bytearray(mv), dtype=torch.uint8)


def from_payload(format: str, shape: Sequence[int], payload, rows: tuple[int, int] | None = None,
                 device=None):
    """Bind one artifact object's payload as a linear weight.

    `payload`: bytes / memoryview / 1-D uint8 tensor (a tensor is used in place: zero-copy).
    `rows=(begin, count)`: a row view of the object. Grouped formats return a `QuantWeight`
    whose planes are slices of `payload`; `BF16` returns the bf16 `[N, K]` tensor itself
    (pass-through; a row view is a row slice). `device`: copy there first (load time).
    """
    buf = _as_uint8(payload)
    if device is not None:
        buf = buf.to(device)
    if len(shape) != 2:
        raise ArtifactError(f"linear weight {format}: shape must be [N, K], got {list(shape)}")
    n, k = int(shape[0]), int(shape[1])
    if format == "BF16":
        if buf.numel() != n * k * 2:
            raise ArtifactError(f"BF16 [{n},{k}]: payload has {buf.numel()} bytes, expected {n * k * 2}")
        w = buf.view(torch.bfloat16).view(n, k)
        if rows is not None:
            begin, count = rows
            if begin < 0 or count <= 0 or begin + count > n:
                raise ArtifactError(f"BF16 [{n},{k}]: row view [{begin}, {begin + count}) out of range")
            w = w[begin:begin + count]
        return w
    if format not in FORMAT_BITS:
        raise ArtifactError(f"format {format!r} is not a linear weight format")
    geom = row_split_geometry(format, n, k)
    if buf.numel() != geom.total:
        raise ArtifactError(f"{format} [{n},{k}]: payload has {buf.numel()} bytes, expected {geom.total}")
    qw = QuantWeight(
        format=format, n=n, k=k, k_pad=geom.k_pad, groups_per_row=geom.groups_per_row,
        base=buf[geom.base_offset:geom.base_offset + geom.base_bytes],
        high=(buf[geom.high_offset:geom.high_offset + geom.high_bytes] if geom.high_bytes else None),
        scale=buf[geom.scale_offset:geom.scale_offset + geom.scale_bytes],
    )
    if rows is not None:
        qw = qw.rows(*rows)
    return qw


def as_linear_weight(w):
    """Validate a linear weight operand: a `QuantWeight` or a bf16 `[N, K]` tensor (unit stride
    along K). Returns (format, n, k)."""
    if isinstance(w, QuantWeight):
        return w.format, w.n, w.k
    if isinstance(w, torch.Tensor):
        if w.dtype != torch.bfloat16 or w.dim() != 2 or w.stride(1) != 1:
            raise RouteError(f"bf16 linear weight must be a bf16 [N, K] tensor with unit K stride, got "
                             f"{w.dtype} {list(w.shape)} strides {list(w.stride())}")
        return "BF16", w.shape[0], w.shape[1]
    raise RouteError(f"linear weight must be a QuantWeight or a bf16 tensor, got {type(w).__name__}")
