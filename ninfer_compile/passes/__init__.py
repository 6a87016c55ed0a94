"""Compiler passes (one per file, each a pure `Graph -> Graph`); the order is `pipeline.PIPELINE`."""
