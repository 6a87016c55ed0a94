"""Test helpers of the MoE families: random linear weights of any format, random routing."""

from __future__ import annotations

import torch

from ninfer_compile.artifact.codecs import encode_row_split
from ninfer_compile.kernels.linear.weights import from_payload

QRANGE = {"Q4G64_F16S": (-8, 7), "Q5G64_F16S": (-16, 15), "Q6G64_F16S": (-32, 31), "W8G32_F16S": (-127, 127)}
GROUP = {"Q4G64_F16S": 64, "Q5G64_F16S": 64, "Q6G64_F16S": 64, "W8G32_F16S": 32}


def random_weight(fmt: str, n: int, k: int, gen: torch.Generator, scale: float = 0.02):
    """A random `fmt` weight [n, k]: a QuantWeight over encoded planes, or bf16."""
    if fmt == "BF16":
        return (torch.randn(n, k, generator=gen) * scale * 3).bfloat16()
    lo, hi = QRANGE[fmt]
    codes = torch.randint(lo, hi + 1, (n, k), generator=gen, dtype=torch.int8)
    scales = (torch.rand(n, -(-k // GROUP[fmt]), generator=gen) * scale * 8 / (hi + 1) + 1e-3).half()
    buf = torch.frombuffer(bytearray(encode_row_split(fmt, codes, scales)), dtype=torch.uint8)
    return from_payload(fmt, (n, k), buf)


def random_routing(T: int, E: int, k: int, gen: torch.Generator):
    """(expert_ids int32 [T, k] distinct per row, weights f32 [T, k] summing to 1, shared_gate f32 [T])."""
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)]).to(torch.int32)
    w = torch.rand(T, k, generator=gen) + 0.1
    return ids, w / w.sum(-1, keepdim=True), torch.rand(T, generator=gen)


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30))
