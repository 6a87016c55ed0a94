"""The compiler's binary cache (ninfer_compile/codegen/binary_cache.py and its use in codegen/aot.py).

The store itself is tested directly (fast, no Triton compile); the key's link to what Triton
compiles (source, constexprs, num_warps, sm) and to the toolchain (Triton and ptxas versions,
through replaced version providers) in one child process compiling a one-line kernel; the CLI
with the tiny model through the shared `aot` fixture (conftest.py), whose second compile comes
from the cache.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ninfer_compile.codegen import binary_cache as bc

from .aot_support import REPO, aot_env, compile_child


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


KEY = "ab" * 32


def test_entry_roundtrip_hit_and_miss(tmp_path):
    c = bc.BinaryCache(tmp_path / "c")
    assert c.get("bin-v1", KEY) is None and (c.hits, c.misses) == (0, 1)
    members = {"k.json": b'{"name": "k"}', "k.cubin": b"\x7fELF" + bytes(range(256))}
    assert c.put("bin-v1", KEY, members)
    path = tmp_path / "c" / "bin-v1" / KEY[:2] / KEY
    assert path.is_file() and [p.name for p in path.parent.iterdir()] == [KEY]  # no temp file left
    assert c.get("bin-v1", KEY) == members and c.hits == 1
    other = "cd" * 32
    assert c.get("bin-v1", other) is None  # another key: a miss
    assert c.put_json("results-v1", other, {"a": [1, 2]}) and c.get_json("results-v1", other) == {"a": [1, 2]}
    with pytest.raises(ValueError):
        c.path("bin-v1", "../../etc/passwd")


@pytest.mark.parametrize("damage", ["flip", "truncate", "append", "header", "other-key"])
def test_damaged_entry_is_never_used_and_is_rebuilt(tmp_path, damage):
    c = bc.BinaryCache(tmp_path)
    members = {"k.json": b"{}", "k.cubin": b"\x7fELF" * 100}
    c.put("bin-v1", KEY, members)
    p = c.path("bin-v1", KEY)
    raw = p.read_bytes()
    if damage == "flip":
        raw = raw[:-10] + bytes([raw[-10] ^ 1]) + raw[-9:]
    elif damage == "truncate":
        raw = raw[:-1]
    elif damage == "append":
        raw = raw + b"x"
    elif damage == "header":
        raw = raw.replace(b'"members"', b'"memberz"')
    else:  # a whole entry filed under the wrong key
        raw = bc.pack("cd" * 32, members)
    p.write_bytes(raw)
    assert c.get("bin-v1", KEY) is None and c.damaged == 1 and not p.exists()
    assert c.put("bin-v1", KEY, members) and c.get("bin-v1", KEY) == members


def _writer(root: str, n: int, payload: bytes, out) -> None:
    c = bc.BinaryCache(root)
    bad = 0
    for i in range(n):
        c.put("bin-v1", KEY, {"k.cubin": payload})
        got = c.get("bin-v1", KEY)
        bad += got is not None and got != {"k.cubin": payload}
        if i % 7 == 0:  # a concurrent "eviction": the others must see whole entries or none
            try:
                os.unlink(c.path("bin-v1", KEY))
            except FileNotFoundError:
                pass
    out.put((bad, c.damaged))


def test_concurrent_writers_and_readers_see_whole_entries(tmp_path):
    payload = os.urandom(1 << 20)  # large enough that a torn write would be visible
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), 25, payload, q)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert results == [(0, 0)] * 3  # never a wrong or damaged entry
    c = bc.BinaryCache(tmp_path)
    c.put("bin-v1", KEY, {"k.cubin": payload})
    assert c.get("bin-v1", KEY) == {"k.cubin": payload}
    assert not [p for p in tmp_path.rglob(".tmp-*")]


def test_size_cap_evicts_least_recently_used(tmp_path):
    c = bc.BinaryCache(tmp_path, max_bytes=10_000)
    keys = [f"{i:02x}" * 32 for i in range(8)]
    for i, k in enumerate(keys):
        c.put("bin-v1", k, {"b": bytes(2000)})
        os.utime(c.path("bin-v1", k), (1000 + i, 1000 + i))  # written in order, oldest first
    fresh = bc.BinaryCache(tmp_path, max_bytes=10_000)  # another compile: nothing of its own yet
    assert fresh.get("bin-v1", keys[0]) is not None  # read: now the most recently used
    assert fresh.size() > 10_000
    deleted = fresh.trim()
    left = {k for k in keys if fresh.path("bin-v1", k).exists()}
    assert fresh.size() <= 10_000 * bc.TRIM_TO and deleted == len(keys) - len(left)
    assert keys[0] in left and keys[1] not in left and keys[-1] in left
    assert bc.BinaryCache(tmp_path, max_bytes=10_000).trim() == 0  # under the cap: nothing deleted


def test_key_changes_with_every_identity_part(monkeypatch):
    base = bc.identity(90)
    k0 = bc.kernel_key("TRITONKEY", "k.json", base)
    assert bc.kernel_key("TRITONKEY", "k.json", bc.identity(90)) == k0  # stable
    assert bc.kernel_key("OTHERKEY", "k.json", base) != k0
    assert bc.kernel_key("TRITONKEY", "j.json", base) != k0
    assert bc.kernel_key("TRITONKEY", "k.json", bc.identity(89)) != k0
    for name, value in [("triton_version", lambda: "0.0.0-test"), ("triton_build", lambda: "f" * 64),
                        ("ptxas_version", lambda sm: "release 0.1"), ("backend_hash", lambda sm: "e" * 64),
                        ("cache_env", lambda: {"TRITON_TEST_ENV": "1"}), ("triton_install", lambda: "/elsewhere")]:
        with monkeypatch.context() as m:
            m.setattr(bc, name, value)
            assert bc.kernel_key("TRITONKEY", "k.json", bc.identity(90)) != k0, name


def test_result_key_is_one_digest_of_every_input_and_takes_the_plan_text():
    """The whole-result key is binary_cache.digest of the inputs (the format the cache's existing
    results-v1 / columns-v1 entries were stored under), with or without the caller's plan text
    (aot_keys.plan_json: a compile serialises its plan once for its two keys)."""
    from types import SimpleNamespace

    from ninfer_compile.codegen import aot_keys

    cache = SimpleNamespace(identity=lambda sm: {"sm": sm, "triton": "test"})
    plan = {"extents": {"prefill_t16": {"t": 16, "launches": [{"route": "r\u00e9", "scale": 0.5}]}},
            "options": {"kv_dtype": "bf16", "column_specialization": False}, "notes": [None, True, 3]}
    files = {"kernels/a.py": "x = 1\n", "kernels/manifest.json": "{}\n"}
    objects = {"w": SimpleNamespace(shape=(2, 3)), "b": (1, 2)}
    key = aot_keys.result_key(plan, files, objects, 90, cache)
    assert key == bc.digest({**aot_keys._process_context(90, cache), "what": "result", "plan": plan,
                             "kernel_files": aot_keys._file_digests(files),
                             "objects": bc.digest(sorted((n, repr(o)) for n, o in objects.items()))})
    assert aot_keys.result_key(plan, files, objects, 90, cache, aot_keys.plan_json(plan)) == key
    other = {**plan, "options": {**plan["options"], "kv_dtype": "int8"}}
    assert aot_keys.result_key(other, files, objects, 90, cache) != key
    assert aot_keys.result_key(plan, files, objects, 90, cache, aot_keys.plan_json(other)) != key  # the text decides


def test_default_dir_and_sizes(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert bc.default_dir() == tmp_path / "ninfer-compile"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert bc.default_dir() == Path.home() / ".cache" / "ninfer-compile"
    assert bc.parse_size("2G") == 2 << 30 and bc.parse_size("500MiB") == 500 << 20 and bc.parse_size("1000") == 1000
    for bad in ("-1", "0", "lots", "nan"):
        with pytest.raises(ValueError, match="--cache-size"):
            bc.parse_size(bad)


def test_cli_flags_choose_the_cache(aot, tmp_path, monkeypatch, capsys):
    """--no-cache: no cache handed to the binary compile; --cache-dir / --cache-size: that one;
    default: $XDG_CACHE_HOME/ninfer-compile; a bad --cache-size is one error line."""
    from ninfer_compile.cli import main
    from ninfer_compile.codegen import aot as A

    seen = []

    def record(plan, files, objects, sm, progress=None, cache=None, plan_text=None):
        seen.append(cache)
        return A.disabled("recorded")

    monkeypatch.setattr(A, "precompile", record)
    common = ["--sm", "90", "--prefill-chunk", "16", "--concurrency", "1", "--max-context", "64", "--quiet"]
    art = str(aot["artifact"])
    assert main([art, "-o", str(tmp_path / "1.plan"), *common, "--no-cache"]) == 0
    assert main([art, "-o", str(tmp_path / "2.plan"), *common, "--cache-dir", str(tmp_path / "cd"),
                 "--cache-size", "1G"]) == 0
    assert main([art, "-o", str(tmp_path / "3.plan"), *common]) == 0
    assert seen[0] is None
    assert seen[1].root == tmp_path / "cd" and seen[1].max_bytes == 1 << 30
    assert seen[2].root == Path(os.environ["XDG_CACHE_HOME"]) / "ninfer-compile"
    assert seen[2].max_bytes == bc.DEFAULT_MAX_BYTES
    capsys.readouterr()
    assert main([art, "-o", str(tmp_path / "4.plan"), *common, "--cache-size", "huge"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: --cache-size must be")
    assert not (tmp_path / "cd").exists() and not (tmp_path / "4.plan").exists()


def _progress(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("binaries ")]


def test_repeat_compile_comes_from_the_cache_with_the_same_bytes(aot):
    n = json.loads((aot["plan"] / "kernels" / "manifest.json").read_text())["binaries"]["entries"]
    first, again = _progress(aot["stderr"]), _progress(aot["stderr_again"])
    assert first[-1] == f"binaries {n}/{n} (0 cached)", first
    assert again == [f"binaries {n}/{n} ({n} cached)"], again
    a, b = _tree(aot["plan"]), _tree(aot["again"])
    assert sorted(a) == sorted(b) and [k for k in a if a[k] != b[k]] == []
    entries = list((aot["cache"] / "bin-v1").rglob("*"))
    assert len([p for p in entries if p.is_file()]) == n
    assert len([p for p in (aot["cache"] / "results-v1").rglob("*") if p.is_file()]) == 1


def test_damaged_cache_entry_is_rebuilt_and_the_plan_is_still_right(aot, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(aot["cache"], cache)
    victim = sorted(p for p in (cache / "bin-v1").rglob("*") if p.is_file())[0]
    raw = bytearray(victim.read_bytes())
    raw[-100] ^= 0xFF  # inside the cubin
    victim.write_bytes(bytes(raw))
    out = tmp_path / "c.plan"
    p = compile_child(aot["artifact"], out, aot_env(tmp_path / "user"), "--cache-dir", str(cache))
    assert p.returncode == 0, p.stderr[-3000:]
    n = json.loads((out / "kernels" / "manifest.json").read_text())["binaries"]["entries"]
    assert _progress(p.stderr)[-1] == f"binaries {n}/{n} ({n - 1} cached)", p.stderr[-2000:]
    a, c = _tree(aot["plan"]), _tree(out)
    assert sorted(a) == sorted(c) and [k for k in a if a[k] != c[k]] == []
    assert bc.BinaryCache(cache).get("bin-v1", victim.name) is not None  # rebuilt, whole again


_KEY_PARTS = r'''
import importlib.util, json, sys, tempfile
from pathlib import Path
from ninfer_compile.codegen import binary_cache as bc
from ninfer_compile.codegen.aot_binaries import ACTIVE, store_manager_class
from ninfer_compile.codegen.aot_device import environment

work = Path(sys.argv[1])
SRC = """import triton
import triton.language as tl

@triton.jit
def k(x, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x + i, tl.load(x + i) + {inc})
"""

def kernel(inc):
    f = work / f"k{inc}.py"
    f.write_text(SRC.format(inc=inc))
    spec = importlib.util.spec_from_file_location(f"k{inc}", f)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m.k

def build(inc=1, block=16, warps=4, sm=90):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cache = bc.BinaryCache(work / "cache")
    ACTIVE.update(cache=cache, identity=cache.identity(sm), probe=False, restored=set())
    with environment(sm, tempfile.mkdtemp(dir=work), None, store_manager_class()):
        src = ASTSource(kernel(inc), {"x": "*fp32", "BLOCK": "constexpr"}, {(1,): block})
        ck = triton.compile(src, target=GPUTarget("cuda", sm, 32), options={"num_warps": warps})
    group = dict(ck.metadata_group)
    meta = next(c for c in group if c.endswith(".json"))
    members = {c: Path(p).read_bytes() for c, p in group.items() if c.endswith((".json", ".cubin"))}
    hit = bool(ACTIVE["restored"])
    if not hit:
        cache.put("bin-v1", bc.kernel_key(Path(group[meta]).parent.name, meta, ACTIVE["identity"]), members)
    return {"hit": hit, "cubin": members[meta[:-5] + ".cubin"].hex()[:64] + str(len(members[meta[:-5] + ".cubin"]))}

out = {}
out["first"] = build()
out["again"] = build()
out["source"] = build(inc=2)
out["constexpr"] = build(block=32)
out["num_warps"] = build(warps=8)
out["sm"] = build(sm=89)
real = bc.triton_version
bc.triton_version = lambda: "0.0.0-test"
out["triton_version"] = build()
bc.triton_version = real
real = bc.ptxas_version
bc.ptxas_version = lambda sm: "release 0.1"
out["ptxas_version"] = build()
bc.ptxas_version = real
out["last"] = build()
print(json.dumps(out))
'''


def test_triton_compiles_miss_on_each_key_part(tmp_path):
    """A one-line kernel compiled through the cache-backed Triton cache manager: the same inputs
    hit (same bytes); another source, constexpr, num_warps, sm, Triton version or ptxas version
    misses."""
    env = aot_env(tmp_path / "user")
    p = subprocess.run([sys.executable, "-c", _KEY_PARTS, str(tmp_path)], capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["first"]["hit"] is False and out["again"] == {**out["first"], "hit": True}
    for part in ("source", "constexpr", "num_warps", "sm", "triton_version", "ptxas_version"):
        assert out[part]["hit"] is False, part
    assert out["last"]["hit"] is True and out["last"]["cubin"] == out["first"]["cubin"]
    assert out["triton_version"]["cubin"] == out["first"]["cubin"]  # rebuilt: same compiler, same bytes
