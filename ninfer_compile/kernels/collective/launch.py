"""Launchers of the collectives: torch.distributed over the process group the runtime bound to the
launch's `group` argument (None: a one-rank plan, a copy). Preallocated operands, no allocation on
the hot path, return None. On an NCCL group the collective is an NCCL kernel on the current stream,
so decode / verify extents stay CUDA graphs (torch captures NCCL collectives); on gloo (CPU) it is a
host call.

all_reduce_nccl(x [T, H] bf16, out [T, H] bf16, group): out = sum over ranks of x (in place on out).
all_gather_nccl(x [R, N/G] bf16, out [R, N] bf16, group, workspace): out[:, g-th block] = x of rank g;
the workspace (float32 elements, R*N/2: the gathered blocks rank-major as bf16) holds the
all_gather_into_tensor result before the one strided copy into out's column blocks.
all_argmax_nccl(x [R, N/G] bf16, ids [R] i32, group, workspace, vocab_begin): ids = the argmax of the
whole rows (ties: the lowest id); the only exchange is the ranks' (max, id) pairs, 2 float32 per row
(`argmax_workspace_numel`: the pairs, the gathered pairs and the picks, laid out by `_argmax_views`).
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


def argmax_workspace_numel(R: int, ranks: int) -> int:
    """float32 elements all_argmax_nccl needs for R rows over `ranks` ranks (see _argmax_views)."""
    return 2 * R + 2 * R + 2 * R + 2 * R * ranks + R + (R + 1) // 2


def _argmax_views(workspace, R: int, g: int):
    """The workspace as (local index i64 [R], rank index i64 [R], pairs f32 [R, 2], gathered f32
    [g * R, 2], picked id f32 [R], local max bf16 [R]); the int64 parts first (8-byte aligned)."""
    import torch

    w = workspace.view(-1)
    local_at, rank_at = w[0:2 * R].view(torch.int64), w[2 * R:4 * R].view(torch.int64)
    pairs = w[4 * R:6 * R].view(R, 2)
    gathered = w[6 * R:6 * R + 2 * g * R].view(g * R, 2)
    o = 6 * R + 2 * g * R
    picked = w[o:o + R]
    local_max = w[o + R:o + R + (R + 1) // 2].view(torch.bfloat16)[:R]
    return local_at, rank_at, pairs, gathered, picked, local_max


def all_argmax_nccl(x, ids, group=None, workspace=None, vocab_begin=0) -> None:
    import torch

    g = _size(group)
    R, _ = x.shape
    if tuple(ids.shape) != (R,) or ids.dtype != torch.int32:
        raise RouteError(f"all_argmax: ids{tuple(ids.shape)} {ids.dtype} must be [{R}] int32 for x{tuple(x.shape)}")
    need = argmax_workspace_numel(R, g)
    if workspace is None or workspace.numel() < need or workspace.dtype != torch.float32:
        raise RouteError(f"all_argmax: needs a float32 workspace of {need} elements")
    local_at, rank_at, pairs, gathered, picked, local_max = _argmax_views(workspace, R, g)
    torch.max(x, dim=1, out=(local_max, local_at))  # the first index of the row's maximum
    pairs[:, 0].copy_(local_max)
    pairs[:, 1].copy_(local_at)
    pairs[:, 1].add_(float(vocab_begin))
    if g == 1:
        ids.copy_(pairs[:, 1])
        return
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(gathered, pairs, group=group)  # rank-major: [g * R, 2]
    by_rank = gathered.view(g, R, 2)
    # the first rank holding the row's maximum: ranks hold the vocabulary in order, so the lowest id
    torch.max(by_rank[:, :, 0], dim=0, out=(picked, rank_at))
    torch.gather(by_rank[:, :, 1], 0, rank_at.view(1, R), out=picked.view(1, R))
    ids.copy_(picked)
