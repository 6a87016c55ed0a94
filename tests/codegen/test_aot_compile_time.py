"""What keeps a cold binary compile short without touching the binaries: the pool's hand-out order
(aot_binaries.pool_order), the ptx / cubin stages shared by identical inputs
(aot_stage_memo.py) and a scratch cache that keeps only metadata and cubins
(aot_device.environment). Plans stay byte-identical: the real compiles in test_aot.py /
test_binary_cache.py run through all three."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ninfer_compile.codegen import aot_stage_memo
from ninfer_compile.codegen.aot_binaries import pool_order

PTX = "//\n.version 8.4\n.target sm_90\n.visible .entry {name}(\n)\n{{ ret; }}\n"


@dataclass
class _Rec:
    first_use: str


def test_pool_order_hands_out_prefill_and_verify_kernels_first():
    recs = [_Rec("decode_c1_k0/l0.attn.q"), _Rec("prefill_t64[3 columns]/l0.gdn.delta_rule"),
            _Rec("decode_c2_k0/lm_head"), _Rec("verify_c1_k3/l1.attn.attention"),
            _Rec("prefill_t64/l0.attn.attention"), _Rec("mtp_prefill_t64/mtp.attn")]
    assert pool_order(recs, [0, 1, 2, 3, 4, 5]) == [1, 3, 4, 5, 0, 2]
    assert pool_order(recs, [2, 4, 0]) == [4, 0, 2]  # a subset (the kernels the cache lacks) keeps its order
    assert pool_order(recs, []) == []


class _Stage:
    """A stand-in for one of Triton's stages: counts its runs, sets the name as make_ptx does."""

    def __init__(self, ext: str):
        self.ext, self.calls = ext, 0

    def __call__(self, src, metadata):
        self.calls += 1
        if self.ext == "ptx":
            name = src.split()[0]
            metadata["name"] = name
            return PTX.format(name=name)
        return b"CUBIN:" + src.encode()


def test_stage_memo_runs_a_stage_once_per_distinct_input(tmp_path):
    ptx = _Stage("ptx")
    run = aot_stage_memo._memoised(ptx, "ptx", "sm90", "options-a", str(tmp_path))
    first_meta, again_meta = {}, {}
    first = run("kern_a llvm-ir", first_meta)
    again = run("kern_a llvm-ir", again_meta)
    assert ptx.calls == 1 and again == first and again_meta == first_meta == {"name": "kern_a"}
    run("kern_b llvm-ir", {})  # another input
    other_options = aot_stage_memo._memoised(ptx, "ptx", "sm90", "options-b", str(tmp_path))
    other_options("kern_a llvm-ir", {})  # the same input under other options
    assert ptx.calls == 3
    cubin = _Stage("cubin")
    run_cubin = aot_stage_memo._memoised(cubin, "cubin", "sm90", "options-a", str(tmp_path))
    assert run_cubin(first, {}) == run_cubin(first, {}) == b"CUBIN:" + first.encode() and cubin.calls == 1
    assert not list(tmp_path.glob("*.part"))  # every entry renamed into place


def test_stage_memo_recomputes_a_damaged_ptx_entry(tmp_path):
    ptx = _Stage("ptx")
    run = aot_stage_memo._memoised(ptx, "ptx", "sm90", "o", str(tmp_path))
    run("kern_a ir", {})
    (entry,) = tmp_path.iterdir()
    entry.write_text("no entry point here")
    meta = {}
    assert run("kern_a ir", meta) == PTX.format(name="kern_a") and meta == {"name": "kern_a"} and ptx.calls == 2


def test_shared_stages_wraps_ptx_and_cubin_and_restores_the_backend(tmp_path):
    compiler = pytest.importorskip("triton.backends.nvidia.compiler")
    original = compiler.CUDABackend.add_stages

    class _Backend:
        target = "sm90"

    def fake_add(self, stages, options, language):
        stages.update(ttir=_Stage("ttir"), ptx=_Stage("ptx"), cubin=_Stage("cubin"))

    compiler.CUDABackend.add_stages = fake_add
    try:
        with aot_stage_memo.shared_stages(str(tmp_path)):
            stages = {}
            compiler.CUDABackend.add_stages(_Backend(), stages, "opts", None)
            assert isinstance(stages["ttir"], _Stage)  # the front stages are left alone
            assert not isinstance(stages["ptx"], _Stage) and not isinstance(stages["cubin"], _Stage)
        assert compiler.CUDABackend.add_stages is fake_add
    finally:
        compiler.CUDABackend.add_stages = original


def test_environment_keeps_only_binaries_in_the_scratch_cache(tmp_path):
    pytest.importorskip("triton.backends.nvidia.compiler")
    from triton import knobs

    from ninfer_compile.codegen.aot_device import environment

    before = knobs.compilation.store_binary_only
    with environment(90, str(tmp_path), None):
        assert knobs.compilation.store_binary_only is True
    assert knobs.compilation.store_binary_only == before
