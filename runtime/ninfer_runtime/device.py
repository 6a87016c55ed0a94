"""The device an `Engine` runs on, injected: how weights are uploaded, how the arena / state /
workspaces are allocated, which kernel binaries are used, whether kernels are warmed and CUDA
graphs captured.

`Engine(plan, artifact, device=..., kernels=...)` takes a torch device (a string, a `torch.device`,
or None: the GPU if there is one, else the CPU), which becomes a `TorchDevice`, or any object with
the `DeviceBackend` interface below.

Which callable runs each route launch (`DeviceBackend.kernels`, `kernel_mode`): on a GPU, always
the plan's Triton kernels ("triton"); on the CPU, the plan's torch implementations ("torch", the
default: `kernels/<family>/torch_impl.py`, copied into the plan by the compiler) or, on request,
the plan's Triton kernels under Triton's interpreter ("interpret", slow: it shows the kernels
run). The plan is the same either way: extents, launches, bindings, arena. The Engine does every device-dependent step
through it and nothing else; the real GPU path is `TorchDevice` on a CUDA device. The compiler's
ahead-of-time pass (ninfer_compile/codegen/aot_device.py) injects a fake device whose tensors have
no memory, so it binds the plan's launches exactly as a load does without a GPU.

Requires: torch (triton only for "triton" / "interpret"). Guarantees (`TorchDevice`): `check`
refuses a plan compiled for another sm (one line, PlanMismatch); `prepare_kernels` turns the
interpreter on before triton is imported ("interpret" only; "torch" never needs it);
`stream_weights` hands a GPU's whole objects to the weight stream (weight_stream.py: the one that
`prestart` began, or a new one; None with NINFER_PINNED_UPLOAD=0, or after one `note:` line when the
stream cannot start); `upload` copies one host uint8 buffer to the device: on a GPU queued through a
ring of pinned staging buffers (pinned_upload.py; the pageable copy with NINFER_PINNED_UPLOAD=0 or
when pinning fails, one `note:` line), done once `finish_uploads` returned; on the CPU no host copy;
`zeros` allocates zero-filled device memory (the caching allocator's alignment); `warm` and
`capture_graphs` are true on a CUDA device only; `start_kernel_binaries` runs the plan binaries'
check, hashing, preload and module loads in a background thread on a GPU (`KernelSetup`), inline
everywhere else.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

import torch

from .errors import PlanError, PlanMismatch
from .switch_interval import ShortSwitchInterval
from .weight_stream import pinned_upload_enabled


class DeviceBackend:
    """The protocol (documentation + defaults). Attributes: `device` (the torch.device every tensor
    of the engine reports), `warm` (run every extent once at load, so each kernel is loaded before
    use), `capture_graphs` (capture the decode extents' CUDA graphs)."""

    device: torch.device
    warm: bool = False
    capture_graphs: bool = False
    kernels: str = "triton"  # "triton" | "interpret" | "torch": what runs each route launch (kernel_mode)

    def check(self, plan: dict) -> str:
        """Refuse a plan this device cannot run (PlanMismatch); return a one-line note about how it runs."""
        raise NotImplementedError

    def prepare_kernels(self) -> None:
        """Called once before the plan's kernel package is imported (e.g. select the interpreter)."""

    def kernel_binaries(self, source, package: str) -> tuple[Any, str]:
        """(the plan's precompiled binaries, registered and preloaded for `package`, or None; a
        one-line note on how kernels are obtained). `source`: the engine's plan source
        (`binaries_dir`, `plan`, `kernels`)."""
        return None, "kernels: no binaries"

    def start_kernel_binaries(self, source, package: str) -> "KernelSetup":
        """`kernel_binaries`, started: here run at once (`KernelSetup.join()` gives its result)."""
        return KernelSetup(lambda: self.kernel_binaries(source, package), background=False)

    def stream_weights(self, artifact, names: list[str]):
        """A started `weight_stream.WeightStream` carrying the objects `names` whole from the
        artifact's file, or None: the engine uploads them one by one (`upload`)."""
        return None

    def upload(self, read: Callable[[], torch.Tensor], nbytes: int) -> torch.Tensor:
        """A 1-D uint8 device tensor of `nbytes` with the bytes of `read()` (a host uint8 tensor;
        a device that holds no data need not call it). The copy may still be queued on return:
        the bytes are there once `finish_uploads()` returned."""
        raise NotImplementedError

    def finish_uploads(self) -> None:
        """Wait until every upload's bytes are on the device (called after the last upload, before
        anything reads the weights, also when the load fails)."""

    def zeros(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """Zero-filled device memory (the arena, state buffers, workspaces)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for the device's queued work."""


# While the background setup runs beside the upload, the main thread wants the GIL back after every
# copy (it releases it while copying); with the default 5 ms switch interval each of those handbacks
# may wait 5 ms behind the setup's Python (hashing, imports). A shorter interval keeps the upload's pace.
OVERLAP_SWITCH_INTERVAL_S = 0.0005


class KernelSetup:
    """The plan's kernel binaries being obtained: `work()` -> (binaries or None, note), run at once
    (`background` False: its errors raise here) or in a daemon thread beside the weight upload.
    `join()` returns the result, or raises the thread's error (the same exception: one line);
    `abandon()` (a load failing elsewhere) joins the thread and releases any binaries it registered,
    so a failed load leaves neither a thread nor a registered plan directory. `seconds`: work's run time."""

    def __init__(self, work: Callable[[], tuple[Any, str]], *, background: bool):
        self.background = background
        self.seconds = 0.0
        self._result: tuple[Any, str] | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._switch = ShortSwitchInterval(OVERLAP_SWITCH_INTERVAL_S)  # held while overlapping
        if not background:
            t = time.perf_counter()
            self._result = work()
            self.seconds = time.perf_counter() - t
            return

        def run() -> None:
            t = time.perf_counter()
            try:
                self._result = work()
            except BaseException as exc:  # noqa: BLE001 - handed to the joining thread
                self._error = exc
            finally:
                self.seconds = time.perf_counter() - t

        self._switch.acquire()
        self._thread = threading.Thread(target=run, name="ninfer-kernel-setup", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            self._thread = None
            self._switch.release()
            raise

    def _wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._switch.release()

    def join(self) -> tuple[Any, str]:
        """(binaries or None, note); the caller owns (and releases) the binaries from here on."""
        self._wait()
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        result, self._result = self._result, None
        if result is None:
            raise RuntimeError("kernel setup: joined twice")
        return result

    def abandon(self) -> None:
        """Join, drop any error (the caller is raising its own), release binaries not handed out."""
        self._wait()
        self._error = None
        result, self._result = self._result, None
        if result is not None and result[0] is not None:
            result[0].release()


def torch_device(spec=None) -> torch.device:
    """None -> the current GPU, else the CPU; "cuda" -> the current GPU's index."""
    if spec is None:
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(spec)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


KERNEL_CHOICES = ("torch", "interpret")
KERNEL_NOTES = {"torch": "kernels: torch (CPU)", "interpret": "kernels: Triton interpreter (CPU, slow)"}


def kernel_mode(device: torch.device, kernels: str | None) -> str:
    """What runs the plan's route launches on `device`: "triton" on a GPU (the plan's kernels; a
    request for the CPU paths is refused there, one line), on the CPU `kernels` ("torch" or
    "interpret"; None = "torch")."""
    if kernels is not None and kernels not in KERNEL_CHOICES:
        raise PlanError(f"--kernels must be one of {', '.join(KERNEL_CHOICES)}, got {kernels!r}")
    if device.type == "cuda":
        if kernels is not None:
            raise PlanError(f"--kernels {kernels} selects a CPU path, and the device is a GPU, which runs the plan's "
                            f"Triton kernels; use --device cpu for it")
        return "triton"
    return kernels or "torch"


def check_device(plan: dict, device: torch.device) -> str:
    """Refuse a plan compiled for another sm; returns a one-line note about how it will run."""
    sm = int(plan["sm"])
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        local = major * 10 + minor
        if local != sm:
            raise PlanMismatch(f"plan compiled for sm_{sm}, this GPU ({torch.cuda.get_device_name(device)}) is "
                               f"sm_{local}; recompile with --sm {local}")
        return f"sm_{sm} on {torch.cuda.get_device_name(device)}"
    return f"no GPU: the sm_{sm} plan runs on the {device.type.upper()}"


class TorchDevice(DeviceBackend):
    """A real torch device: a CUDA GPU (binaries, warm-up, CUDA graphs) or the CPU (torch
    implementations, or the Triton interpreter: `kernels`). `interpreting()`: whether this process
    runs Triton's interpreter."""

    def __init__(self, spec=None, *, interpreting: Callable[[], bool], kernels: str | None = None):
        self.device = torch_device(spec)
        self._interpreting = interpreting
        self.kernels = kernel_mode(self.device, kernels)
        self.warm = self.capture_graphs = self.device.type == "cuda"
        # a GPU uploads through pinned staging buffers (pinned_upload.py) unless NINFER_PINNED_UPLOAD=0
        self._pinned_upload = self.device.type == "cuda" and pinned_upload_enabled()
        self._uploader = None  # the PinnedUploader of the upload in progress

    def check(self, plan: dict) -> str:
        return check_device(plan, self.device)

    def prepare_kernels(self) -> None:
        if self.kernels == "interpret" and not self._interpreting():
            if "triton" in sys.modules:
                raise PlanError("--kernels interpret needs the Triton interpreter, but triton was imported in this "
                                "process without it; set TRITON_INTERPRET=1 in the environment")
            os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (triton.jit reads it)

    def kernel_binaries(self, source, package: str) -> tuple[Any, str]:
        if self.kernels in KERNEL_NOTES:
            return None, KERNEL_NOTES[self.kernels]
        if self._interpreting() or source.binaries_dir is None:
            return None, "kernels: Triton interpreter (no binaries)"
        from .triton_cache import binaries_for, preload_binaries

        # precompiled binaries: a read-through Triton cache over PLAN/kernels/bin, else JIT (note says why)
        binaries, note = binaries_for(source.binaries_dir, source.plan, source.kernels)
        if binaries is not None:
            try:
                with torch.cuda.device(self.device):  # also in the background thread: per thread
                    preload_binaries(binaries, package)
                    binaries.load_modules()
            except BaseException:
                binaries.release()
                raise
        return binaries, note

    def start_kernel_binaries(self, source, package: str) -> KernelSetup:
        # with plan binaries on a GPU, the whole setup (triton import + build digest, the binaries'
        # sha256, canonical hashing, preload, module loads) overlaps the weight upload in a thread
        background = (self.kernels == "triton" and not self._interpreting() and source.binaries_dir is not None)
        return KernelSetup(lambda: self.kernel_binaries(source, package), background=background)

    def stream_weights(self, artifact, names: list[str]):
        base, path = getattr(artifact, "payload_offset", None), getattr(artifact, "path", None)
        if not self._pinned_upload or base is None or path is None:
            return None
        from . import weight_stream
        from .cuda_driver import CudaDriver

        stream = weight_stream.take(path, names, self.device.index)
        if stream is None:
            try:
                objects = [(n, base + artifact.objects[n].offset, artifact.objects[n].bytes) for n in names]
                stream = weight_stream.WeightStream(CudaDriver.open(self.device.index), path, objects).start()
            except (RuntimeError, OSError) as exc:  # no driver, pinning refused, ...
                print(f"note: the weight stream cannot start ({str(exc).strip().splitlines()[0][:200]}); "
                      f"uploading object by object", file=sys.stderr, flush=True)
                return None
        return stream

    def upload(self, read: Callable[[], torch.Tensor], nbytes: int) -> torch.Tensor:
        if self._pinned_upload and self._uploader is None:
            from .pinned_upload import PinnedUploader, PinningFailed

            try:
                self._uploader = PinnedUploader(self.device)
            except PinningFailed as exc:
                self._pinned_upload = False
                print(f"note: cannot pin the upload's staging buffers ({exc}); uploading from pageable memory",
                      file=sys.stderr, flush=True)
        if self._uploader is not None:
            return self._uploader.upload(read(), nbytes)
        return read().to(self.device, non_blocking=False)

    def finish_uploads(self) -> None:
        uploader, self._uploader = self._uploader, None
        if uploader is not None:
            uploader.finish()

    def zeros(self, shape, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
