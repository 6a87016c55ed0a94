"""Shapes of the sampling launch, shared by the launcher and the family spec (no imports: it is
emitted into plans with the launcher)."""

BLOCK = 4096  # logits per program of the block kernels
PARAM_DTYPES = {"temperature": "f32", "top_k": "i32", "top_p": "f32", "seed": "i32", "sample_pos": "i32"}


def block(V: int) -> int:
    """Logits per program of the block kernels for a vocabulary of V."""
    return min(BLOCK, max(64, 1 << max(0, int(V) - 1).bit_length()))


def workspace_elems(R: int, V: int) -> int:
    """float32 elements: partials A and B [R, NB, 2] each, then the row records [R, 2] (tau, argmax)."""
    nb = -(-int(V) // block(V))
    return int(R) * (4 * nb + 2)
