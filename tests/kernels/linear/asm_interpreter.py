"""Run a linear kernel's inline-PTX path under the Triton interpreter (test helper).

The interpreter refuses `tl.inline_asm_elementwise`; `emulated_inline_asm()` (a context manager)
replaces its `create_inline_asm` with an emulation: the one-instruction loads / stores of ptx.py
(`LD_*`, `ST_*`) read and write the interpreter's memory at the given addresses, the fence is a
no-op (programs run one after another), and every other asm block (dequant, mma) runs through the
bit-level warp emulator (ptx_emulator.emulate_warp) once per warp, with lane (g, c) = element
[w, g, c] of the [NW, 8, 4] operands: the lane map the kernels assume on the GPU. So the kernel's
own indexing, loops, column blocks, epilogues and split-K run for real on the CPU, with the PTX
executed as the emulator reads it.
"""

from __future__ import annotations

import contextlib

import numpy as np
import triton.language as tl
from triton.runtime import interpreter as I

from ninfer_compile.kernels.linear import ptx
from ptx_emulator import emulate_warp

_interp = I._interpreter


class _Results:
    def __init__(self, handles):
        self.handles = handles

    def get_result(self, i):
        return self.handles[i]


def _np_dtype(ty):
    return I._get_np_dtype(ty.scalar if hasattr(ty, "scalar") else ty)


def _load(addr, dtype):
    a = np.ascontiguousarray(addr).astype(np.uint64)
    return _interp.load(a, np.ones(a.shape, bool), np.zeros(a.shape, dtype), dtype)


def _emulate(asm, constraints, values, types, is_pure, pack):
    n_out = sum(1 for c in constraints.split(",") if c.startswith("="))
    arrs = [np.asarray(v.data) for v in values]
    shape = np.broadcast_shapes(*(a.shape for a in arrs))
    arrs = [np.broadcast_to(a, shape) for a in arrs]
    out_np = [_np_dtype(t) for t in types]

    def result(*cols):
        return _Results([I.TensorHandle(np.ascontiguousarray(c).view(d).reshape(shape), t.scalar)
                         for c, d, t in zip(cols, out_np, types)])

    if asm in (ptx.LD_W, ptx.LD_W_L2, ptx.LD_X):
        a = arrs[0]
        return result(*[_load(a + 4 * i, np.int32) for i in range(4)])
    if asm == ptx.LD_1:
        return result(_load(arrs[0], np.int32))
    if asm == ptx.LD_2:
        return result(_load(arrs[0], np.int32), _load(arrs[0] + 4, np.int32))
    if asm == ptx.LD_F16:
        return result(_load(arrs[0], np.float16).astype(np.float32))
    if asm == ptx.LD_BF16:
        h = _load(arrs[0], np.uint16).astype(np.uint32) << 16
        return result(h.view(np.float32))
    if asm in (ptx.ST_16, ptx.ST_32):
        addr, pred, val = arrs
        mask = np.ascontiguousarray(pred != 0)
        a = np.ascontiguousarray(addr).astype(np.uint64)
        if asm == ptx.ST_16:
            v = (np.ascontiguousarray(val).view(np.uint32) & 0xFFFF).astype(np.uint16)
        else:
            v = np.ascontiguousarray(val).view(np.uint32).copy()
        _interp.store(a, v, mask)
        return result(np.zeros(shape, np.int32))
    if asm.startswith("fence."):
        return result(np.ascontiguousarray(arrs[0]))
    # a warp-level block: emulate each warp of the [NW, 8, 4] operands (lane = 4 g + c)
    assert len(shape) == 3 and shape[1:] == (8, 4), f"asm on a {shape} tensor: not the mma lane layout"
    bits = [np.ascontiguousarray(a).view(np.uint32) if a.dtype.itemsize == 4 else a.astype(np.uint32)
            for a in arrs]
    outs = [np.zeros(shape, np.uint32) for _ in range(n_out)]
    for w in range(shape[0]):
        lanes = [[0] * n_out + [int(b[w, g, c]) for b in bits] for g in range(8) for c in range(4)]
        regs = emulate_warp(asm, lanes)
        for lane, r in enumerate(regs):
            g, c = lane // 4, lane % 4
            for i in range(n_out):
                outs[i][w, g, c] = r[f"${i}"] & 0xFFFFFFFF
    return result(*outs)


@contextlib.contextmanager
def emulated_inline_asm():
    old = I.InterpreterBuilder.create_inline_asm
    I.InterpreterBuilder.create_inline_asm = lambda self, *a: _emulate(*a)
    try:
        yield
    finally:
        I.InterpreterBuilder.create_inline_asm = old


__all__ = ["emulated_inline_asm", "tl"]
