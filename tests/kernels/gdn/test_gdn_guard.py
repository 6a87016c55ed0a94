"""Out-of-bounds detector for the chunked-prefill launchers (gdn_chunked_prefill and
gdn_chunked_wy_prefill).

The Triton interpreter honours masks but does not fault on an unmasked access past a tensor's end
(it just reads / writes host memory), so the accuracy tests cannot see one. Here every operand,
the state and the workspace are carved out of a larger buffer whose head and tail guard regions
hold a sentinel (NaN for floats, a wild value for the int32 index tensors); the workspace has
exactly chunked_workspace_numel elements and starts all-NaN. After the launch:
  * every guard region must be bit-for-bit unchanged (an out-of-bounds store),
  * o and the state must be finite and match the recurrent fp32 reference (an out-of-bounds load
    that feeds a result reads NaN; so does a read of workspace the kernels never wrote),
  * the other state slots must be unchanged.
(An over-read that stays inside the same allocation, e.g. the next head's workspace rows, is not
visible here; it cannot fault on a GPU either.)
T covers one row, partial 16-row sub-blocks, one exact chunk, chunk + 1; block_v covers the values
bench_gdn.py sweeps (plus tiles wider than Dv and a partial last tile). Also valid on a GPU (the
guards then live in device memory and catch out-of-bounds stores there).

The gpu-marked sweep runs every bench_gdn.py fast config at the 27B head shape in a child process
with CUDA_LAUNCH_BLOCKING=1, so an illegal access names the config and kernel and does not poison
the CUDA context of the rest of the test session.
"""

import os
import subprocess
import sys

import pytest
import torch

from ninfer_compile.errors import RouteError
from ninfer_compile.kernels.gdn import launch, launch_chunked_wy, reference
from test_gdn import _inputs  # same folder: pytest puts it on sys.path

DEV = "cuda" if torch.cuda.is_available() else "cpu"
GUARD = 1024  # elements each side, at least (see _Arena.carve)
INT_SENTINEL = 0x3EADBEEF


class _Arena:
    """Tensors carved out of guarded buffers; check() lists the ones whose guards changed."""

    def __init__(self):
        self.parts = []

    def carve(self, name, t, sentinel=None):
        t = t.to(DEV)
        if sentinel is None:
            sentinel = float("nan") if t.is_floating_point() else INT_SENTINEL
        # wide enough that a whole stray 64-row chunk (or a second copy of the tensor) lands in the
        # guard, not in unrelated host memory
        n = t.numel()
        gd = max(GUARD, n, 64 * (n // max(1, t.shape[0])) if t.dim() > 1 else 0)
        buf = torch.full((gd + n + gd,), sentinel, dtype=t.dtype, device=DEV)
        view = buf[gd:gd + n].view(t.shape)
        view.copy_(t)
        self.parts.append((name, buf, gd, n, buf[:gd].clone()))
        return view

    def check(self):
        bad = []
        for name, buf, gd, n, ref in self.parts:
            for side, seg in (("head", buf[:gd]), ("tail", buf[gd + n:])):
                if seg.is_floating_point():
                    same = torch.equal(seg.view(torch.int16 if seg.element_size() == 2 else torch.int32),
                                       ref.view(torch.int16 if ref.element_size() == 2 else torch.int32))
                else:
                    same = torch.equal(seg, ref)
                if not same:
                    bad.append(f"{name}:{side}")
        return bad


def _rel_rms(x, ref):
    x, ref = x.float().cpu(), ref.float().cpu()
    return ((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-12)).item()


def _guarded_run(fast, T, Hk, Hv, Dk, Dv, p0, block_v, **params):
    q, k, v, _a, _b, _al, _dt, g, beta, state = _inputs(T, Hk, Hv, Dk, Dv, 3, 1000 + T + Dv)
    slots = torch.full((T,), 1, dtype=torch.int32)
    pos = torch.arange(p0, p0 + T, dtype=torch.int32)
    o_ref, s_ref = reference.gated_delta_rule(q, k, v, g, beta, state, pos, slots)
    A = _Arena()
    qa, ka, va = A.carve("q", q), A.carve("k", k), A.carve("v", v)
    ga, ba = A.carve("g", g), A.carve("beta", beta)
    sa = A.carve("state", state)
    pa, sla = A.carve("positions", pos), A.carve("slots", slots)
    o = A.carve("o", torch.zeros(T, Hv, Dv, dtype=torch.bfloat16))
    mod = launch_chunked_wy if fast else launch
    ws = A.carve("workspace", torch.full((mod.chunked_workspace_numel(T, Hv, Dk, Dv),), float("nan")))
    if fast:
        launch_chunked_wy.gated_delta_rule_chunked_wy(qa, ka, va, ga, ba, sa, pa, sla, o, ws, block_v=block_v, **params)
    else:
        launch.gated_delta_rule_chunked(qa, ka, va, ga, ba, sa, pa, sla, o, ws, block_v=block_v)
    bad = A.check()
    assert not bad, f"out-of-bounds store into the guard region of {bad}"
    assert torch.isfinite(o.float()).all(), "o not finite: an out-of-bounds or never-written read fed it"
    assert torch.isfinite(sa).all(), "state not finite"
    assert _rel_rms(o, o_ref) <= 1e-2, _rel_rms(o, o_ref)
    assert _rel_rms(sa[1], s_ref[1]) <= 1e-2, _rel_rms(sa[1], s_ref[1])
    assert torch.equal(sa.cpu()[[0, 2]], state[[0, 2]]), "another slot's state was written"


T_VALUES = [1, 3, 17, 33, 64, 65]


@pytest.mark.parametrize("block_v", [32, 64])  # bench_gdn.py's fast sweep
@pytest.mark.parametrize("T", T_VALUES)
def test_fast_guarded(T, block_v):
    _guarded_run(True, T, 1, 2, 32, 64, p0=3, block_v=block_v)


@pytest.mark.parametrize("block_v", [16, 32, 64])  # bench_gdn.py's sweep of the existing route
@pytest.mark.parametrize("T", T_VALUES)
def test_chunked_guarded(T, block_v):
    _guarded_run(False, T, 1, 2, 32, 64, p0=3, block_v=block_v)


@pytest.mark.parametrize("block_v", [16, 32, 64, 128])
def test_fast_guarded_partial_v_tile(block_v):
    # Dv = 48: the last block_v tile is partial (or one tile wider than Dv); Dk = 48 pads BK to 64;
    # two chunks, position 0 (stale slot state ignored), bench-like warps / stages
    _guarded_run(True, 70, 2, 4, 48, 48, p0=0, block_v=block_v, num_warps=8, num_stages=3)


_SWEEP = [(bv, nw, ns) for bv in (32, 64) for nw in (4, 8) for ns in (1, 2, 3)]


def _sweep_child(T: int, only: str | None = None) -> None:
    """Run every fast config of bench_gdn.py at the 27B head shape, one launch each, synchronising
    after each; prints one line per config so the parent can name the one that faulted."""
    Hk, Hv, Dk, Dv = 16, 48, 128, 128
    q, k, v, _a, _b, _al, _dt, g, beta, state = _inputs(T, Hk, Hv, Dk, Dv, 2, T)
    dev = [x.cuda() for x in (q, k, v, g, beta)]
    slots = torch.full((T,), 1, dtype=torch.int32, device="cuda")
    pos = torch.arange(7, 7 + T, dtype=torch.int32, device="cuda")
    o = torch.empty(T, Hv, Dv, dtype=torch.bfloat16, device="cuda")
    ws = torch.empty(launch_chunked_wy.chunked_workspace_numel(T, Hv, Dk, Dv), device="cuda")
    for bv, nw, ns in _SWEEP:
        if only is not None and only != f"bv{bv}_w{nw}_s{ns}":
            continue
        print(f"config bv{bv}_w{nw}_s{ns}: start", flush=True)
        st = state.clone().cuda()
        launch_chunked_wy.gated_delta_rule_chunked_wy(*dev, st, pos, slots, o, ws, block_v=bv, num_warps=nw,
                                                  num_stages=ns)
        torch.cuda.synchronize()
        print(f"config bv{bv}_w{nw}_s{ns}: ok", flush=True)


@pytest.mark.gpu
def test_fast_bench_sweep_isolated_gpu():
    """Each config in its own process (an illegal access kills the CUDA context): the failure lists
    every config that faulted, not only the first."""
    T = 1024  # bench_gdn.py's first prefill length, where the H200 run hit the illegal access
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    bad = []
    refused = []
    for bv, nw, ns in _SWEEP:
        name = f"bv{bv}_w{nw}_s{ns}"
        if (bv, nw, ns) in launch_chunked_wy.KNOWN_FAULTS:
            refused.append(name)  # the launcher refuses it (checked below); nothing to run
            continue
        r = subprocess.run([sys.executable, __file__, "--sweep-child", str(T), name], env=env, capture_output=True,
                           text=True, timeout=180, cwd=os.path.dirname(os.path.abspath(__file__)))
        if r.returncode != 0:
            bad.append(f"{name}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    assert not bad, f"fast sweep T={T}: faulting configs:\n" + "\n".join(bad)
    for name in refused:
        bv, nw, ns = (int(x[1:]) for x in name.replace("bv", "v").split("_"))
        with pytest.raises(RouteError, match="refused on a GPU"):
            launch_chunked_wy.gated_delta_rule_chunked_wy(*([torch.empty(0)] * 10), block_v=bv, num_warps=nw,
                                                      num_stages=ns)


if __name__ == "__main__" and sys.argv[1:2] == ["--sweep-child"]:
    _sweep_child(int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
