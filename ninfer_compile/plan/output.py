"""Where the compiler may write, and the crash-safe swap of a directory into place.

Rules (docs/ARCHITECTURE.md, "Output paths and the plan swap"):

- An existing destination is replaced only if ninfer-compile wrote it: a plan (its plan.json says
  `format: ninfer-plan-v1`, `compiler.name: ninfer-compile`, and the directory holds nothing but
  the plan's own entries) or an IR dump (it holds the marker file `DUMP_MARKER`). Anything else —
  a file, a symbolic link, any other directory, `/`, the home directory, the current directory or
  one above it, a directory holding an input (artifact, route table, contract) — is refused with
  one line, before any work, and nothing is touched.
- The parent must exist and be writable: proven by creating (and removing) a temporary directory
  there before compiling.
- The new tree is written into `.NAME.tmp-PID-XXXX` beside the destination and swapped in with one
  atomic exchange (`renameat2(RENAME_EXCHANGE)`, Linux) or, where that is unsupported, two renames
  (`NAME -> .NAME.old-PID-XXXX`, tmp -> NAME) with SIGINT/SIGTERM blocked in between. At every
  instant a complete tree is at NAME or (between the two renames) at the `.old-` path.
- `prepare_destination` → `recover_leftovers` (run by every compile to NAME before it starts) removes `.NAME.tmp-*` and
  `.NAME.old-*` left by processes that are no longer alive and, when NAME is missing, first renames
  the newest complete `.old-` tree back to NAME.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import CompileError
from ..interrupts import deferred

PLAN_FORMAT = "ninfer-plan-v1"  # = plan.manifest.PLAN_FORMAT (not imported: this module stays light)
PLAN_COMPILER = "ninfer-compile"
# Top-level entries of a plan directory. A plan directory holding anything else has files someone
# else put there: it is not replaced. Keep in step with plan/writer.py.
PLAN_ENTRIES = frozenset({"plan.json", "memory.txt", "kernels"})
DUMP_MARKER = ".ninfer-ir-dump"
DUMP_MARKER_TEXT = "written by ninfer-compile --dump-ir; this directory is replaced by the next dump\n"
_PLAN_JSON_LIMIT = 256 << 20  # a plan.json larger than this is not read to decide ownership


def plan_problem(path: Path) -> str | None:
    """Why the existing directory `path` is not a plan that ninfer-compile may replace (None: it is)."""
    manifest = path / "plan.json"
    try:
        if not manifest.is_file() or manifest.is_symlink():
            return "has no plan.json"
        if manifest.stat().st_size > _PLAN_JSON_LIMIT:
            return "has a plan.json too large to be a plan"
        doc = json.loads(manifest.read_bytes())
    except (OSError, ValueError, RecursionError):
        return "has a plan.json that is not a readable JSON manifest"
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT or \
            not isinstance(doc.get("compiler"), dict) or doc["compiler"].get("name") != PLAN_COMPILER:
        return f"has a plan.json that is not a {PLAN_COMPILER} manifest ({PLAN_FORMAT})"
    try:
        extra = sorted(set(os.listdir(path)) - PLAN_ENTRIES)
    except OSError as exc:
        return f"cannot be listed ({exc.strerror or exc})"
    if extra:
        return f"holds {extra[0]!r}, which is not part of a plan"
    return None


def dump_problem(path: Path) -> str | None:
    """Why the existing directory `path` is not an IR dump that ninfer-compile may replace."""
    marker = path / DUMP_MARKER
    if not marker.is_file() or marker.is_symlink():
        return f"has no {DUMP_MARKER} marker (it was not written by ninfer-compile --dump-ir)"
    return None


def _inside(a: Path, b: Path) -> bool:
    """a is b or below b (both resolved)."""
    return a == b or b in a.parents


def check_destination(dest: Path, *, flag: str, what: str, problem: Callable[[Path], str | None],
                      inputs: Iterable[Path | str | None] = ()) -> None:
    """Refuse (CompileError, one line naming `flag`) any destination that may not be written.
    Touches nothing. `what`: "plan" or "IR dump"; `problem`: plan_problem or dump_problem."""
    dest = Path(dest)
    head = f"{flag} {dest}"
    real = Path(os.path.realpath(dest))
    protected = {Path("/"): "the root directory", Path(os.path.realpath(Path.cwd())): "the current directory"}
    home = os.path.expanduser("~")
    if home and home != "~":
        protected.setdefault(Path(os.path.realpath(home)), "the home directory")
    for p, name in protected.items():
        if _inside(p, real):
            raise CompileError(f"{head}: is {name} or holds it; refusing to replace it")
    for inp in inputs:
        if inp is None:
            continue
        if _inside(Path(os.path.realpath(inp)), real):
            raise CompileError(f"{head}: holds the input {inp}; refusing to replace it")
    if dest.name in ("", ".", ".."):
        raise CompileError(f"{head}: not a usable {what} directory name")
    parent = dest.parent if str(dest.parent) else Path(".")
    if not parent.is_dir():
        raise CompileError(f"{head}: parent directory {parent} does not exist or is not a directory")
    if dest.is_symlink():
        raise CompileError(f"{head}: is a symbolic link; give the directory itself")
    if dest.exists():
        if not dest.is_dir():
            raise CompileError(f"{head}: exists and is not a directory; refusing to replace it")
        why = problem(dest)
        if why is not None:
            raise CompileError(f"{head}: exists and is not a {what} written by ninfer-compile ({why}); "
                               f"refusing to replace it (remove it yourself or choose another path)")


def prepare_destination(dest: Path, *, flag: str, problem: Callable[[Path], str | None]) -> list[str]:
    """After check_destination accepted every output: clean the leftovers of interrupted swaps to
    `dest` (restoring a plan a kill left under `.old-`) and prove the parent writable by creating a
    temp directory there (CompileError naming `flag` if it cannot). Returns notes for the user (a
    restored plan), one line each."""
    dest = Path(dest)
    parent = dest.parent if str(dest.parent) else Path(".")
    notes = [n for n in recover_leftovers(dest, problem) if not n.startswith("removed ")]
    try:
        probe = make_temp_dir(dest)
        os.rmdir(probe)
    except OSError as exc:
        raise CompileError(f"{flag} {dest}: cannot write in {parent}: {exc.strerror or exc}") from None
    return notes


# ----------------------------------------------------------------------------- leftovers


def _leftover_re(name: str) -> re.Pattern:
    return re.compile(r"\." + re.escape(name) + r"\.(tmp|old)-(\d+)-[A-Za-z0-9_]+")


def pid_alive(pid: int) -> bool:
    """Whether process `pid` is running (a zombie counts as dead; another user's as alive)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    try:  # a zombie (exited, not yet reaped) is dead for our purpose
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2:][:1] != "Z"
    except (OSError, ValueError):
        return True


def recover_leftovers(dest: Path, problem: Callable[[Path], str | None]) -> list[str]:
    """Clean `.NAME.tmp-PID-*` / `.NAME.old-PID-*` of dead processes beside `dest`; when `dest` is
    missing, first restore the newest complete `.old-` tree (one `problem` accepts). Leftovers of
    live processes (a compile running now) are left alone. Returns what was done, one line each."""
    dest = Path(dest)
    parent = dest.parent if str(dest.parent) else Path(".")
    pattern = _leftover_re(dest.name)
    found: list[tuple[str, Path]] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    for n in sorted(names):
        m = pattern.fullmatch(n)
        p = parent / n
        if m and not pid_alive(int(m.group(2))) and p.is_dir() and not p.is_symlink():
            found.append((m.group(1), p))
    done = []
    if not dest.exists() and not dest.is_symlink():
        olds = [p for kind, p in found if kind == "old" and problem(p) is None]
        if olds:
            newest = max(olds, key=lambda p: p.stat().st_mtime_ns)
            try:
                os.rename(newest, dest)
            except OSError as exc:  # left where it is; the compile's own write reports the directory
                done.append(f"could not restore {dest} from {newest.name}: {exc.strerror or exc}")
                return done
            done.append(f"restored {dest} from {newest.name}")
            found = [(k, p) for k, p in found if p != newest]
    for _, p in found:
        shutil.rmtree(p, ignore_errors=True)
        done.append(f"removed {p.name}")
    return done


# ----------------------------------------------------------------------------- the swap


def make_temp_dir(dest: Path, kind: str = "tmp") -> Path:
    """A fresh `.NAME.<kind>-PID-XXXX` directory beside `dest`."""
    dest = Path(dest)
    parent = dest.parent if str(dest.parent) else Path(".")
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.{kind}-{os.getpid()}-", dir=parent))


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two existing paths (Linux renameat2). False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(a))


# test hook: force the two-rename path (filesystems without RENAME_EXCHANGE)
USE_EXCHANGE = True


def swap_into_place(tmp: Path, dest: Path) -> None:
    """Put the complete tree `tmp` at `dest`, replacing what is there (the caller checked that it
    may). Afterwards the previous tree is removed — also when a signal that arrived during the swap
    is raised at its end; if that removal is cut short (SIGKILL), the next compile to `dest`
    removes the leftover."""
    tmp, dest = Path(tmp), Path(dest)
    os.chmod(tmp, 0o755)
    # SIGINT/SIGTERM wait until both renames and the previous tree's removal are done (a signal
    # another thread took has its handler run in this thread at some later bytecode: outside the
    # section it could cut the removal short)
    with deferred():
        old = None
        if os.path.lexists(dest):
            if USE_EXCHANGE and _exchange(tmp, dest):
                old = tmp  # now holds the previous tree, under a tmp- name of this (live) process
            else:
                old = make_temp_dir(dest, "old")
                os.rmdir(old)
                os.rename(dest, old)
                try:
                    os.rename(tmp, dest)
                except BaseException:
                    os.rename(old, dest)
                    raise
        else:
            os.rename(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
