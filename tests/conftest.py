"""Test-wide setup.

Without a GPU every Triton kernel runs under the interpreter: TRITON_INTERPRET must be set before
any kernel module is imported (triton.jit reads it at decoration time), so it is set here.
NINFER_AOT_STRICT=1 makes a failed ahead-of-time binary compile an error (children inherit it).
Tests marked `gpu` need CUDA and are skipped on CPU-only machines (CI); they run on the GPU machine.
Under the interpreter, `_fast_interpreter_lang_patching` removes a repeated scan Triton makes per
jit call (speed only; see its docstring).
"""

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# One torch thread per core: an xdist worker gets its share of the cores (itself and the processes
# it starts, through OMP_NUM_THREADS). Two workers each running two-thread torch ops on two cores
# spin-wait on each other: the CPU path's small ops run ~10x slower oversubscribed.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    os.environ["OMP_NUM_THREADS"] = str(_threads)
    torch.set_num_threads(_threads)
# a compile that builds kernel binaries (a child without TRITON_INTERPRET, or any compile on the
# GPU machine) fails the test when they fail, instead of writing a source-only plan (codegen/aot.py)
os.environ.setdefault("NINFER_AOT_STRICT", "1")


def _fast_interpreter_lang_patching() -> None:
    """Test-suite speed only (the kernels compute exactly what they did): under TRITON_INTERPRET,
    Triton's interpreter re-patches `triton.language` on every kernel launch AND on every nested
    @triton.jit helper call (`InterpretedFunction.__call__` -> `_patch_lang`), each time scanning the
    language modules with `inspect.getmembers` (dir + getattr of every member + sort): about a quarter
    of an interpreted extent's time. The builtin names of those modules are fixed after import, so
    they are listed once here (before any kernel ran: nothing is patched yet) and `_patch_builtin`
    re-reads just those names, each still checked with `is_builtin` as the original does: the same
    attributes are patched, with the same wrappers, in the same order; a package already scanned
    since the last restore is not scanned again (below). A module or class not listed here, or a
    Triton without these internals, keeps the original code path. Measured on the tiny K = 3 plan
    (2 cores): ~28% less CPU per interpreted extent, the same tokens."""
    try:
        import inspect

        import triton.language as tl
        from triton.runtime import interpreter as ti
    except Exception:  # noqa: BLE001 -- no Triton: nothing to speed up
        return
    orig = getattr(ti, "_patch_builtin", None)
    patch_attr = getattr(ti, "_patch_attr", None)
    is_builtin = getattr(getattr(tl, "core", None), "is_builtin", None)
    if orig is None or patch_attr is None or is_builtin is None or getattr(orig, "_ninfer_listed", False):
        return
    try:
        if list(inspect.signature(orig).parameters) != ["pkg", "builder", "scope"]:
            return
    except (TypeError, ValueError):
        return
    pkgs = [tl, tl.core, tl.tensor, getattr(tl, "math", None), getattr(tl.core, "tensor_descriptor_base", None)]
    names = {id(p): (p, [n for n, m in inspect.getmembers(p) if is_builtin(m)]) for p in pkgs if p is not None}

    # A scan patches every builtin it finds, and only `_LangPatchScope.restore` (the end of a
    # launch) puts builtins back: until the next restore, a listed package scanned again (every
    # nested helper call re-patches) has none left, so that scan is skipped
    scope_cls = getattr(ti, "_LangPatchScope", None)
    if scope_cls is None or not callable(getattr(scope_cls, "restore", None)):
        return
    generation = [0]
    scanned: dict[int, int] = {}  # id(package) -> generation of its last scan
    orig_restore = scope_cls.restore

    def restore(self):
        generation[0] += 1
        return orig_restore(self)

    def _patch_builtin(pkg, builder, scope):
        listed = names.get(id(pkg))
        if listed is None or listed[0] is not pkg:
            return orig(pkg, builder, scope)
        if scanned.get(id(pkg)) == generation[0]:
            return None
        for name in listed[1]:
            member = getattr(pkg, name, None)
            if is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)
        scanned[id(pkg)] = generation[0]
        return None

    _patch_builtin._ninfer_listed = True
    scope_cls.restore = restore
    ti._patch_builtin = _patch_builtin

    # `_get_np_dtype` rebuilds its 19-entry dtype table on every call (hundreds of thousands of
    # calls per extent): the same lookup, the table's answers remembered per Triton dtype
    get_np = getattr(ti, "_get_np_dtype", None)
    if get_np is None or not hasattr(tl, "pointer_type") or not hasattr(tl, "block_type"):
        return
    seen: dict = {}

    def _get_np_dtype(tt_dtype):
        key = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(key, tl.pointer_type):
            return get_np(tt_dtype)
        try:
            return seen[key]
        except KeyError:
            seen[key] = v = get_np(key)  # raises for a dtype the table lacks, as before
            return v
        except TypeError:  # unhashable: not a table key
            return get_np(tt_dtype)

    ti._get_np_dtype = _get_np_dtype


if os.environ.get("TRITON_INTERPRET") == "1":
    _fast_interpreter_lang_patching()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# The names of the failed tests, once more after pytest's last line: on a CI box pytest prints every
# failure's whole message in its short summary (no truncation there), so a long assertion diff can push
# the test names out of a log that is read from its end.
_FAILED: list[str] = []


def pytest_runtest_logreport(report):
    if report.failed and not hasattr(report, "wasxfail"):
        crash = getattr(report.longrepr, "reprcrash", None)
        first = (getattr(crash, "message", "") or "").strip().splitlines()[:1]
        _FAILED.append(f"{report.nodeid} ({report.when}): {first[0][:160] if first else ''}")


def pytest_unconfigure(config):
    if _FAILED and not hasattr(config, "workerinput"):  # the xdist controller (or a plain run) only
        lines = [f"failed ({len(_FAILED)}):", *(f"  {x}" for x in _FAILED)]
        print("\n".join(lines), file=sys.stderr, flush=True)


@pytest.fixture(autouse=True)
def _signal_mask_unchanged():
    """A test must leave the worker's signal mask as it found it: a leaked block of SIGINT/SIGTERM
    is inherited by every process the worker starts later, whose signal tests then fail far from
    the cause (the CI box, stop 25). The mask is restored and the leaking test fails here."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    after = signal.pthread_sigmask(signal.SIG_SETMASK, before)
    assert after == before, (f"the test changed the signal mask: left blocked {sorted(s.name for s in after - before)}, "
                             f"left unblocked {sorted(s.name for s in before - after)}")


@pytest.fixture(scope="session")
def tiny_trained_bf16(tmp_path_factory):
    """examples/tiny-trained (it has the MTP head) packed bf16 once per session (quality.support.pack),
    shared read-only by the serve and speculative tests that compile their own plans from it."""
    from quality import support as QS

    return QS.pack(tmp_path_factory.mktemp("tiny_trained") / "tiny-trained-bf16.ninfer", "bf16")

