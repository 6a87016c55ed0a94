"""Speculative-decoding acceptance: the verify round's token choice on the device (spec.py)."""
