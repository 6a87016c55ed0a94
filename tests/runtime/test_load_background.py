"""The kernel binaries' setup beside the weight upload (device.py `KernelSetup`) and the warm-up
decision (graphs.py `warmup_needed`), on the CPU with small fakes: an error found in the background
thread surfaces from the load as the same one-line error, a load failing in the main thread joins
the thread and releases what it registered, no thread outlives a load, the background phases are
reported as such, and the warm-up runs exactly when the binaries leave something to load."""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from ninfer_runtime import triton_cache as tc
from ninfer_runtime.device import KernelSetup, TorchDevice
from ninfer_runtime.errors import PlanMismatch
from ninfer_runtime.graphs import warmup_needed
from ninfer_runtime.loader import Engine

THREAD = "ninfer-kernel-setup"


def _setup_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD]


def _synthetic_bin_dir(d: Path, *, damaged: bool) -> tuple[dict, dict]:
    """A plan's kernels/bin with one entry, as the compiler records it (plan, kernels manifest);
    `damaged`: the cubin's bytes differ from its recorded sha256. The toolchain digests are fixed
    strings (the tests patch this process's to match or not)."""
    import triton

    entry_dir = d / "kernels" / "bin" / "KEY"
    entry_dir.mkdir(parents=True)
    cubin = b"\x7fELF cubin bytes"
    (entry_dir / "k.cubin").write_bytes(cubin + (b"!" if damaged else b""))
    man = {"format": tc.BIN_FORMAT, "triton": triton.__version__, "sm": 90, "triton_key": "a" * 64,
           "backend": "b" * 64, "env": tc.cache_env(),
           "entries": [{"dir": "KEY", "name": "k", "kernel": "m:k", "specialization": "{}",
                        "files": {"k.cubin": hashlib.sha256(cubin).hexdigest()}}]}
    raw = json.dumps(man).encode()
    (d / "kernels" / "bin" / "manifest.json").write_bytes(raw)
    summary = {"status": "ok", "triton": triton.__version__, "sm": 90, "dir": "kernels/bin",
               "manifest_sha256": hashlib.sha256(raw).hexdigest()}
    return {"sm": 90}, {"binaries": summary, "files": {}}


@pytest.fixture()
def same_toolchain(monkeypatch):
    monkeypatch.setattr(tc, "triton_build_digest", lambda: "a" * 64)
    monkeypatch.setattr(tc, "backend_digest", lambda sm: "b" * 64)


def test_damaged_binary_found_in_the_background_is_one_line(tmp_path, same_toolchain):
    plan, km = _synthetic_bin_dir(tmp_path, damaged=True)
    dirs, interval = list(tc._DIRS), sys.getswitchinterval()
    setup = KernelSetup(lambda: tc.binaries_for(tmp_path, plan, km), background=True)
    with pytest.raises(PlanMismatch, match=r"k\.cubin: kernel binary is damaged") as e:
        setup.join()
    assert "\n" not in str(e.value)
    assert _setup_threads() == [] and tc._DIRS == dirs and sys.getswitchinterval() == interval


def test_another_triton_build_in_the_background_falls_back_to_jit(tmp_path, monkeypatch, same_toolchain):
    plan, km = _synthetic_bin_dir(tmp_path, damaged=False)
    monkeypatch.setattr(tc, "triton_build_digest", lambda: "0" * 64)
    binaries, note = KernelSetup(lambda: tc.binaries_for(tmp_path, plan, km), background=True).join()
    assert binaries is None and "another build of triton" in note and "\n" not in note
    assert _setup_threads() == []


class FakeBinaries:
    """What the loader uses of `PlanBinaries`: phases, complete(), note(), release()."""

    def __init__(self, complete: bool):
        self._complete = complete
        self.phases = {"check": 0.25, "check_triton": 0.2, "hash": 0.125, "preload": 0.0625, "module_load": 0.5}
        self.released = 0

    def complete(self) -> bool:
        return self._complete

    def note(self) -> str:
        return "kernels: precompiled binaries (fake): 1/1 loaded from the plan, 0 JIT-compiled"

    def release(self) -> None:
        self.released += 1


class BackgroundCpu(TorchDevice):
    """The CPU's torch path, with the GPU's background kernel setup running `work` in its thread,
    and (`warm`) the GPU's warm-up decision."""

    def __init__(self, work, *, warm: bool = False):
        super().__init__("cpu", interpreting=lambda: False)
        self.work, self.warm = work, warm

    def start_kernel_binaries(self, source, package):
        return KernelSetup(self.work, background=True)


def test_engine_raises_the_background_error_and_leaves_no_thread(tiny_plan, tmp_path, same_toolchain):
    art, plan_dir = tiny_plan
    plan, km = _synthetic_bin_dir(tmp_path, damaged=True)
    dirs = list(tc._DIRS)
    dev = BackgroundCpu(lambda: tc.binaries_for(tmp_path, plan, km))
    with pytest.raises(PlanMismatch, match=r"k\.cubin: kernel binary is damaged") as e:
        Engine(plan_dir, art, device=dev, progress=False)
    assert "\n" not in str(e.value)
    assert _setup_threads() == [] and tc._DIRS == dirs


def test_engine_failing_during_the_upload_joins_and_releases(tiny_plan):
    art, plan_dir = tiny_plan
    failed, fake = threading.Event(), FakeBinaries(complete=True)

    def work():  # still running when the main thread fails: it finishes, then is released
        assert failed.wait(30)
        return fake, "kernels: fake"

    error = PlanMismatch("upload: the device refused the copy")

    class FailingUpload(BackgroundCpu):
        def upload(self, read, nbytes):
            failed.set()
            raise error

    with pytest.raises(PlanMismatch, match="the device refused the copy"):
        Engine(plan_dir, art, device=FailingUpload(work), progress=False)
    assert fake.released == 1 and _setup_threads() == []


@pytest.mark.parametrize("complete", [True, False])
def test_engine_reports_background_phases_and_skips_the_warmup_when_nothing_is_left(tiny_plan, complete):
    art, plan_dir = tiny_plan
    fake = FakeBinaries(complete=complete)
    with Engine(plan_dir, art, device=BackgroundCpu(lambda: (fake, "kernels: fake"), warm=True),
                progress=False) as eng:
        assert eng.warmed is (not complete)
        ph = eng.load_phases
        assert {"hash (bg)", "check_triton (bg)", "module_load (bg)", "kernels (bg)", "kernels_wait",
                "binding", "warmup", "capture"} <= set(ph) and "hash" not in ph
        assert ph["hash (bg)"] == 0.125
        assert ("no warm-up run" in eng.device_note) is complete
        assert set(eng.load_times) == {"upload", "kernels", "capture", "total"}
        assert _setup_threads() == []
    assert fake.released == 1


def test_cpu_load_keeps_its_inline_path(tiny_plan):
    art, plan_dir = tiny_plan
    with Engine(plan_dir, art, device="cpu", progress=False) as eng:
        assert eng.warmed is False and eng.binaries is None
        assert not any(k.endswith(" (bg)") for k in eng.load_phases) and "kernels_wait" not in eng.load_phases


def _engine(*, warm=True, world=1, binaries=None):
    tp = None if world is None else SimpleNamespace(world=world)
    return SimpleNamespace(backend=SimpleNamespace(warm=warm), tp=tp, binaries=binaries)


def test_warmup_decision():
    done, left = FakeBinaries(complete=True), FakeBinaries(complete=False)
    assert warmup_needed(_engine(binaries=done)) is False
    assert warmup_needed(_engine(world=None, binaries=done)) is False
    assert warmup_needed(_engine(binaries=left)) is True
    assert warmup_needed(_engine(binaries=None)) is True  # JIT from source
    assert warmup_needed(_engine(world=2, binaries=done)) is True  # --tp: the ranks' collectives in step
    assert warmup_needed(_engine(warm=False, binaries=None)) is False  # the CPU paths


class FakeKernel:
    def __init__(self, fails: bool):
        self.fails, self.loaded = fails, False

    def _init_handles(self):
        if self.fails:
            raise RuntimeError("cuModuleLoadData failed")
        self.loaded = True


def _preloaded(n_entries=2, n=2, fails=(), **kw) -> tc.PlanBinaries:
    b = tc.PlanBinaries(Path("bin"), {"entries": [{"kernel": f"m:k{i}"} for i in range(n_entries)]}, **kw)
    b.preloaded = n
    b.kernels = [FakeKernel(i in fails) for i in range(n)]
    b.load_modules()
    return b


def test_plan_binaries_complete():
    b = _preloaded()
    assert b.complete() and all(k.loaded for k in b.kernels) and "module_load" in b.phases
    assert not _preloaded(fails=(1,)).complete() and _preloaded(fails=(1,)).load_errors == 1
    assert not _preloaded(n=1).complete()  # an entry not preloaded
    assert not _preloaded(partial=True).complete()  # the compiler could not build every kernel
    assert not _preloaded(n_entries=0, n=0).complete()
    stale = _preloaded()
    stale.stale.append("m:k1: NotInPlan")
    assert not stale.complete()


def test_short_switch_intervals_nest_in_any_order():
    """The kernel setup's and the weight stream's shorter switch intervals (switch_interval.py):
    the shortest holds while any holder does; the last release brings back the interval from
    before; an interval someone else set meanwhile is the one that comes back."""
    from ninfer_runtime.switch_interval import ShortSwitchInterval

    base = sys.getswitchinterval()

    def now(x):
        return abs(sys.getswitchinterval() - x) < 1e-7

    a, b = ShortSwitchInterval(0.0005), ShortSwitchInterval(0.0002)
    try:
        a.acquire()
        assert now(0.0005)
        b.acquire()
        assert now(0.0002)
        a.release()  # not in reverse order
        assert now(0.0002)
        b.release()
        b.release()  # idempotent
        assert now(base)
        a.acquire()
        sys.setswitchinterval(0.01)
        a.release()
        assert now(0.01)
    finally:
        sys.setswitchinterval(base)
