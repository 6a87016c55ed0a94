"""l2_prefetch (kernels/l2_prefetch/): the byte spans its launcher hands the kernel, the PTX it issues,
and a launch on the GPU. The kernel computes no value (a cache hint), so the interpreter has nothing
to compare: the spans are checked in Python, the instruction text here and by ptxas in the AOT test
(tests/codegen/test_aot_l2_prefetch.py), and the launch on the card (gpu mark)."""

from __future__ import annotations

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.l2_prefetch import kernels as K
from ninfer_compile.kernels.l2_prefetch.launch import l2_prefetch, prefetch_spans
from ninfer_compile.kernels.linear.weights import QuantWeight


def _quant(fmt: str, n: int, k: int, device="cpu") -> QuantWeight:
    g = -(-k // (32 if fmt == "W8G32_F16S" else 64))
    high = {"Q4G64_F16S": 0, "Q5G64_F16S": 8, "Q6G64_F16S": 16, "W8G32_F16S": 0}[fmt] * g
    base = torch.randint(0, 255, (n * g * 32,), dtype=torch.uint8, device=device)
    return QuantWeight(format=fmt, n=n, k=k, k_pad=g * 64, groups_per_row=g, base=base,
                       high=torch.zeros(n * high, dtype=torch.uint8, device=device) if high else None,
                       scale=torch.zeros(n * g * 2, dtype=torch.uint8, device=device))


def test_spans_cover_the_first_rows_of_every_plane():
    w = _quant("Q5G64_F16S", 300, 5120)  # 80 groups: base 2560, high 640, scale 160 bytes a row
    per_row = 2560 + 640 + 160
    spans = prefetch_spans(w, 10 * per_row + 1)  # 11 rows
    assert spans == [(w.base.data_ptr(), 11 * 2560), (w.high.data_ptr(), 11 * 640), (w.scale.data_ptr(), 11 * 160)]
    assert prefetch_spans(w, 1) == [(w.base.data_ptr(), 2560), (w.high.data_ptr(), 640), (w.scale.data_ptr(), 160)]
    full = prefetch_spans(w, 1 << 40)  # never past the weight
    assert [n for _, n in full] == [300 * 2560, 300 * 640, 300 * 160]


def test_spans_of_a_row_view_start_at_its_first_row():
    w = _quant("Q4G64_F16S", 64, 200)  # K not a multiple of 128: 4 groups, base 128, scale 8 bytes a row
    v = w.rows(16, 8)
    spans = prefetch_spans(v, 3 * 136)
    assert spans[0] == (w.base.data_ptr() + 16 * 128, 3 * 128)
    assert spans[1] == (spans[0][0], 0)  # Q4 has no high plane: an empty span at a real address
    assert spans[2] == (w.scale.data_ptr() + 16 * 8, 3 * 8 // 16 * 16)  # shrunk to 16-byte boundaries


def test_spans_of_bf16_rows_shrink_to_16_byte_boundaries():
    t = torch.zeros(40, 13, dtype=torch.bfloat16)  # 26-byte rows
    v = t[3:]
    (a, n), empty1, empty2 = prefetch_spans(v, 2 * 26)
    start, end = v.data_ptr(), v.data_ptr() + 26 + 26
    assert a == -(-start // 16) * 16 and a + n == end // 16 * 16 and a % 16 == 0 and n % 16 == 0
    assert empty1 == (a, 0) and empty2 == (a, 0)


def test_bad_arguments_are_one_line_errors():
    w = _quant("W8G32_F16S", 4, 64)
    with pytest.raises(RouteError, match="BYTES must be >= 1"):
        prefetch_spans(w, 0)
    with pytest.raises(RouteError, match="QuantWeight or a 2-D tensor"):
        prefetch_spans(torch.zeros(8), 64)
    with pytest.raises(RouteError, match="PIECE must be a multiple of 512"):
        l2_prefetch(None, w, BYTES=64, PIECE=1000)


def test_off_the_gpu_the_hint_is_dropped():
    w = _quant("Q6G64_F16S", 8, 128)
    before = [p.clone() for p in (w.base, w.high, w.scale)]
    assert l2_prefetch(torch.zeros(1, 4), w, BYTES=1 << 20) is None
    assert all(torch.equal(a, b) for a, b in zip(before, (w.base, w.high, w.scale)))


def test_the_instruction_is_the_bulk_l2_prefetch_guarded_by_its_size():
    asm = K.PREFETCH_L2.value
    assert "cp.async.bulk.prefetch.L2.global [$1], $2;" in asm
    assert asm.index("setp.gt.s32 p, $2, 0") < asm.index("@p cp.async.bulk")  # empty spans issue nothing


@pytest.mark.gpu
def test_launch_on_the_gpu_reads_and_writes_nothing():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90+ GPU")
    w = _quant("Q5G64_F16S", 4096, 5120, device="cuda")
    copies = [p.clone() for p in (w.base, w.high, w.scale)]
    x = torch.randn(1, 5120, device="cuda").bfloat16()
    for nbytes, piece in ((1, 1 << 19), (3 << 20, 1 << 20), (1 << 26, 1 << 21)):
        l2_prefetch(x, w, BYTES=nbytes, PIECE=piece)
        l2_prefetch(x, w.rows(100, 7), BYTES=nbytes, PIECE=piece)
    l2_prefetch(x, torch.randn(33, 17, device="cuda").bfloat16()[1:], BYTES=100)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(copies, (w.base, w.high, w.scale)))


def _norm_with_and_without_prefetch(device: str):
    from ninfer_compile.kernels.norms.launch import rmsnorm

    x = torch.randn(3, 5120, device=device).bfloat16()
    w = (0.1 * torch.randn(5120, device=device)).bfloat16()
    outs = [torch.empty_like(x) for _ in range(2)]
    nxt = _quant("Q4G64_F16S", 4096, 5120, device=device)
    rmsnorm(x, w, outs[0], 1e-6)
    rmsnorm(x, w, outs[1], 1e-6, prefetch=nxt, prefetch_bytes=1 << 22)
    return outs


def test_rmsnorm_with_a_folded_prefetch_computes_the_same_norm_under_the_interpreter():
    plain, folded = _norm_with_and_without_prefetch("cpu")
    assert torch.equal(plain, folded)
    from ninfer_compile.kernels.norms.launch import rmsnorm

    with pytest.raises(RouteError, match="come together"):
        rmsnorm(plain, torch.zeros(5120, dtype=torch.bfloat16), folded, prefetch=_quant("Q4G64_F16S", 4, 5120))


@pytest.mark.gpu
def test_rmsnorm_with_a_folded_prefetch_computes_the_same_norm_on_the_gpu():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90+ GPU")
    plain, folded = _norm_with_and_without_prefetch("cuda")
    torch.cuda.synchronize()
    assert torch.equal(plain, folded)


def _gating_with_and_without_prefetch(device: str):
    from ninfer_compile.kernels.gdn.launch import gdn_gating_proj

    T, Hv, K = 2, 48, 5120
    x = torch.randn(T, K, device=device).bfloat16()
    wa, wb = (0.05 * torch.randn(Hv, K, device=device)).bfloat16(), (0.05 * torch.randn(Hv, K, device=device)).bfloat16()
    a_log, dt = torch.randn(Hv, device=device), torch.randn(Hv, device=device)
    outs = []
    for extra in ({}, {"prefetch": _quant("Q5G64_F16S", 1024, K, device=device), "prefetch_bytes": 1 << 22}):
        g, beta = torch.empty(T, Hv, device=device), torch.empty(T, Hv, device=device)
        gdn_gating_proj(x, wa, wb, a_log, dt, g, beta, BLOCK_K=8192, num_warps=16, **extra)
        outs.append((g, beta))
    return outs


def test_gating_proj_with_a_folded_prefetch_computes_the_same_gates_under_the_interpreter():
    (g0, b0), (g1, b1) = _gating_with_and_without_prefetch("cpu")
    assert torch.equal(g0, g1) and torch.equal(b0, b1)


@pytest.mark.gpu
def test_gating_proj_with_a_folded_prefetch_computes_the_same_gates_on_the_gpu():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90+ GPU")
    (g0, b0), (g1, b1) = _gating_with_and_without_prefetch("cuda")
    torch.cuda.synchronize()
    assert torch.equal(g0, g1) and torch.equal(b0, b1)
