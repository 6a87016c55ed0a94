"""The capture's shortcuts give the plan a full capture gives (ninfer_compile/codegen/aot_capture.py):
launch kinds (a prefill's tail column counts bind one launch of each kind) and remembered launches
(`LaunchMemo`, the binary cache's launch-v1 entries). Each compile runs in a child without
TRITON_INTERPRET over a copy of the `aot` fixture's binary cache, so no kernel is compiled."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from .aot_support import COMPILE_ARGS, REPO, SM, aot_env, compile_child

# every launch its own kind: every column binds every launch (the capture before launch kinds)
_EVERY_LAUNCH = """import sys
from ninfer_compile.codegen import aot_capture

aot_capture.launch_classes = lambda runner, bound, AotTensor: {i: [] for i, b in enumerate(bound) if b.route is not None}
from ninfer_compile.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _cache_copy(aot, dest: Path, launches: bool = True) -> Path:
    shutil.copytree(aot["cache"], dest)
    if not launches:
        shutil.rmtree(dest / "launch-v1", ignore_errors=True)
    return dest


def test_launch_kinds_capture_what_binding_every_launch_captures(aot, tmp_path):
    """A compile whose tail columns bind every launch (launch kinds off) writes the same plan, byte
    for byte (the bin manifest's launch counts and first uses included), as the fixture's."""
    cache = _cache_copy(aot, tmp_path / "cache", launches=False)
    out = tmp_path / "every.plan"
    # an extra NINFER_ variable: the whole-result entry of the fixture's compile does not apply
    env = aot_env(tmp_path / "user-cache", NINFER_CAPTURE_TEST="every-launch")
    p = subprocess.run([sys.executable, "-c", _EVERY_LAUNCH, str(aot["artifact"]), "--sm", str(SM), "-o", str(out),
                        *COMPILE_ARGS, "--cache-dir", str(cache), "--quiet"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "binaries 0/" not in p.stderr
    assert _tree(out) == _tree(aot["plan"])


def test_remembered_launches_give_the_plan_a_full_capture_gives(aot, tmp_path):
    """Another context: with the launches the fixture's compiles remembered, and without them, the
    plans are the same bytes; the compile stores the launches it reproduced."""
    remembered = _cache_copy(aot, tmp_path / "remembered")
    assert any((remembered / "launch-v1").rglob("*")), "the fixture's compile remembered no launch"
    fresh = _cache_copy(aot, tmp_path / "fresh", launches=False)
    env = aot_env(tmp_path / "user-cache")
    plans = []
    for name, cache in (("with.plan", remembered), ("without.plan", fresh)):
        out = tmp_path / name
        p = compile_child(aot["artifact"], out, env, "--max-context", "48", "--cache-dir", str(cache))
        assert p.returncode == 0, p.stderr[-3000:]
        plans.append(_tree(out))
    assert plans[0] == plans[1]
    assert b'"max_context": 48' in plans[0]["plan.json"]
    assert any((fresh / "launch-v1").rglob("*"))
