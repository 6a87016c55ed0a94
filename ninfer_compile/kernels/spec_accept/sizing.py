"""Workspace of the spec_accept launch, shared by the launcher and the route's sizing hook (no
imports of torch / triton: pure arithmetic, light enough for the compiler's memory plan)."""

from ..sampling.sizing import block


def workspace_elems(T: int, V: int) -> int:
    """float32 elements for logits [T, V]: partials A [T, NB, 2] (block max, index), partials B
    [T, NB, 3] (Gumbel max, its index, the kept mass), then the column records [T, 2] (tau, argmax)."""
    nb = -(-int(V) // block(V))
    return int(T) * (5 * nb + 2)


def workspace_numel(view, params) -> int:
    """`Route.workspace` hook of spec_accept_rows: view is the op's OpView."""
    T, V = view.shape("logits")[:2]
    return workspace_elems(T, V)
