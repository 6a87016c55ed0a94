"""Operands, byte counts, the bf16 peer and the timer of bench/bench_moe.py (imported as
`moe_bench_ops`; bench/ is on sys.path when the script runs).

Nothing here imports a Triton kernel module at import time: the dry run sets TRITON_INTERPRET
before the launchers are imported (`kernels()`).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ninfer_compile.artifact.formats import row_split_geometry
from ninfer_compile.kernels.moe.tune import routing_draw

# the 35B-A3B's MoE layer; the dry run's tiny one (the interpreter's few-second budget)
GEOMETRY = {"35b": {"E": 256, "H": 2048, "I": 512, "top_k": 8, "hot": 16},
            "dry": {"E": 16, "H": 96, "I": 32, "top_k": 2, "hot": 4}}
BANKS = {"q4_q5": ("Q4G64_F16S", "Q5G64_F16S"), "q4_q6": ("Q4G64_F16S", "Q6G64_F16S"),
         "w8": ("W8G32_F16S", "W8G32_F16S")}
ROUTER_FORMAT = "BF16"
L2_BYTES = 50 * 2**20


def kernels():
    """(launch, reference) modules of the MoE families (imports the Triton kernels)."""
    from ninfer_compile.kernels.moe import launch, reference

    return launch, reference


def row_bytes(fmt: str, k: int) -> int:
    """Stored bytes of one row of K columns (base + high + scale planes; BF16: 2 bytes a column)."""
    if fmt == "BF16":
        return 2 * k
    g = row_split_geometry(fmt, 1, k)
    return g.base_row_bytes + g.high_row_bytes + g.scale_row_bytes


@dataclass
class Layer:
    """One MoE layer's operands: `banks` quantized copies [(gate_up, down)], bank 0 dequantized to
    fp32 (the reference) and `bf16` copies [E, 2I, H] / [E, H, I] of the first banks (the peer)."""

    geo: dict
    gu_fmt: str
    dn_fmt: str
    device: torch.device
    banks: list = field(default_factory=list)
    ref_banks: tuple = ()
    bf16: list = field(default_factory=list)

    @property
    def expert_bytes(self) -> int:
        g = self.geo
        return 2 * g["I"] * row_bytes(self.gu_fmt, g["H"]) + g["H"] * row_bytes(self.dn_fmt, g["I"])

    @property
    def expert_bytes_bf16(self) -> int:
        g = self.geo
        return 3 * g["I"] * g["H"] * 2


def build_layer(geo: dict, bank: str, n_banks: int, n_bf16: int, device, gen) -> Layer:
    from ninfer_compile.kernels.linear.reference import dequantize
    from ninfer_compile.tune import measure as M

    gu_fmt, dn_fmt = BANKS[bank]
    E, H, I = geo["E"], geo["H"], geo["I"]
    lay = Layer(geo, gu_fmt, dn_fmt, torch.device(device))
    for _ in range(n_banks):
        lay.banks.append((M.random_linear_weight(gu_fmt, E * 2 * I, H, gen),
                          M.random_linear_weight(dn_fmt, E * H, I, gen)))
    lay.ref_banks = (dequantize(lay.banks[0][0]), dequantize(lay.banks[0][1]))
    for j in range(min(n_bf16, n_banks)):
        gu, dn = lay.ref_banks if j == 0 else (dequantize(lay.banks[j][0]), dequantize(lay.banks[j][1]))
        lay.bf16.append((gu.to(torch.bfloat16).view(E, 2 * I, H), dn.to(torch.bfloat16).view(E, H, I)))
        del gu, dn
    return lay


@dataclass
class Draw:
    """One routing draw and what it costs: distinct experts hit, the peer's per-expert plan."""

    ids: torch.Tensor
    weights: torch.Tensor
    gate: torch.Tensor
    hits: int
    plan: list  # [(expert, token indices long [n_e], weights f32 [n_e, 1])]


def make_draws(n: int, t: int, geo: dict, dist: str, gen, device, hot: torch.Tensor) -> list[Draw]:
    """`n` routing draws: `uniform` (top_k distinct experts per token) or `skewed` (half of each
    token's slots on the fixed `hot` experts, the rest uniform over the others; distinct per token)."""
    k = geo["top_k"]
    out = []
    for _ in range(n):
        if dist == "uniform":
            ids, w, gate = routing_draw(t, geo["E"], k, gen, device)
        else:
            ids, w, gate = routing_draw(t, geo["E"], k, gen, device, hot=hot, hot_slots=k // 2)
        flat = ids.reshape(-1).long()
        plan = []
        for e in torch.unique(flat).tolist():
            pairs = (flat == e).nonzero().reshape(-1)
            plan.append((e, (pairs // k).contiguous(), w.reshape(-1)[pairs].reshape(-1, 1).contiguous()))
        out.append(Draw(ids, w, gate, len(plan), plan))
    return out


def activation_bytes(t: int, geo: dict) -> int:
    """x, shared, residual read and out written (bf16) plus the routing (ids, weights, gate)."""
    return 4 * t * geo["H"] * 2 + t * geo["top_k"] * 8 + t * 4


def peer_call(x, draw: Draw, gu_bf, dn_bf, shared, residual, out, inter: int) -> None:
    """The MoE op in torch bf16: per hit expert, gather its tokens, two cuBLAS matmuls (gate/up,
    down) and SwiGLU; the weighted rows summed in fp32 with the gated shared expert and residual."""
    acc = residual.float() + draw.gate[:, None] * shared.float()
    for e, tok, w in draw.plan:
        h = x.index_select(0, tok) @ gu_bf[e].t()
        y = (F.silu(h[:, :inter]) * h[:, inter:]) @ dn_bf[e].t()
        acc.index_add_(0, tok, y.float() * w)
    out.copy_(acc)


def time_calls(fns, reps: int, cuda: bool) -> tuple[float, str]:
    """Median µs per call of the list `fns` (each call one op on its own cold operands). CUDA: the
    tuner's timing (`tune.measure.time_launches`: a CUDA graph of the list, replayed). CPU (the dry
    run): the list `reps` times under perf_counter."""
    if cuda:
        from ninfer_compile.tune.measure import time_launches

        return time_launches(fns, reps)
    times = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        for f in fns:
            f()
        times.append((time.perf_counter() - t0) * 1e6 / len(fns))
    return statistics.median(times), "cpu"


def n_cold(nbytes: float, lo: int, hi: int) -> int:
    """Copies / draws so that the rotation reads > 3x L2 between two uses of one copy."""
    return int(min(hi, max(lo, math.ceil(3 * L2_BYTES / max(nbytes, 1.0)) + 1)))
