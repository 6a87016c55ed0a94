"""Test helpers for the linear family: random row-split weights and a relative-RMS check."""

from __future__ import annotations

import torch

from ninfer_compile.artifact.codecs import encode_row_split
from ninfer_compile.kernels.linear.weights import from_payload

QRANGE = {"Q4G64_F16S": (-8, 7), "Q5G64_F16S": (-16, 15), "Q6G64_F16S": (-32, 31),
          "W8G32_F16S": (-127, 127)}
GROUP = {"Q4G64_F16S": 64, "Q5G64_F16S": 64, "Q6G64_F16S": 64, "W8G32_F16S": 32}
PREFIX_FORMAT = {"q4": "Q4G64_F16S", "q5": "Q5G64_F16S", "q6": "Q6G64_F16S", "w8": "W8G32_F16S",
                 "bf16": "BF16"}


def random_weight(fmt: str, n: int, k: int, gen: torch.Generator, device="cpu"):
    """A random weight of `fmt` [n, k]: QuantWeight built from encoded planes, or bf16."""
    if fmt == "BF16":
        return (torch.randn(n, k, generator=gen) * 0.05).bfloat16().to(device)
    lo, hi = QRANGE[fmt]
    codes = torch.randint(lo, hi + 1, (n, k), generator=gen, dtype=torch.int8)
    groups = -(-k // GROUP[fmt])
    scales = (torch.rand(n, groups, generator=gen) * 0.02 + 1e-3).half()
    scales[0, 0] = 0.0          # a +0 scale over an all-zero group
    codes[0, : GROUP[fmt]] = 0
    payload = encode_row_split(fmt, codes, scales)
    buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    return from_payload(fmt, (n, k), buf)


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def assert_close_rel(out: torch.Tensor, ref: torch.Tensor, tol: float = 1e-2, what: str = "") -> None:
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(out.float()).all(), f"{what}: non-finite (unwritten?) output elements"
    err = rel_rms(out, ref)
    assert err <= tol, f"{what}: relative RMS error {err:.3e} > {tol:.1e}"


def run_route(launcher, fmt, t, n, k, epi, params, seed, view=None, device="cpu", residual_in_place=False,
              workspace_numel=None):
    """Random weight (or a row view `(begin, parent_n)` of a fused parent), x, residual; call the
    route's `launcher` with NaN-filled out / workspace (`workspace_numel(params)` elements when
    SPLIT_K > 1). Returns (out on the CPU, the fp32 reference)."""
    from ninfer_compile.kernels.linear.reference import linear as ref_linear

    gen = torch.Generator().manual_seed(seed)
    if view is None:
        w = random_weight(fmt, n, k, gen)
    else:
        begin, parent_n = view
        w = random_weight(fmt, parent_n, k, gen).rows(begin, n)
    x = torch.randn(t, k, generator=gen).bfloat16()
    n_out = n // 2 if epi == "swiglu" else n
    residual = torch.randn(t, n_out, generator=gen).bfloat16() if epi == "residual" else None
    expected = ref_linear(x, w, epi, residual)
    if device != "cpu":
        w = w.to(device)
        x = x.to(device)
        residual = None if residual is None else residual.to(device)
    out = torch.full((t, n_out), float("nan"), dtype=torch.bfloat16, device=device)
    if residual_in_place:
        out.copy_(residual)
        residual = out
    ws = None
    if params.get("SPLIT_K", 1) > 1:
        ws = torch.full((workspace_numel(params),), float("nan"), device=device)
    assert launcher(x, w, out, epilogue=epi, residual=residual, workspace=ws, **(params or {})) is None
    return out.cpu(), expected
