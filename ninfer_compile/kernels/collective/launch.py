"""Launchers of the collectives: torch.distributed over the process group the runtime bound to the
launch's `group` argument (None: a one-rank plan, a copy). Preallocated operands, no allocation on
the hot path, return None. On an NCCL group the collective is an NCCL kernel on the current stream,
so decode / verify extents stay CUDA graphs (torch captures NCCL collectives); on gloo (CPU) it is a
host call.

all_reduce_nccl(x [T, H] bf16, out [T, H] bf16, group): out = sum over ranks of x (in place on out).
all_gather_nccl(x [R, N/G] bf16, out [R, N] bf16, group, workspace): out[:, g-th block] = x of rank g;
the workspace (float32 elements, R*N/2: the gathered blocks rank-major as bf16) holds the
all_gather_into_tensor result before the one strided copy into out's column blocks.
"""

from __future__ import annotations

from ninfer_compile.errors import RouteError


def _size(group) -> int:
    if group is None:
        return 1
    import torch.distributed as dist

    return dist.get_world_size(group)


def all_reduce_nccl(x, out, group=None) -> None:
    if tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype:
        raise RouteError(f"all_reduce: out{tuple(out.shape)} {out.dtype} must match x{tuple(x.shape)} {x.dtype}")
    if out.data_ptr() != x.data_ptr():
        out.copy_(x)
    if _size(group) > 1:
        import torch.distributed as dist

        if not out.is_contiguous():
            raise RouteError(f"all_reduce: out{tuple(out.shape)} must be contiguous")
        dist.all_reduce(out, group=group)


def all_gather_nccl(x, out, group=None, workspace=None) -> None:
    g = _size(group)
    R, n = x.shape
    if tuple(out.shape) != (R, n * g) or out.dtype != x.dtype:
        raise RouteError(f"all_gather: out{tuple(out.shape)} must be [{R}, {n * g}] {x.dtype} for x{tuple(x.shape)} "
                         f"over {g} rank(s)")
    if g == 1:
        out.copy_(x)
        return
    import torch.distributed as dist

    need = (R * n * g + 1) // 2
    if workspace is None or workspace.numel() < need:
        raise RouteError(f"all_gather: needs a workspace of {need} float32 elements")
    buf = workspace.view(-1)[:need].view(x.dtype)[: R * n * g].view(g * R, n)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # (newer torch's name)
    gather(buf, x.contiguous(), group=group)  # rank-major: [g * R, n]
    out.view(R, g, n).copy_(buf.view(g, R, n).permute(1, 0, 2))
