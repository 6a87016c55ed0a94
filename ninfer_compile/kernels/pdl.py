"""Programmatic dependent launch (PDL, sm_90+): the next kernel's launch overlaps this one's tail.

A decode step is ~740 small launches replayed from a CUDA graph; between two dependent kernels the
GPU drains the first grid, then launches and rasterises the second. With PDL the second grid is
launched as soon as every program of the first has started (`griddepcontrol.launch_dependents`);
its programs then wait in `griddepcontrol.wait` until the first grid has completed and its memory
is visible, so the launch latency and the block scheduling overlap the first grid's last wave.

Contract (checked by tests/kernels/test_pdl.py over every kernel of the package):
  * a kernel that can be launched with PDL declares `PDL: tl.constexpr = False` as its last
    parameter and calls `pdl_enter(PDL)` as its first statement, before any memory access;
  * a launcher passes `**pdl_launch(kernel)`: `{"PDL": True, "launch_pdl": True}` only for such
    kernels, on sm_90+ outside the interpreter, while the caller allows it (`allow`, set by the
    runtime per launch from the plan's `dependent_launch` decision: CUDA-graph decode extents),
    unless NINFER_PDL=0 (the off switch; the plan's precompiled binaries are keyed by it, so set it
    the same way at compile time and at run time).
A kernel launched without the attribute after a PDL kernel, or a PDL kernel after a torch kernel,
is ordered as usual: `griddepcontrol.wait` waits for the prior grid whether it triggered early or not.
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


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """First statement of a PDL-capable kernel: wait for the previous grid (its writes visible),
    then let the next grid launch (all of this grid's programs have started by then, so the
    next grid's programs cannot take slots this grid still needs)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


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


def pdl_launch(kernel) -> dict:
    """Launch keywords for `kernel` (a JITFunction or a wrapper of one)."""
    fn = kernel
    while not hasattr(fn, "arg_names") and hasattr(fn, "fn"):
        fn = fn.fn
    if "PDL" not in getattr(fn, "arg_names", ()) or not enabled():
        return {}
    return {"PDL": True, "launch_pdl": True}
