"""CPU path of the linear family for few columns: a row-split weight repacked once into one of
torch's quantized CPU matmul operands, so a decode step reads about the stored bytes (not an fp32
matrix). Both keep the stored codes exactly; the roundings are the fp16 scales to bf16 (relative
2^-9 at most, once per group), x to bf16 when it is not bf16, and the ops' bf16 outputs.

`int4`: `_weight_int4pack_mm_for_cpu(x, packed, group, scale_zeros)` computes, for bf16 x [T, K],
x @ W^T with W[n, k] = (u[n, k] - 8) * scale[k // group, n] + zero[k // group, n], u a 4-bit code,
`scale_zeros` bf16 [K / group, N, 2], fp32 accumulation, one bf16 rounding of the result. A stored
code q is a sum of such terms (`_split_codes`), laid side by side along K so one call sums them
(x repeated once per part):
- Q4G64: u = q + 8, scale s, zero 0 (one part);
- Q5G64 / Q6G64: q = a + 16 b with a = ((q + 8) & 15) - 8 in [-8, 7], b = (q - a) / 16 (in [-1, 1]
  / [-2, 2]): u = a + 8 with scale s and u = b + 8 with scale 16 s, zeros 0 (two parts);
- W8G32: u = q + 128 = lo + 16 hi: u = lo with scale s and zero 8 s, u = hi with scale 16 s and
  zero 0 (two parts, group 32).
`int8` (Q5 / Q6 / W8 weights of at least `INT8_MIN_ROWS` rows, e.g. the vocabulary head: one int8
byte per weight is half the int4 parts' work): `_weight_int8pack_mm(x, codes int8 [N, g], scale
bf16 [N])` once per group of K (the op scales whole rows), the groups' bf16 products summed in fp32.
Shorter weights keep the int4 parts: a call per group of a few thousand rows is too little work
to share between threads (measured on 2 AVX2 cores: at N = 1024 the int4 parts are faster, at
N = 4096 and at the head the int8 calls).

Layout: the int4 op wants N a multiple of 16 and packs rows in blocks, so rows are padded with zero
codes to a multiple of `ROW_BLOCK` and packed in chunks of whole blocks (bounded temporaries for the
head); K is the stored k_pad (pad lanes meet zero columns of x). The operand is made at the weight
object's first use and kept with it (`torch_util.derived`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..torch_util import derived
from .reference import decode_planes
from .weights import QuantWeight

__all__ = ["PackedOperand", "packed_operand", "packed_matmul", "takes_packed", "MAX_COLUMNS", "MIN_PARAMS",
           "INT8_MIN_ROWS"]

# Columns up to which the packed products beat the cached fp32 matrix (measured on AVX2 cores).
MAX_COLUMNS = 16
# Weights smaller than this keep the fp32 matrix (a few MiB): there the op's fixed cost dominates
# (measured: 30 us packed vs 15 us fp32 for a Q5 384 x 128 product).
MIN_PARAMS = 1 << 19
# Rows from which a Q5 / Q6 / W8 weight takes one int8 call per group instead of two int4 parts.
INT8_MIN_ROWS = 4096
ROW_BLOCK = 64
ROWS_PER_CHUNK = 64 * ROW_BLOCK


@dataclass(eq=False)
class PackedOperand:
    """One weight as torch CPU matmul operands. `kind` "int4": `data` uint8 [N_pad, parts * K / 2]
    (the op's layout) and `scales` bf16 [parts * K / group, N_pad, 2]; "int8": `data` int8
    [K / group, N_pad, group] and `scales` bf16 [K / group, N_pad]. `n` real rows of `n_pad`."""

    kind: str
    n: int
    n_pad: int
    k_pad: int
    group: int
    parts: int
    data: torch.Tensor
    scales: torch.Tensor


def _split_codes(q: torch.Tensor, bits: int) -> list[tuple[torch.Tensor, int, int]]:
    """[(u int32 in 0..15, scale multiplier, zero multiplier)] whose terms sum to q (module doc)."""
    if bits == 4:
        return [(q + 8, 1, 0)]
    if bits == 8:
        u = q + 128
        return [(u & 15, 1, 8), (u >> 4, 16, 0)]
    a = ((q + 8) & 15) - 8
    b = (q - a) >> 4
    return [(a + 8, 1, 0), (b + 8, 16, 0)]


def _chunks(weight: QuantWeight, n_pad: int):
    """(r0, r1, codes int32 [r1 - r0, k_pad], fp32 scales [r1 - r0, groups]) over the padded rows."""
    n, kp, g = weight.n, weight.k_pad, weight.group
    for r0 in range(0, n_pad, ROWS_PER_CHUNK):
        r1 = min(n_pad, r0 + ROWS_PER_CHUNK)
        live = max(0, min(n, r1) - r0)
        q = torch.zeros(r1 - r0, kp, dtype=torch.int32)
        s = torch.zeros(r1 - r0, kp // g, dtype=torch.float32)
        if live:
            q_live, s_live = decode_planes(weight.rows(r0, live) if (r0, live) != (0, n) else weight)
            q[:live, :weight.k] = q_live
            s[:live] = s_live.float()
        yield r0, r1, q, s


def _pack(weight: QuantWeight) -> PackedOperand:
    bits, g, n, kp = weight.bits, weight.group, weight.n, weight.k_pad
    groups = kp // g
    if bits > 4 and n >= INT8_MIN_ROWS:
        data = torch.empty(groups, n, g, dtype=torch.int8)
        scales = torch.empty(groups, n, dtype=torch.bfloat16)
        for r0, r1, q, s in _chunks(weight, n):
            data[:, r0:r1] = q.to(torch.int8).view(r1 - r0, groups, g).transpose(0, 1)
            scales[:, r0:r1] = s.t().to(torch.bfloat16)
        return PackedOperand("int8", n, n, kp, g, 1, data, scales)
    n_pad = -(-n // ROW_BLOCK) * ROW_BLOCK
    parts = 1 if bits == 4 else 2
    data = torch.empty(n_pad, parts * kp // 2, dtype=torch.uint8)
    scales = torch.zeros(parts * groups, n_pad, 2, dtype=torch.bfloat16)
    for r0, r1, q, s in _chunks(weight, n_pad):
        split = _split_codes(q, bits)
        u = torch.cat([p[0] for p in split], dim=1) if parts > 1 else split[0][0]
        data[r0:r1] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u.contiguous(), 1)
        for i, (_, s_mul, z_mul) in enumerate(split):
            sb = (s * s_mul).t().to(torch.bfloat16)  # x16 is exact; fp16 -> bf16 rounds
            scales[i * groups:(i + 1) * groups, r0:r1, 0] = sb
            scales[i * groups:(i + 1) * groups, r0:r1, 1] = sb.float().mul(z_mul).to(torch.bfloat16)  # x8: exact
    return PackedOperand("int4", n, n_pad, kp, g, parts, data, scales)


def takes_packed(weight, columns: int) -> bool:
    """Whether a product of `columns` columns with `weight` runs on the packed operand."""
    return isinstance(weight, QuantWeight) and columns <= MAX_COLUMNS and weight.n * weight.k >= MIN_PARAMS


def packed_operand(weight: QuantWeight) -> PackedOperand:
    """The weight's packed operand, made at its first use and kept while the object lives."""
    return derived(weight, "packed", _pack)


def packed_matmul(x: torch.Tensor, weight: QuantWeight) -> torch.Tensor:
    """x [T, K] @ W^T as fp32 [T, N] through the packed operand (x rounded to bf16 if it is not)."""
    op = packed_operand(weight)
    xb = x.to(torch.bfloat16)
    if x.shape[1] != op.k_pad:
        xb = torch.nn.functional.pad(xb, (0, op.k_pad - x.shape[1]))
    if op.kind == "int8":
        xs = xb.view(xb.shape[0], -1, op.group).transpose(0, 1).contiguous()  # [groups, T, group]
        mm = torch._weight_int8pack_mm
        return torch.stack([mm(xs[i], op.data[i], op.scales[i]) for i in range(len(xs))]).sum(0, dtype=torch.float32)
    if op.parts > 1:
        xb = torch.cat([xb] * op.parts, dim=1)
    acc = torch.ops.aten._weight_int4pack_mm_for_cpu(xb.contiguous(), op.data, op.group, op.scales).float()
    return acc if op.n == op.n_pad else acc[:, :op.n]
