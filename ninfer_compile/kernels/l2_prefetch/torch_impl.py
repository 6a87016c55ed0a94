"""CPU path of `l2_prefetch`: nothing to do (the CPU has no L2 stream to start ahead)."""


def l2_prefetch(after=None, weight=None, workspace=None, **params) -> None:
    """No-op: the hint exists for the GPU's weight stream only."""
    return None
