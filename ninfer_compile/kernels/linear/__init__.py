"""Linear family: quantized (Q4/Q5/Q6/W8 row-split planes, read in place) and bf16 GEMV / GEMM
routes with fused none / swiglu / residual epilogues.

Importing this package is light (no triton): `weights` and `reference` are plain torch;
kernels and launchers live in `gemv`, `mma`, `dequant`, `epilogue`, `launch`.
"""


