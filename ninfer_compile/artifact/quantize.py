"""The canonical grouped-weight encoder `MAXABS_F16_RECIP_RNE_V1` (tensor-formats §7), bit-exact.

Per row, per group of G logical values (the last group may be partial):

    amax        = max |x|                                   (binary32)
    amax == +0  -> scale +0, codes 0
    raw_scale32 = f32(amax / f32(qmax))                     (qmax: 7, 15, 31, 127)
    scale16     = f16_rne(raw_scale32);  +0 -> 0x0001 rescue;  inf -> error
    inv32       = f32(1 / f32(scale16))
    code        = clamp(round_half_even(f32(x * inv32)), qmin, qmax)

Why this is bit-exact with numpy on CPU: elementwise float32 `/` and `*` (incl. the reciprocal) are
correctly rounded IEEE operations (round-to-nearest-even), `np.rint` rounds half to even, and
the binary32 -> binary16 conversion is done by numpy, which rounds to nearest even and keeps
subnormals (no flush-to-zero). The division `x / scale32` is deliberately NOT used: the profile
fixes reciprocal-multiply, which differs at rounding boundaries.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import ArtifactError
from .formats import format_spec, shape_text

ENCODER_PROFILE = "MAXABS_F16_RECIP_RNE_V1"

_F16_MIN_SUBNORMAL_BITS = 0x0001


def quantize_maxabs(format: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize `x` [N, K] (any floating dtype, converted to binary32 with RNE) with the canonical
    encoder. Returns codes [N, K] int8 and scales [N, ceil(K/G)] float16.

    Raises ArtifactError for a non-grouped format, a shape that is not positive rank 2, any
    non-finite value (after conversion to binary32), or a group whose scale overflows binary16.
    """
    fmt = format_spec(format)
    if fmt.kind != "grouped":
        raise ArtifactError(f"{ENCODER_PROFILE}: format {fmt.name} is direct, not a grouped format")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        what = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ArtifactError(f"{ENCODER_PROFILE}: source must be a floating-point tensor, got {what}")
    if x.dim() != 2 or x.shape[0] <= 0 or x.shape[1] <= 0:
        raise ArtifactError(f"{ENCODER_PROFILE}: source must be a positive rank-2 [N, K] matrix, "
                            f"got {shape_text(x.shape)}")
    n, k = x.shape
    g = fmt.group
    groups = -(-k // g)
    # x32: [N, K] binary32 (RNE conversion; exact for bf16/f16 sources).
    x32 = x.detach().to(device="cpu", dtype=torch.float32)
    finite = torch.isfinite(x32)
    if not bool(finite.all()):
        r, c = (int(v) for v in torch.nonzero(~finite)[0])
        original = x[r, c].item()
        raise ArtifactError(f"{ENCODER_PROFILE}: value {original!r} at row {r} column {c} is not a "
                            f"finite binary32; non-finite sources are never quantized")
    # Pad the partial last group with zeros: |0| never raises amax, and padded lanes are
    # discarded below, so only logical values take part.
    xg = np.zeros((n, groups * g), dtype=np.float32)
    xg[:, :k] = x32.numpy()
    xg = xg.reshape(n, groups, g)  # [N, groups, G] f32
    amax = np.abs(xg).max(axis=2)  # [N, groups] f32
    # numpy float32 array / float32 scalar is an elementwise, correctly rounded f32 division.
    raw_scale32 = amax / np.float32(fmt.qmax)  # [N, groups] f32

    # binary32 -> binary16, round to nearest even, subnormals kept (no flush-to-zero).
    with np.errstate(over="ignore"):
        scale16 = raw_scale32.astype(np.float16)  # [N, groups]
    overflow = np.isinf(scale16)
    if overflow.any():
        r, gi = (int(v) for v in np.argwhere(overflow)[0])
        raise ArtifactError(f"{ENCODER_PROFILE}: {fmt.name} row {r} group {gi}: max |x| "
                            f"{float(amax[r, gi])!r} needs scale {float(raw_scale32[r, gi])!r}, "
                            f"which overflows binary16")
    bits = scale16.view(np.uint16)
    bits[(amax > 0) & (bits == 0)] = _F16_MIN_SUBNORMAL_BITS  # underflow rescue: 2^-24

    scale32 = bits.view(np.float16).astype(np.float32)  # exact expansion, [N, groups]
    nonzero = scale32 > 0
    # inv32 = f32(1 / scale32); all-zero groups get inv 0 so their codes are exactly 0
    # (the group is all zeros, so x * 0 is +-0 and rounds to code 0).
    inv32 = np.zeros_like(scale32)
    np.divide(np.float32(1.0), scale32, out=inv32, where=nonzero)
    normalized = xg * inv32[:, :, None]  # [N, groups, G] f32: one RNE multiply per lane
    rounded = np.rint(normalized)  # round half to even
    codes = np.clip(rounded, fmt.qmin, fmt.qmax).astype(np.int8)  # clamp after rounding
    codes = np.ascontiguousarray(codes.reshape(n, groups * g)[:, :k])  # [N, K] int8
    scales = torch.from_numpy(bits.astype(np.int16)).view(torch.float16)  # [N, groups] f16
    return torch.from_numpy(codes), scales
