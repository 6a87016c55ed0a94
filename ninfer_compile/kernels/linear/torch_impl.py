"""CPU path of the linear family: every linear route's launch computed with torch.

`linear(x, weight, out, *, residual=None, epilogue="none", workspace=None, **params)` takes the
launchers' arguments (route params such as BLOCK_N / SPLIT_K and the workspace are accepted and
ignored: the product is one fp32 matmul). The weight is the same operand the launchers read (a
row-split `QuantWeight`, maybe a row view, or bf16 [N, K]); the CPU path dequantizes it once into
fp32 at first use and keeps it (`torch_util.fp32_weight`). fp32 accumulation, the epilogue in
fp32, one rounding at the store into `out` (which `residual` may alias).
"""

from __future__ import annotations

import torch

from ...errors import RouteError
from ..torch_util import fp32_weight

__all__ = ["linear"]


def linear(x, weight, out, *, residual=None, epilogue: str = "none", workspace=None, **params) -> None:
    """out[T, N_out] = epilogue(x[T, K] @ W^T): none | residual (+ residual) | swiglu (rows [gate | up])."""
    w = fp32_weight(weight)
    if x.shape[-1] != w.shape[1]:
        raise RouteError(f"linear (torch): x {list(x.shape)} has K={x.shape[-1]}, weight has K={w.shape[1]}")
    acc = torch.mm(x.float(), w.t())
    if epilogue == "none":
        out.copy_(acc)
    elif epilogue == "residual":
        if residual is None:
            raise RouteError("linear (torch): the residual epilogue needs a residual tensor")
        acc += residual
        out.copy_(acc)
    elif epilogue == "swiglu":
        n_out = acc.shape[1] // 2
        gate = acc[:, :n_out]
        out.copy_(torch.nn.functional.silu(gate).mul_(acc[:, n_out:]))
    else:
        raise RouteError(f"linear (torch): unknown epilogue {epilogue!r}")
