"""`interpreting()`: whether the kernels run under the Triton interpreter (`TRITON_INTERPRET` set
and not `0`), read at each call (the runtime may set it just before importing triton).

The one copy for the route library: launchers use it to pick interpreter-safe variants (f32 dots,
no inline asm, no `maxnreg`), pdl.py to switch PDL off. A leaf module (imports only `os`), so it is
emitted into every plan's kernels package with the launchers that import it. The runtime keeps a
one-line copy in loader.py only because it decides the mode before the plan's package (and with it
triton) is imported.
"""

from __future__ import annotations

import os

__all__ = ["interpreting"]


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
