"""Launchers for the linear routes.

Convention (docs/ARCHITECTURE.md): every tensor is preallocated by the caller; launchers never
allocate device memory and return None.

    <route>(x, weight, out, *, residual=None, epilogue="none", workspace=None, <route params>)

(the route's params each by its own name, e.g. `BLOCK_N=16, SPLIT_K=2`; `launch(route, ...,
params={...})` is the same call by route name).

- x: bf16 [T, K] (unit stride along K); weight: QuantWeight (row-split planes, maybe a row view)
  or bf16 [N, K]; out: bf16 [T, N_out] (N_out = N/2 for swiglu, else N); residual: [T, N_out]
  (may alias out); workspace: fp32 with >= `workspace_numel(...)` elements when SPLIT_K > 1.
- `linear_workspace_numel(route, T, N, K, epilogue, params)` (from routes.py, re-exported): the
  route-aware sizing (float32 elements; N = weight rows), the same arithmetic as the routes'
  `Route.workspace` hooks (routes.py `splitk_workspace` / `dequant_gemm_workspace`), which the
  compiler writes into the plan. The `<f>_dequant_gemm` routes' launchers live in
  `dequant_gemm.py` (which re-exports the same function); `launch(...)` forwards them there.
- T outside the route's declared domain, a format / epilogue the route does not declare, an
  undeclared param value, or mismatched shapes raise `RouteError` naming the route.
"""

from __future__ import annotations

import torch
import triton

from ...errors import RouteError
from .epilogue import EPI_CODES, splitk_reduce_kernel
from .gemv import qlinear_gemv_kernel
from .mma import qlinear_mma_kernel
from .routes import LINEAR_ROUTES, linear_workspace_numel  # noqa: F401  (re-exported for direct callers)
from .weights import QuantWeight, as_linear_weight
from ..pdl import pdl_launch
from ..interpret import interpreting  # noqa: F401  (gemv_lowreg / dequant_gemm import it from here)

# routes whose launcher lives in another module of this family (e.g. dequant_gemm.py)
_HERE = __name__.rpartition(".")[2]
_LOCAL = tuple(n for n, r in LINEAR_ROUTES.items() if r.launcher.partition(":")[0].rpartition(".")[2] == _HERE)
__all__ = ["launch", "workspace_numel", "linear_workspace_numel", "asm_supported"] + sorted(_LOCAL)

_FMT_CODE = {"Q4G64_F16S": 4, "Q5G64_F16S": 5, "Q6G64_F16S": 6, "W8G32_F16S": 8, "BF16": 16}
_ASM_CACHE: dict = {}


def asm_supported(device: torch.device) -> bool:
    """Inline PTX (USE_ASM) is usable: a CUDA sm_90+ device and not the Triton interpreter."""
    if interpreting():
        return False
    if device.type != "cuda":
        return False
    key = device.index
    if key not in _ASM_CACHE:
        _ASM_CACHE[key] = torch.cuda.get_device_capability(device) >= (9, 0)
    return _ASM_CACHE[key]


def registry_domain_max(route_name: str):
    """max_t of a linear route's declared domain (None = unbounded)."""
    return LINEAR_ROUTES[route_name].domain.max_t


def workspace_numel(t: int, n_out: int, epilogue: str, split_k: int) -> int:
    """fp32 elements of the split-K workspace ([SPLIT_K, T, N_out or 2 N_out])."""
    if split_k <= 1:
        return 0
    return split_k * t * n_out * (2 if epilogue == "swiglu" else 1)


def _check_2d(name, t, rows, cols, tensor, route):
    if tensor.dtype != torch.bfloat16 or tensor.dim() != 2 or tuple(tensor.shape) != (rows, cols) \
            or tensor.stride(1) != 1:
        raise RouteError(f"route {route}: {name} must be bf16 [{rows}, {cols}] with unit column stride, "
                         f"got {tensor.dtype} {list(tensor.shape)} strides {list(tensor.stride())}")


def check_call(route, x, weight, out, epilogue, residual, params):
    """Validate one linear call against `route`'s declared domain and the operand shapes.

    Returns (fmt, n, k, T, n_out, resolved params). Every violation is a RouteError naming the
    route: a kernel handed more columns than its domain supports must never run."""
    dom = route.domain
    fmt, n, k = as_linear_weight(weight)
    if fmt not in dom.formats:
        raise RouteError(f"route {route.name}: weight format {fmt} is not in its domain {list(dom.formats)}")
    if epilogue not in dom.epilogues:
        raise RouteError(f"route {route.name}: epilogue {epilogue!r} is not in its domain {list(dom.epilogues)}")
    if x.dim() != 2:
        raise RouteError(f"route {route.name}: x must be [T, K], got shape {list(x.shape)}")
    T = x.shape[0]
    if T < dom.min_t or (dom.max_t is not None and T > dom.max_t):
        hi = "max" if dom.max_t is None else dom.max_t
        raise RouteError(f"route {route.name}: T={T} columns is outside its domain T in [{dom.min_t}, {hi}]")
    reason = route.check_params(params or {})
    if reason:
        raise RouteError(reason if reason.startswith(f"route {route.name}") else f"route {route.name}: {reason}")
    p = route.resolve_params(params)
    if epilogue == "swiglu":
        if n % 2:
            raise RouteError(f"route {route.name}: swiglu needs an even number of weight rows, got {n}")
        n_out = n // 2
    else:
        n_out = n
    _check_2d("x", T, T, k, x, route.name)
    _check_2d("out", T, T, n_out, out, route.name)
    if epilogue == "residual":
        if residual is None:
            raise RouteError(f"route {route.name}: the residual epilogue needs a residual tensor")
        _check_2d("residual", T, T, n_out, residual, route.name)
    return fmt, n, k, T, n_out, p


def reduce_split_k(ws, out, res, T, n_out, split_k, epi) -> None:
    """Second phase of a split-K launch: sum the SPLIT_K fp32 partials in a fixed order
    (deterministic, no atomics) and apply the epilogue into `out`. No-op when SPLIT_K is 1."""
    if split_k <= 1:
        return
    block = 1024
    splitk_reduce_kernel[(triton.cdiv(T * n_out, block),)](
        ws, out, res, T, n_out, out.stride(0), res.stride(0),
        SPLIT_K=split_k, EPI=epi, BLOCK=block, INTERP=interpreting(), num_warps=4, **pdl_launch(splitk_reduce_kernel))


def splitk_workspace(route, split_k, T, n_out, epilogue, workspace, out):
    """The fp32 split-K workspace (checked), or `out` when SPLIT_K is 1 (the kernel ignores it)."""
    if split_k <= 1:
        return out
    need = workspace_numel(T, n_out, epilogue, split_k)
    if workspace is None or workspace.dtype != torch.float32 or workspace.numel() < need \
            or not workspace.is_contiguous():
        raise RouteError(f"route {route.name}: SPLIT_K={split_k} needs a contiguous fp32 workspace of "
                         f">= {need} elements")
    return workspace


def launch(route_name: str, x, weight, out, *, epilogue: str = "none", residual=None,
           workspace=None, params=None) -> None:
    route = LINEAR_ROUTES.get(route_name)
    if route is None:
        raise RouteError(f"unknown linear route {route_name!r}")
    if route_name not in _LOCAL:
        from .dequant_gemm import launch_dequant_gemm

        return launch_dequant_gemm(route_name, x, weight, out, epilogue=epilogue, residual=residual,
                                   workspace=workspace, params=params)
    fmt, n, k, T, n_out, p = check_call(route, x, weight, out, epilogue, residual, params)
    res = residual if epilogue == "residual" else out
    split_k = p["SPLIT_K"]
    ws = splitk_workspace(route, split_k, T, n_out, epilogue, workspace, out)
    code = _FMT_CODE[fmt]
    if isinstance(weight, QuantWeight):
        base, high, scale = weight.words(), weight.high_words(), weight.scales()
        lpw = 4 if code == 8 else 8
        base_row = weight.base_row_bytes // 4
        high_row = weight.high_row_bytes // 4
        scale_row = weight.groups_per_row
        kw_total = weight.k_pad // lpw
        k_loop = weight.k_pad
    else:
        base = high = scale = weight
        base_row, high_row, scale_row = weight.stride(0), 0, 0
        kw_total = triton.cdiv(k, 8)
        k_loop = k
    epi = EPI_CODES[epilogue]
    kind = route.kernels[0].rpartition(":")[2]
    if kind == "qlinear_gemv_kernel":
        lpw = 4 if code == 8 else 8
        kw = p["BLOCK_K"] // lpw
        n_iters = triton.cdiv(kw_total, kw)
        ips = triton.cdiv(n_iters, split_k)
        block_t = triton.next_power_of_2(T)
        grid = (triton.cdiv(n_out, p["BLOCK_N"]), split_k)
        use_asm = p["USE_ASM"]
        if use_asm is True and not asm_supported(x.device):
            raise RouteError(f"route {route.name}: USE_ASM=True needs a CUDA sm_90+ device outside the "
                             f"Triton interpreter")
        # the packed path reads each word's 8 activations with one 16-byte load
        x_ok = k % 8 == 0 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0
        use_asm = bool(use_asm) and code == 4 and x_ok and (use_asm is True or asm_supported(x.device))
        qlinear_gemv_kernel[grid](
            x, base, high, scale, out, res, ws,
            T, k, n_out, kw_total, base_row, high_row, scale_row, n_out,
            x.stride(0), out.stride(0), res.stride(0), ips,
            FMT=code, EPI=epi, BLOCK_N=p["BLOCK_N"], BLOCK_K=p["BLOCK_K"], BLOCK_T=block_t,
            SPLIT_K=split_k, INTERP=interpreting(), USE_ASM=use_asm,
            num_warps=p["num_warps"], num_stages=p["num_stages"], **pdl_launch(qlinear_gemv_kernel))
    else:
        use_asm = p["USE_ASM"]
        if use_asm == "auto":
            use_asm = code == 4 and asm_supported(x.device)
        elif use_asm and not asm_supported(x.device):
            raise RouteError(f"route {route.name}: USE_ASM=True needs a CUDA sm_90+ device outside the "
                             f"Triton interpreter")
        use_asm = bool(use_asm) and code == 4
        n_iters = triton.cdiv(k_loop, p["BLOCK_K"])
        ips = triton.cdiv(n_iters, split_k)
        grid = (triton.cdiv(n_out, p["BLOCK_N"]) * triton.cdiv(T, p["BLOCK_T"]), split_k)
        qlinear_mma_kernel[grid](
            x, base, high, scale, out, res, ws,
            T, k, k_loop, n_out, kw_total, base_row, high_row, scale_row, n_out,
            x.stride(0), out.stride(0), res.stride(0), ips,
            FMT=code, EPI=epi, BLOCK_N=p["BLOCK_N"], BLOCK_K=p["BLOCK_K"], BLOCK_T=p["BLOCK_T"],
            SPLIT_K=split_k, USE_ASM=use_asm, DOT_F32=interpreting(), num_warps=p["num_warps"], num_stages=p["num_stages"], **pdl_launch(qlinear_mma_kernel))
    reduce_split_k(ws, out, res, T, n_out, split_k, epi)
    return None


def named_launcher(launch_fn, name: str, doc: str):
    """The per-route launcher of a module-level `launch_fn(route_name, x, weight, out, ...)`:
    `name(x, weight, out, *, residual=None, epilogue="none", workspace=None, <each route
    param>=default)` — the family's operand / attribute names and the route's params, each by its
    own name (the plan's launch bindings). Its `__signature__` lists exactly those; an unknown
    keyword is a RouteError naming the route."""
    import inspect

    from .routes import ALL_LINEAR_ROUTES

    route = ALL_LINEAR_ROUTES[name]
    declared = tuple(route.params)

    def launcher(x, weight, out, *, residual=None, epilogue="none", workspace=None, **params):
        unknown = sorted(set(params) - set(declared))
        if unknown:
            raise RouteError(f"route {name} has no param {unknown[0]!r} (declared: {sorted(declared) or 'none'})")
        return launch_fn(name, x, weight, out, epilogue=epilogue, residual=residual,
                         workspace=workspace, params=params)

    P = inspect.Parameter
    launcher.__signature__ = inspect.Signature(
        [P(n, P.POSITIONAL_OR_KEYWORD) for n in ("x", "weight", "out")]
        + [P("residual", P.KEYWORD_ONLY, default=None), P("epilogue", P.KEYWORD_ONLY, default="none"),
           P("workspace", P.KEYWORD_ONLY, default=None)]
        + [P(k, P.KEYWORD_ONLY, default=spec.default) for k, spec in route.params.items()])
    launcher.__name__ = name
    launcher.__qualname__ = name
    launcher.__doc__ = doc
    return launcher


for _name in _LOCAL:
    globals()[_name] = named_launcher(launch, _name, f"Launch route `{_name}` ({LINEAR_ROUTES[_name].doc}).")
