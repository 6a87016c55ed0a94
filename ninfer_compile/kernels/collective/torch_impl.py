"""CPU path of the collectives (the launchers' arguments; gloo or any torch.distributed backend):
the same calls as the launchers, which need no Triton."""

from __future__ import annotations

from .launch import all_gather_nccl, all_reduce_nccl

__all__ = ["all_reduce", "all_gather"]


def all_reduce(x, out, group=None, workspace=None, **params) -> None:
    """out[T, H] = the sum of x over the ranks of `group` (None: one rank, a copy)."""
    all_reduce_nccl(x, out, group)


def all_gather(x, out, group=None, workspace=None, **params) -> None:
    """out[R, N] = the ranks' x [R, N/G] column blocks in rank order."""
    all_gather_nccl(x, out, group, workspace)
