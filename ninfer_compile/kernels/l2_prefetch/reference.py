"""Reference of `l2_prefetch`: a cache hint has no value; the op computes nothing."""


def l2_prefetch(after=None, weight=None, **_attrs) -> None:
    """after: [T, ...] (ordering only), weight: [N, K]. Returns None (no output)."""
    return None
