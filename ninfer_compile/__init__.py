"""ninfer-compile: a declarative compiler from NInfer v1 artifacts to fused Triton plans."""

__version__ = "0.1.0"
