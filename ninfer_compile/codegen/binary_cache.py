"""The compiler's content-addressed binary cache: kernel binaries (and whole binary-compile results)
kept between `ninfer-compile` runs in a user cache directory.

Layout (`root` = --cache-dir, else $XDG_CACHE_HOME/ninfer-compile, else ~/.cache/ninfer-compile):
  root/bin-v1/<k[:2]>/<k>       one kernel binary: Triton's metadata (.json) and .cubin
  root/results-v1/<k[:2]>/<k>   one binary-compile result: kernels/bin/manifest.json minus the bytes
  root/columns-v1/<k[:2]>/<k>   one column-count discovery (codegen/column_specialization.py): the parameters
                                left unspecialised (aot.column_parameters), keyed like a result
  root/launch-v1/<k[:2]>/<k>    one reproduced launch: the kernels its launcher launched, specialised
                                (codegen/aot_capture.py's LaunchMemo)
Every entry is ONE immutable file: a magic line, a JSON header naming each member with its size
and sha256, then the members' bytes. It is written to a temporary name in its directory and
renamed into place (atomic on POSIX), so a reader sees either no entry or a whole one, and two
compiles writing the same key write the same bytes (the last rename wins). A reader checks every
member's size and sha256 (and the key recorded in the header): a damaged entry is deleted and
counted as a miss, so it is rebuilt, never used. Reading an entry bumps its mtime; `trim()` deletes
the least recently used entries until the cache is under its size cap (default 2 GiB).

Keys (`kernel_key`): everything that decides a binary's bytes. Triton's own cache key (the
kernel's source and its callees' source, constexprs, the specialisation, num_warps / num_stages and
every other compile option, the backend (ptxas version + arch), Triton's build and the
cache-invalidating environment) is the directory name Triton gives the kernel; `identity(sm)`
adds, explicitly, the target sm, Triton's version and build digest, the ptxas version, the
cache-relevant environment and Triton's install directory (Triton records library paths in the
metadata and the cubins' line info, so a binary built by another installation differs in bytes).

Plans never point into the cache: codegen/aot.py copies the bytes into the plan, which seals and
verifies them as before (kernels/bin/manifest.json, sha256 per file).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

STORE_FORMAT = "ninfer-binary-cache-v1"
MAGIC = b"ninfer-cache-entry-v1\n"
KINDS = ("bin-v1", "results-v1", "launch-v1", "columns-v1")
DEFAULT_MAX_BYTES = 2 << 30  # 2 GiB
TRIM_TO = 0.8  # trim() deletes down to this fraction of the cap
STALE_TMP_S = 3600  # temporary files older than this are leftovers of killed compiles


def default_dir() -> Path:
    """$XDG_CACHE_HOME/ninfer-compile, else ~/.cache/ninfer-compile."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "ninfer-compile"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- identity providers
# (module-level functions so that tests can replace each one)


def triton_version() -> str:
    import triton

    return str(triton.__version__)


def triton_build() -> str:
    """sha256 of Triton's cache salt (its version, sources and libtriton), '' if unavailable."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        try:
            from triton.compiler.compiler import triton_key
        except ImportError:
            return ""
    return _sha256(triton_key().encode("utf-8"))


def ptxas_version(sm: int) -> str:
    """The `release` line of `ptxas --version` for the sm ('' if unavailable)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas_version

        try:
            ver = get_ptxas_version(sm)
        except TypeError:  # older Triton: one ptxas for every arch
            ver = get_ptxas_version()
        return next((ln.strip() for ln in ver.splitlines() if "release" in ln), ver.strip()[:120])
    except Exception:  # noqa: BLE001
        return ""


def backend_hash(sm: int) -> str:
    """sha256 of the CUDA backend's cache hash for sm (ptxas version + arch), '' if unavailable."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend

        return _sha256(make_backend(GPUTarget("cuda", int(sm), 32)).hash().encode("utf-8"))
    except Exception:  # noqa: BLE001
        return ""


def cache_env() -> dict[str, str]:
    """Triton's cache-invalidating environment variables as set in this process."""
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        return {str(k): str(v) for k, v in sorted(get_cache_invalidating_env_vars().items())}
    except Exception:  # noqa: BLE001
        return {}


def triton_install() -> str:
    import triton

    return os.path.dirname(os.path.abspath(triton.__file__))  # as Triton records it (not resolved)


def identity(sm: int) -> dict[str, Any]:
    """The toolchain facts every key includes (see the module docstring)."""
    return {"sm": int(sm), "triton": triton_version(), "triton_build": triton_build(),
            "ptxas": ptxas_version(sm), "backend": backend_hash(sm), "env": cache_env(),
            "triton_dir": triton_install()}


def canonical_json(obj: Any) -> str:
    """The JSON `digest` hashes: sorted keys, compact, unknown objects by str."""
    return json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))


def digest(obj: Any) -> str:
    """sha256 of a JSON value (`canonical_json`)."""
    return _sha256(canonical_json(obj).encode("utf-8"))


def kernel_key(triton_dir_key: str, filename: str, ident: Mapping[str, Any]) -> str:
    """The store key of one kernel binary: Triton's cache directory name for it, its metadata file
    name and the toolchain identity."""
    return digest({"format": STORE_FORMAT, "what": "kernel", "triton_key": triton_dir_key, "file": filename,
                   "identity": dict(ident)})


# ----------------------------------------------------------------------------- the store


def pack(key: str, members: Mapping[str, bytes]) -> bytes:
    names = sorted(members)
    header = {"key": key, "members": [[n, len(members[n]), _sha256(members[n])] for n in names]}
    return MAGIC + json.dumps(header, sort_keys=True).encode("utf-8") + b"\n" + b"".join(members[n] for n in names)


def unpack(key: str, raw: bytes) -> dict[str, bytes] | None:
    """The members of an entry file, or None when it is damaged (any check fails)."""
    if not raw.startswith(MAGIC):
        return None
    nl = raw.find(b"\n", len(MAGIC))
    if nl < 0:
        return None
    try:
        header = json.loads(raw[len(MAGIC):nl])
        members = header["members"]
        if header.get("key") != key or not isinstance(members, list):
            return None
        out, pos = {}, nl + 1
        for name, size, sha in members:
            data = raw[pos:pos + int(size)]
            if len(data) != int(size) or _sha256(data) != sha or not isinstance(name, str):
                return None
            out[name] = data
            pos += int(size)
    except (ValueError, TypeError, KeyError):
        return None
    return out if pos == len(raw) else None


class BinaryCache:
    """A size-bounded store of immutable entries under `root` (see the module docstring).
    Counters: hits, misses, damaged (deleted on read), written."""

    def __init__(self, root: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        self.hits = self.misses = self.damaged = self.written = 0
        self.used: set[Path] = set()  # entries read or written by this process (trim keeps them)
        self._ident: dict[int, dict] = {}

    def identity(self, sm: int) -> dict[str, Any]:
        if sm not in self._ident:
            self._ident[sm] = identity(sm)
        return self._ident[sm]

    def path(self, kind: str, key: str) -> Path:
        if kind not in KINDS or len(key) < 8 or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"bad cache entry {kind}/{key}")
        return self.root / kind / key[:2] / key

    def get(self, kind: str, key: str) -> dict[str, bytes] | None:
        p = self.path(kind, key)
        try:
            with open(p, "rb") as f:
                raw = f.read()
        except OSError:
            self.misses += 1
            return None
        out = unpack(key, raw)
        if out is None:  # damaged: never used; removed so the rebuilt entry replaces it
            self.damaged += 1
            self.misses += 1
            try:
                os.unlink(p)
            except OSError:
                pass
            return None
        self.hits += 1
        self.used.add(p)
        try:
            os.utime(p)  # least recently used first out
        except OSError:
            pass
        return out

    def put(self, kind: str, key: str, members: Mapping[str, bytes]) -> bool:
        """Write an entry (atomically; an existing one is left alone). False when it cannot be
        written (a read-only or full disk): the cache is an optimisation, never an error."""
        p = self.path(kind, key)
        self.used.add(p)
        if p.exists():
            return True
        tmp = p.parent / f".tmp-{os.getpid()}-{uuid.uuid4().hex}"
        try:
            try:
                f = open(tmp, "wb")
            except FileNotFoundError:  # the entry's directory is made on first use
                p.parent.mkdir(parents=True, exist_ok=True)
                f = open(tmp, "wb")
            with f:
                f.write(pack(key, members))
            os.replace(tmp, p)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False
        self.written += 1
        return True

    def get_json(self, kind: str, key: str) -> Any:
        got = self.get(kind, key)
        if got is None or "value.json" not in got:
            return None
        try:
            return json.loads(got["value.json"])
        except ValueError:
            return None

    def put_json(self, kind: str, key: str, value: Any) -> bool:
        return self.put(kind, key, {"value.json": json.dumps(value, sort_keys=True).encode("utf-8")})

    def entries(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every entry; stale temporary files are removed on the way."""
        out = []
        now = time.time()
        for kind in KINDS:
            base = self.root / kind
            if not base.is_dir():
                continue
            for sub in base.iterdir():
                if not sub.is_dir():
                    continue
                for p in sub.iterdir():
                    try:
                        st = p.stat()
                    except OSError:
                        continue
                    if p.name.startswith(".tmp-"):
                        if now - st.st_mtime > STALE_TMP_S:
                            try:
                                p.unlink()
                            except OSError:
                                pass
                        continue
                    out.append((st.st_mtime, st.st_size, p))
        return out

    def size(self) -> int:
        return sum(s for _, s, _ in self.entries())

    def trim(self) -> int:
        """Delete least recently used entries (never one this process used) until the cache is
        under TRIM_TO of its cap, when it is over the cap. Returns the number deleted."""
        ents = self.entries()
        total = sum(s for _, s, _ in ents)
        if total <= self.max_bytes:
            return 0
        n = 0
        for _, size, p in sorted(ents, key=lambda e: (e[0], str(e[2]))):
            if total <= self.max_bytes * TRIM_TO:
                break
            if p in self.used:
                continue
            try:
                p.unlink()
            except OSError:
                continue
            total -= size
            n += 1
        return n


def parse_size(text: str) -> int:
    """--cache-size: bytes from `2G`, `500M`, `64k` or a plain number of bytes (binary units)."""
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    num = t[:-1] if mult != 1 else t
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"--cache-size must be a size like 2G, 500M or 1000000, got {text!r}") from None
    if not value > 0 or value != value:
        raise ValueError(f"--cache-size must be > 0, got {text!r}")
    return int(value * mult)


def open_cache(cache_dir: str | os.PathLike | None = None, max_bytes: int | None = None) -> BinaryCache:
    """The cache at `cache_dir` (default: `default_dir()`)."""
    return BinaryCache(Path(cache_dir) if cache_dir is not None else default_dir(),
                       DEFAULT_MAX_BYTES if max_bytes is None else max_bytes)
