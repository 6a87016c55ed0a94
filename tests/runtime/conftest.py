"""Runtime tests: put runtime/ on sys.path (until pyproject packages ninfer_runtime)."""

import sys
from pathlib import Path

_RUNTIME = str(Path(__file__).resolve().parents[2] / "runtime")
if _RUNTIME not in sys.path:
    sys.path.insert(0, _RUNTIME)
