"""CPU path of the linear family for few columns: a row-split weight repacked once into torch's
int4 CPU matmul operand, so a decode step reads about the stored bytes instead of an fp32 matrix.

torch's `_weight_int4pack_mm_for_cpu(x, packed, group, scale_zeros)` computes, for bf16 x [T, K],
x @ W^T with W[n, k] = (u[n, k] - 8) * scale[k // group, n] + zero[k // group, n], u a 4-bit code,
`scale_zeros` bf16 [K / group, N, 2], fp32 accumulation, bf16 out. Each stored format is a sum of
such products whose codes are the stored codes exactly (`PARTS`), with q the signed code:
- Q4G64: u = q + 8, scale s, zero 0 (one product);
- Q5G64 / Q6G64: q = a + 16 b with a = ((q + 8) & 15) - 8 in [-8, 7], b = (q - a) / 16 (in [-1, 1]
  / [-2, 2]): u = a + 8 with scale s and u = b + 8 with scale 16 s, zeros 0 (two products);
- W8G32: u = q + 128 = lo + 16 hi: u = lo with scale s and zero 8 s, u = hi with scale 16 s and
  zero 0 (two products, group 32).
The products are summed in fp32. Roundings against the fp32 oracle (scale32 x code32): the fp16
scales to bf16 (relative 2^-9 at most, once per group), x to bf16 when it is not bf16, and each
product's bf16 output (relative 2^-9 each); `tests/kernels/linear/test_linear_int4.py` bounds them.

Layout: the op wants N a multiple of 16 and packs rows in blocks; rows are padded with zero codes
to a multiple of `ROW_BLOCK` and packed in chunks of whole blocks (bounded temporaries for the
vocabulary-sized head); K is the stored k_pad (pad lanes meet zero columns of x). The operand is
made at the weight object's first use and kept with it (`torch_util.derived`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..torch_util import derived
from .reference import decode_planes
from .weights import QuantWeight

__all__ = ["Int4Operand", "int4_operand", "int4_matmul", "MAX_COLUMNS"]

# Columns up to which the packed products beat the cached fp32 matrix (a measured crossover on
# AVX2 cores: above it the fp32 GEMM is compute-efficient and the int4 kernel is not).
MAX_COLUMNS = 16
ROW_BLOCK = 64
ROWS_PER_CHUNK = 64 * ROW_BLOCK

# code bits -> int4 products per weight (`_split_codes`)
PARTS = {4: 1, 5: 2, 6: 2, 8: 2}


@dataclass(eq=False)
class Int4Operand:
    """One weight as int4 products: `packed[i]` uint8 [N_pad, K/2] (the op's layout) with
    `scale_zeros[i]` bf16 [K / group, N_pad, 2]; `n` real rows of `n_pad`; `k_pad` columns."""

    n: int
    n_pad: int
    k_pad: int
    group: int
    packed: list[torch.Tensor]
    scale_zeros: list[torch.Tensor]


def _split_codes(q: torch.Tensor, bits: int) -> list[tuple[torch.Tensor, int, int]]:
    """[(u int32 0..15, scale multiplier, zero multiplier)] whose products sum to q (see the module doc)."""
    if bits == 4:
        return [(q + 8, 1, 0)]
    if bits == 8:
        u = q + 128
        return [(u & 15, 1, 8), (u >> 4, 16, 0)]
    a = ((q + 8) & 15) - 8
    b = (q - a) >> 4
    return [(a + 8, 1, 0), (b + 8, 16, 0)]


def _pack(weight: QuantWeight) -> Int4Operand:
    bits, g, n, kp = weight.bits, weight.group, weight.n, weight.k_pad
    n_pad = -(-n // ROW_BLOCK) * ROW_BLOCK
    parts = PARTS[bits]
    packed = [torch.empty(n_pad, kp // 2, dtype=torch.uint8) for _ in range(parts)]
    scale_zeros = [torch.zeros(kp // g, n_pad, 2, dtype=torch.bfloat16) for _ in range(parts)]
    for r0 in range(0, n_pad, ROWS_PER_CHUNK):
        r1 = min(n_pad, r0 + ROWS_PER_CHUNK)
        live = max(0, min(n, r1) - r0)
        q = torch.zeros(r1 - r0, kp, dtype=torch.int32)
        s = torch.zeros(r1 - r0, kp // g, dtype=torch.float32)
        if live:
            w = weight.rows(r0, live) if (r0, live) != (0, n) else weight
            q_live, s_live = decode_planes(w)  # codes [live, k] (pad lanes dropped), fp16 scales
            q[:live, :weight.k] = q_live
            s[:live] = s_live.float()
        for i, (u, s_mul, z_mul) in enumerate(_split_codes(q, bits)):
            packed[i][r0:r1] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u.contiguous(), 1)
            sb = (s * s_mul).t().to(torch.bfloat16)  # x16 is exact; fp16 -> bf16 rounds
            scale_zeros[i][:, r0:r1, 0] = sb
            scale_zeros[i][:, r0:r1, 1] = sb.float().mul(z_mul).to(torch.bfloat16)  # x8: exact
    return Int4Operand(n=n, n_pad=n_pad, k_pad=kp, group=g, packed=packed, scale_zeros=scale_zeros)


def int4_operand(weight: QuantWeight) -> Int4Operand:
    """The weight's int4 products, made at its first use and kept while the object lives."""
    return derived(weight, "int4pack", _pack)


def int4_matmul(x: torch.Tensor, weight: QuantWeight) -> torch.Tensor:
    """x [T, K] @ W^T as fp32 [T, N] through the int4 products (x rounded to bf16 if it is not)."""
    op = int4_operand(weight)
    xb = x.to(torch.bfloat16)
    if x.shape[1] != op.k_pad:
        xb = torch.nn.functional.pad(xb, (0, op.k_pad - x.shape[1]))
    xb = xb.contiguous()
    mm = torch.ops.aten._weight_int4pack_mm_for_cpu
    acc = mm(xb, op.packed[0], op.group, op.scale_zeros[0]).float()
    for packed, sz in zip(op.packed[1:], op.scale_zeros[1:]):
        acc += mm(xb, packed, op.group, sz)
    return acc if op.n == op.n_pad else acc[:, :op.n]
