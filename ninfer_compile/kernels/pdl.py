"""Programmatic dependent launch (PDL, sm_90+): the next kernel's launch overlaps this one's tail.

A decode step is ~740 small launches replayed from a CUDA graph; between two dependent kernels the
GPU drains the first grid, then launches and rasterises the second. With PDL the second grid is
launched as soon as every program of the first has started (`griddepcontrol.launch_dependents`);
its programs then wait in `griddepcontrol.wait` until the first grid has completed and its memory
is visible, so the launch latency and the block scheduling overlap the first grid's last wave.

Contract (checked by tests/kernels/test_pdl.py over every kernel of the package):
  * a kernel that can be launched with PDL declares `PDL: tl.constexpr = False` as its last
    parameter and calls `pdl_enter(PDL)` as its first statement, before any memory access (or the
    prefetching form below);
  * a launcher passes `**pdl_launch(kernel)`: `{"PDL": PDL_LATE or PDL_EARLY, "launch_pdl": True}` only for such
    kernels, on sm_90+ outside the interpreter, while the caller allows it (`allow`, set by the
    runtime per launch from the plan's `dependent_launch` decision: CUDA-graph decode extents),
    unless NINFER_PDL=0 (the off switch; the plan's precompiled binaries are keyed by it, so set it
    the same way at compile time and at run time).
A kernel launched without the attribute after a PDL kernel, or a PDL kernel after a torch kernel,
is ordered as usual: `griddepcontrol.wait` waits for the prior grid whether it triggered early or not.

Two entry orders (the PDL constexpr's value, one per process: NINFER_PDL_EARLY, read like NINFER_PDL
by the launchers at compile time and at run time, so the plan's binaries are keyed by it):
  * PDL_LATE (1, the default): wait, then release the next grid (`launch_dependents`);
  * PDL_EARLY (2, NINFER_PDL_EARLY=1): release the next grid, then wait. The grid after next can
    then launch while this grid's primary still runs, and its pre-wait weight prefetch starts two
    kernels ahead. Why this stays correct for every kernel that keeps the contract:
      - data: a grid's `wait` returns only once its primary grid has completed and flushed its
        memory; that primary completed only after every one of its programs returned from its
        own `wait` (every program runs the entry first, none exits before it), i.e. after the
        grid before it completed. By induction a wait orders after every earlier grid of the
        stream, so workspaces read two kernels later (split-K partials, attention splits),
        counters zeroed by a later kernel and write-after-read reuse of arena buffers are
        ordered exactly as with PDL_LATE. Nothing touches memory before the wait except the
        launch-constant weight prefetch below, which reads bytes no kernel of the step writes;
      - resources: a grid launches only once every program of its primary has started (triggered),
        so the oldest unfinished grid is always fully resident and its primary complete: waiting
        programs never hold slots an earlier grid still needs (no deadlock, no starved wave);
      - kernels launched without the attribute (torch, NCCL, graph memcpy) keep full stream order.
  * a GEMV may prefetch its own weights into L2 before the wait: `pdl_release(PDL)`, then
    `<family>_prefetch(...)` calls whose arguments are kernel parameters (their bodies only compute
    addresses from parameters and program ids and call `pdl_prefetch_rows`), then
    `pdl_acquire(PDL)`; with PDL off all three are no-ops.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .interpret import interpreting

_ARCH: dict[int, int] = {}  # id(active driver) -> its target's arch (the AOT compiler swaps the driver)
_ALLOWED = [False]  # set by the caller around a launch (allow); launches are single-threaded


def allow(on: bool) -> bool:
    """Allow (or not) PDL for the launches that follow; returns the previous setting."""
    old = _ALLOWED[0]
    _ALLOWED[0] = bool(on)
    return old


PDL_LATE = 1  # the PDL constexpr: wait, then release the next grid
PDL_EARLY = 2  # release the next grid, then wait (NINFER_PDL_EARLY=1)
EARLY = tl.constexpr(PDL_EARLY)  # the same, for the jit functions

# cp.async.bulk.prefetch.L2 (sm_90) of bytes [$1, $1 + $2), issued by warp 0 only ($1 16-byte aligned, $2 a
# multiple of 16; both the same in every lane, so ptxas emits one uniform-datapath UBLKPF, no lane loop).
# $0: a dummy result.
PREFETCH_L2_ASM = tl.constexpr(
    "{ .reg .pred p; .reg .b32 t; mov.u32 t, %tid.x; setp.lt.u32 p, t, 32; setp.gt.and.s32 p, $2, 0, p; "
    "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }")


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """First statement of a PDL-capable kernel. PDL_LATE: wait for the previous grid (its writes
    visible), then let the next grid launch (all of this grid's programs have started by then, so
    the next grid's programs cannot take slots this grid still needs). PDL_EARLY: let the next
    grid launch first (see the module docstring for why that stays ordered), then wait."""
    if PDL == EARLY:
        gdc_launch_dependents()
        gdc_wait()
    elif PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def pdl_release(PDL: tl.constexpr):
    """First statement of a kernel that prefetches before its wait: PDL_EARLY releases the next grid."""
    if PDL == EARLY:
        gdc_launch_dependents()


@triton.jit
def pdl_acquire(PDL: tl.constexpr):
    """After the prefetch: wait for the previous grid; PDL_LATE then releases the next grid."""
    if PDL:
        gdc_wait()
        if PDL != EARLY:
            gdc_launch_dependents()


@triton.jit
def pdl_prefetch_rows(ptr, row_stride, row_len, row0, lo, n_rows, UNITS: tl.constexpr, NUM: tl.constexpr,
                      DEN: tl.constexpr, PDL: tl.constexpr):
    """L2 prefetch (no register, no wait) of one contiguous span of a row-major plane (`ptr` typed,
    `row_stride` elements from row to row, `row_len` of them the row's own, NUM / DEN elements per
    K unit): UNITS K units from unit `lo` of row `row0` on (the same span in every plane of a
    quantized weight), clipped to the end of the plane's last row (`n_rows` rows) and shrunk to
    16-byte boundaries (the bulk copy's alignment), so no byte past the plane is touched. Only under
    PDL: the weights are launch constants, nothing the previous kernels write."""
    if PDL:
        ES: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
        first = row0.to(tl.int64) * row_stride + lo * NUM // DEN
        last = tl.minimum(first + UNITS * NUM // DEN, (n_rows - 1).to(tl.int64) * row_stride + row_len)
        base = ptr.to(tl.int64, bitcast=True)
        a = (base + first * ES + 15) & -16
        e = (base + last * ES) & -16
        nbytes = tl.maximum(e - a, 0).to(tl.int32)
        tl.inline_asm_elementwise(PREFETCH_L2_ASM, "=r,l,r", [a, nbytes], dtype=tl.int32, is_pure=False, pack=1)


def enabled() -> bool:
    """PDL for launches in this process: sm_90+ target, not the interpreter, NINFER_PDL != 0."""
    if not _ALLOWED[0]:
        return False
    return available()


def available() -> bool:
    """Whether this process could launch with PDL at all (sm_90+, no interpreter, NINFER_PDL != 0)."""
    if interpreting() or os.environ.get("NINFER_PDL", "1") == "0":
        return False
    from triton.runtime import driver

    active = driver.active
    arch = _ARCH.get(id(active))
    if arch is None:
        try:
            target = active.get_current_target()
            arch = int(target.arch) if target.backend == "cuda" else 0
        except Exception:  # noqa: BLE001 - no usable target: plain launches
            arch = 0
        _ARCH[id(active)] = arch
    return arch >= 90


def early() -> bool:
    """NINFER_PDL_EARLY=1: PDL kernels release the next grid before their wait (default 0 until the
    GPU A/B of bench/gpu_call_pdl.sh says otherwise)."""
    return os.environ.get("NINFER_PDL_EARLY", "0") == "1"


def pdl_launch(kernel) -> dict:
    """Launch keywords for `kernel` (a JITFunction or a wrapper of one)."""
    fn = kernel
    while not hasattr(fn, "arg_names") and hasattr(fn, "fn"):
        fn = fn.fn
    if "PDL" not in getattr(fn, "arg_names", ()) or not enabled():
        return {}
    return {"PDL": PDL_EARLY if early() else PDL_LATE, "launch_pdl": True}
