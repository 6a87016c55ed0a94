"""Route registration of the collectives (torch.distributed; no Triton kernel of our own)."""

from ninfer_compile.kernels.registry import Route, RouteDomain, register

_M = "ninfer_compile.kernels.collective"


def gather_workspace(view, params) -> int:
    """float32 elements of all_gather's staging buffer: the gathered [G, R, N/G] bf16 blocks."""
    R, N = view.shape("out", out=True)
    return (R * N + 1) // 2


def argmax_workspace(view, params) -> int:
    """float32 elements of all_argmax's pairs, gathered pairs and picks (launch.argmax_workspace_numel)."""
    from .launch import argmax_workspace_numel

    return argmax_workspace_numel(view.shape("x")[0], int(view.attr("ranks", 1)))


register(Route(
    name="all_reduce_nccl", family="all_reduce", domain=RouteDomain(max_t=None), params={},
    reference=f"{_M}.reference:all_reduce", launcher=f"{_M}.launch:all_reduce_nccl", kernels=(),
    doc="torch.distributed.all_reduce (sum, in place on out) over the bound group: NCCL on the GPU "
        "(capturable in a CUDA graph), gloo on the CPU path",
))
register(Route(
    name="all_gather_nccl", family="all_gather", domain=RouteDomain(max_t=None), params={},
    reference=f"{_M}.reference:all_gather", launcher=f"{_M}.launch:all_gather_nccl", kernels=(),
    workspace=f"{_M}.routes:gather_workspace",
    doc="torch.distributed.all_gather_into_tensor into the workspace, then one strided copy into the "
        "ranks' column blocks of out",
))
register(Route(
    name="all_argmax_nccl", family="all_argmax", domain=RouteDomain(max_t=None), params={},
    reference=f"{_M}.reference:all_argmax", launcher=f"{_M}.launch:all_argmax_nccl", kernels=(),
    workspace=f"{_M}.routes:argmax_workspace",
    doc="torch.max over the rank's columns, one all_gather_into_tensor of the (max, id) pairs, the "
        "first rank's maximum: the greedy token of the whole row",
))
