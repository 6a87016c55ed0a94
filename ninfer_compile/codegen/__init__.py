"""Code generation: emission of the plan's kernel package (`emit.py`) and its ahead-of-time
binaries (`aot.py`)."""

from .emit import EmitError, emit_kernels, kernel_files, launches_from_manifest  # noqa: F401
