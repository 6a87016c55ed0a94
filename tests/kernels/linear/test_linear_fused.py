"""The CPU path's fused kernel (`linear/torch_fused.py`): every row-split format read in place gives
the fp32 dequantized matmul up to its one rounding, x to int16 per K group (2^-16 of the group's
largest |x|), far inside the packed products' bf16 error (the bound below fails for them). Odd K
(pad lanes), N not a multiple of the row chunk, a row view, fp32 and bf16 x, a group whose x has a
large outlier, T = 1 .. 16 (column blocks of 4); and the one-line fallback where it cannot build."""

import pytest
import torch

from ninfer_compile.kernels.linear import torch_fused
from ninfer_compile.kernels.linear.reference import dequantize

from _linear_helpers import random_weight

FORMATS = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


@pytest.fixture(autouse=True)
def needs_kernel():
    if torch_fused.kernel() is None:
        pytest.skip("the fused CPU kernel does not build or run here")


def _check(x, w):
    w32 = dequantize(w).double()
    want = x.double() @ w32.T
    got = torch_fused.fused_matmul(x, w)
    assert got.dtype == torch.float32 and got.shape == want.shape
    # x's rounding: 2^-16 of each group's largest |x| per lane; fp32 accumulation: 2^-20 of |x| @ |W|^T
    g = w.group
    xp = torch.nn.functional.pad(x.double().abs(), (0, w.k_pad - w.k)).view(x.shape[0], -1, g)
    xmax = xp.amax(-1, keepdim=True).expand_as(xp).reshape(x.shape[0], -1)[:, : w.k]
    bound = (xmax * 2.0**-16) @ w32.abs().T + 2.0**-20 * (x.double().abs() @ w32.abs().T) + 1e-30
    excess = ((got.double() - want).abs() / bound).max().item()
    assert excess <= 1.0, f"{w.format} T={x.shape[0]}: error {excess:.2f} x the bound"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("t", [1, 3, 6, 16])
def test_matches_the_oracle(fmt, t):
    gen = torch.Generator().manual_seed(t * 5 + len(fmt))
    w = random_weight(fmt, 37, 200, gen)
    x = torch.randn(t, 200, generator=gen)
    x[0, 70] = 300.0  # an outlier in the second group
    _check(x, w)
    _check(x.bfloat16(), w)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("t", [1, 3, 5, 17])
@pytest.mark.parametrize("epi", ["none", "residual", "swiglu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_epilogue_stored_in_place(fmt, t, epi, dtype):
    """With `out`: the same fp32 products, the epilogue in fp32 and one rounding at the store into a
    strided out (the residual aliasing it), as the torch ops do (SiLU up to expf's last bits)."""
    gen = torch.Generator().manual_seed(t * 3 + len(epi))
    w = random_weight(fmt, 70, 136, gen)
    x = torch.randn(t, 136, generator=gen).bfloat16()
    acc = torch_fused.fused_matmul(x, w)
    n_out = 35 if epi == "swiglu" else 70
    store = torch.randn(t, n_out + 9, generator=gen).to(dtype)
    out = store[:, 4:4 + n_out]
    if epi == "swiglu":
        want = torch.nn.functional.silu(acc[:, :35]) * acc[:, 35:]
    else:
        want = acc + out.float() if epi == "residual" else acc
    want = want.to(dtype)
    kept = store.clone()
    assert torch_fused.fused_matmul(x, w, out, out if epi == "residual" else None, epi) is True
    torch.testing.assert_close(out, want, rtol=1e-6 if dtype == torch.float32 else 0, atol=0)
    assert torch.equal(store[:, :4], kept[:, :4]) and torch.equal(store[:, 4 + n_out:], kept[:, 4 + n_out:])


def test_epilogue_declines_what_it_cannot_store():
    gen = torch.Generator().manual_seed(2)
    w = random_weight("Q4G64_F16S", 8, 64, gen)
    x = torch.randn(2, 64, generator=gen)
    assert torch_fused.fused_matmul(x, w, torch.empty(2, 8, dtype=torch.float16)) is False
    assert torch_fused.fused_matmul(x, w, torch.empty(8, 2).t()) is False
    assert torch_fused.fused_matmul(x, w, torch.empty(2, 8), None, "residual") is False


@pytest.mark.parametrize("fmt", ["Q5G64_F16S", "Q6G64_F16S"])
def test_row_view_of_a_tall_weight(fmt):
    gen = torch.Generator().manual_seed(7)
    w = random_weight(fmt, 9000, 64, gen).rows(40, 8400)  # 64-row chunks, a ragged last one
    _check(torch.randn(2, 64, generator=gen), w)


def test_the_packed_products_fail_the_bound():
    """The bound above is tight enough to see bf16 products (the fallback's rounding)."""
    from ninfer_compile.kernels.linear import torch_packed

    gen = torch.Generator().manual_seed(3)
    w = random_weight("Q4G64_F16S", 64, 256, gen)
    x = torch.randn(1, 256, generator=gen)
    saved = torch_fused.fused_matmul
    try:
        torch_fused.fused_matmul = torch_packed.packed_matmul
        with pytest.raises(AssertionError):
            _check(x, w)
    finally:
        torch_fused.fused_matmul = saved


def test_without_a_compiler_the_fallback_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path))
    from ninfer_compile.kernels import torch_util

    monkeypatch.setattr(torch_util.shutil, "which", lambda name: None)
    assert torch_fused._load() is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no C++ compiler" in err[0], err
    monkeypatch.setenv("NINFER_CPU_FUSED", "0")
    assert torch_fused._load() is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_row_range_reads_those_rows_in_place(fmt):
    """rows=(begin, count) gives exactly the row view's product (the same bytes), here on a view of a
    view, K not a multiple of the group, T = 5 (a column block of 4 and one of 1)."""
    gen = torch.Generator().manual_seed(11 + len(fmt))
    parent = random_weight(fmt, 90, 150, gen)
    w = parent.rows(6, 80)
    x = torch.randn(5, 150, generator=gen).bfloat16()
    got = torch_fused.fused_matmul(x, w, rows=(33, 19))
    assert torch.equal(got, torch_fused.fused_matmul(x, parent.rows(39, 19)))
    _check(x, w.rows(33, 19))
    for bad in ((75, 6), (-1, 3), (0, 0)):
        with pytest.raises(Exception, match="outside the weight's 80 rows"):
            torch_fused.fused_matmul(x, w, rows=bad)
    with pytest.raises(Exception, match="is not"):
        torch_fused.fused_matmul(x[:, :149], w)


def test_two_threads_and_two_callers_give_one_threads_bits():
    """The helper-thread pool (torch_util.POOL_CPP): products with 2 threads, repeated, and from two
    Python threads at once (the second caller runs alone), bitwise equal to one thread's."""
    import threading

    gen = torch.Generator().manual_seed(11)
    ws = [random_weight(fmt, 3000, 192, gen) for fmt in FORMATS]
    xs = [torch.randn(3, 192, generator=gen).bfloat16() for _ in ws]
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = [torch_fused.fused_matmul(x, w) for x, w in zip(xs, ws)]
        res = torch.randn(3, 3000, generator=gen).bfloat16()

        def stored(x, w):  # bf16 out + residual: the epilogue's 64-row blocks inside each chunk
            out = torch.full((3, 3000), float("nan"), dtype=torch.bfloat16)
            assert torch_fused.fused_matmul(x, w, out, res, "residual")
            return out

        want_stored = [stored(x, w) for x, w in zip(xs, ws)]
        torch.set_num_threads(2)
        for _ in range(20):
            for x, w, ref in zip(xs, ws, want):
                assert torch.equal(torch_fused.fused_matmul(x, w), ref)
        for x, w, ref, product in zip(xs, ws, want_stored, want):
            assert torch.equal(stored(x, w), ref)
            assert torch.equal(ref, (product + res.float()).bfloat16())
        errors = []

        def caller():
            for _ in range(10):
                for x, w, ref in zip(xs, ws, want):
                    if not torch.equal(torch_fused.fused_matmul(x, w), ref):
                        errors.append(w.format)

        threads = [threading.Thread(target=caller) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
    finally:
        torch.set_num_threads(saved)
