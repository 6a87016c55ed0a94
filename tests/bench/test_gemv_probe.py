"""bench/gemv_probe.py's pure-Triton access-pattern kernels (interpreter): each reads exactly the
words it claims to -- their xor equals the xor of those words computed by torch -- so a figure the probe
reports is for the bytes it names. (The route-load probe inlines PTX loads: GPU only.)"""

import functools
import operator
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import gemv_probe as P  # noqa: E402


def _xor(t: torch.Tensor) -> int:
    return functools.reduce(operator.xor, t.flatten().tolist(), 0)


@pytest.mark.parametrize("cfg", P.ROW_CONFIGS)
def test_row_pattern_reads_each_base_word_once(cfg, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rows, bw, split, warps = cfg
    n, k = 2 * rows * 3, 384                      # whole row blocks: no clamped (repeated) rows
    row_words = k // 64 * 8
    gen = torch.Generator().manual_seed(1)
    base = torch.randint(-2**31, 2**31 - 1, (n, row_words), dtype=torch.int32, generator=gen)
    wps = -(-row_words // split)
    wps = -(-wps // bw) * bw
    grid = (triton.cdiv(n, rows), split)
    out = torch.zeros(grid[0] * split, dtype=torch.int32)
    P._row_pattern_kernel[grid](base, out, n, row_words, wps, ROWS=rows, BW=bw, num_warps=warps)
    assert _xor(out) == _xor(base)


@pytest.mark.parametrize("fmt", ["Q4G64_F16S", "Q5G64_F16S"])
@pytest.mark.parametrize("nw,split,u", [(2, 1, 1), (2, 3, 2), (1, 2, 4)])
def test_tc_pattern_reads_base_scale_and_high_words(fmt, nw, split, u, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    n, k = 16 * nw * 2, 640                       # 5 K steps of 128: split / U leave remainders
    g = k // 64
    nh = P.HIGH_BYTES_PER_64[fmt] // 8
    gen = torch.Generator().manual_seed(2)
    base = torch.randint(-2**31, 2**31 - 1, (n, g * 8), dtype=torch.int32, generator=gen)
    high = torch.randint(-2**31, 2**31 - 1, (n, max(1, P.HIGH_BYTES_PER_64[fmt] * g // 4)), dtype=torch.int32,
                         generator=gen)
    scale = torch.randint(0, 2**15, (n, g), dtype=torch.int16, generator=gen).view(torch.float16)
    kb_total = k // 128
    ips = -(-kb_total // split)
    grid = (triton.cdiv(n, 16 * nw), split)
    out = torch.zeros(grid[0] * split, dtype=torch.int32)
    P._tc_pattern_kernel[grid](base, high, scale, out, n, kb_total, g * 8, high.shape[1], g, ips,
                               NH=nh, NW=nw, U=u, num_warps=nw)
    # every lane reads its 4 base words once per K step; each scale is read by 2 chunk lanes x 4
    # vector lanes (an even count: it cancels) and so is each high word (4 vector lanes)
    assert _xor(out) == _xor(base)
    out.zero_()
    P._tc_pattern_kernel[grid](base, high, scale, out, n, kb_total, g * 8, high.shape[1], g, ips,
                               NH=nh, NW=nw, U=u, SCALES=False, num_warps=nw)
    assert _xor(out) == _xor(base)
