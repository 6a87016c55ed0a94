"""CPU path of the linear family: every linear route's launch computed with torch.

`linear(x, weight, out, *, residual=None, epilogue="none", workspace=None, **params)` takes the
launchers' arguments (route params such as BLOCK_N / SPLIT_K and the workspace are accepted and
ignored). The weight is the same operand the launchers read (a row-split `QuantWeight`, maybe a
row view, or bf16 [N, K]). The product x @ W^T (fp32) takes one of two weight layouts, each made
at the weight object's first use and kept with it:
- up to `torch_packed.MAX_COLUMNS` columns (decode, short verify rows) of a `QuantWeight` of at
  least `torch_packed.MIN_PARAMS` weights (`takes_packed`): the fused C++ kernel reading the stored
  planes in place where it builds and runs (`torch_fused`: x rounded to int16 per K group, exact
  int32 group sums, fp32 accumulation), else the stored codes repacked into torch's int4 / int8 CPU
  matmul operands (`torch_packed`: about the stored bytes per step; the scales and the ops'
  products are rounded to bf16, x too when it is not bf16);
- otherwise (prefill, bf16 and small weights): the weight dequantized once into fp32
  (`torch_util.fp32_weight`, exact: scale32 x code32) and one fp32 torch.mm.
The epilogue runs in fp32, one rounding at the store into `out` (which `residual` may alias).
"""

from __future__ import annotations

import torch

from ...errors import RouteError
from ..torch_util import fp32_weight
from . import torch_fused
from .torch_packed import packed_matmul, takes_packed
from .weights import QuantWeight

__all__ = ["linear"]


def _product(x: torch.Tensor, weight) -> torch.Tensor:
    k = weight.k if isinstance(weight, QuantWeight) else weight.shape[1]
    if x.shape[-1] != k:
        raise RouteError(f"linear (torch): x {list(x.shape)} has K={x.shape[-1]}, weight has K={k}")
    if takes_packed(weight, x.shape[0]):
        return torch_fused.fused_matmul(x, weight) if torch_fused.kernel() else packed_matmul(x, weight)
    return torch.mm(x.float(), fp32_weight(weight).t())


def linear(x, weight, out, *, residual=None, epilogue: str = "none", workspace=None, **params) -> None:
    """out[T, N_out] = epilogue(x[T, K] @ W^T): none | residual (+ residual) | swiglu (rows [gate | up])."""
    if (takes_packed(weight, x.shape[0]) and x.shape[-1] == weight.k and torch_fused.kernel()
            and torch_fused.fused_matmul(x, weight, out, residual, epilogue)):
        return
    acc = _product(x, weight)
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
