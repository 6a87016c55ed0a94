"""Load a plan directory + its artifact into an `Engine`.

`load(plan_dir, artifact, *, device=None, kernels=None, progress=True) -> Engine`:
1. read PLAN/plan.json and PLAN/kernels/manifest.json, and check the plan's integrity record
   (plan_source.py, integrity.py: sha256 of plan.json's body and of every file under the plan,
   kernel binaries included; any mismatch is refused naming the file);
2. check the plan against the artifact (directory sha256), the device (sm) and the emitted kernel
   files (sha256); refuse with `PlanMismatch`. What runs each route launch (`Engine.kernels`,
   device.py `kernel_mode`): a GPU runs the plan's Triton kernels; the CPU runs the plan's torch
   implementations (`kernels="torch"`, the default: each route's `torch_launcher` in
   kernels/manifest.json; a family without one is refused in one line naming it and the route)
   or, on request, its Triton kernels under the interpreter (`kernels="interpret"`, slow);
3. with `verify_weights=True`, hash the payload of every bound object against the digests the
   compiler recorded (integrity.verify_weights); then upload the weights the launches reference: on
   a GPU the weight stream (weight_stream.py; begun at process start by `prestart`, if called), else
   per object from the artifact's mmap (device.py). Row-split objects become the kernel library's
   `QuantWeight` (uint8 planes; row views are plane slices), direct objects typed tensors in their
   logical shape (row views are row slices);
4. allocate the activation arena and the per-slot state buffers (KV caches, GDN conv/recurrent);
5. import PLAN/kernels as a uniquely named package and bind every extent's launches (on the torch
   path nothing imports triton); on a GPU,
   use the plan's precompiled kernel binaries (PLAN/kernels/bin, see triton_cache.py) when they
   were built by this Triton (version, build, ptxas, cache-relevant environment) for this sm,
   else JIT from the emitted source (`Engine.kernel_note` says which and why); their check,
   hashing, preload and module loads run in a thread beside step 3's upload (device.py
   `KernelSetup`), joined before binding; then run every extent once so each kernel is loaded
   (or compiled) before capture, unless the binaries left nothing to load (graphs.warmup_needed);
6. on a GPU, capture one CUDA graph per decode extent the plan marks for capture (and, in a plan
   with a draft window K > 0, per verify / MTP decode / MTP verify extent: docs/SPECULATIVE.md).
Runners by graph and phase: `prefill_runner`, `decode_runners` (text decode, by C; a --tp plan
also `argmax_decode_runners`, its greedy twins), `verify_runners`, `mtp_prefill_runner`, `mtp_decode_runners`, `mtp_verify_runners`;
`draft_tokens` (K), `has_mtp_drafts`.
Every device-dependent step (the sm check, uploads, allocations, binaries, warm-up, capture) goes
through the engine's `DeviceBackend` (device.py): `TorchDevice` by default, or one injected by the
caller (the compiler's ahead-of-time pass injects a fake device and a plan held in memory, and
constructs this same Engine). `Engine.load_times` = {"upload": s, "kernels": s, "capture": s,
"total": s}; "kernels" is its critical path: the import, the wait for the background binaries
(else their setup), binding and the warm-up run. `Engine.load_phases` names each part; the
background's own phases end in " (bg)" ("kernels (bg)": its whole run, "kernels_wait": the join;
"upload (bg)": the weight stream's run from its start, maybe before the load began).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from typing import Any

import torch

from .artifact_view import GROUPED, ArtifactView, ArtifactViewError
from .device import DeviceBackend, TorchDevice, check_device  # noqa: F401 - check_device: public here too
from .errors import NinferRuntimeError, PlanError, PlanMismatch
from .integrity import byte_bar, verify_weights
from .plan_source import (KERNELS_FORMAT, PLAN_FORMAT, PlanDir, PlanInMemory, check_artifact,  # noqa: F401
                          check_kernel_files, import_kernels, read_plan, used_weights)
from .weight_stream import discard

_DIRECT = {"BF16": torch.bfloat16, "FP32": torch.float32, "I32": torch.int32}
MAX_DRAFT_TOKENS = 8
_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "i32": torch.int32,
           "i8": torch.int8, "u8": torch.uint8}


def _interpreting() -> bool:  # = the kernels' interpret.py; needed before the plan's package (and triton) is imported
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class Engine:
    """A loaded plan: weights, arena, state, bound extents (generation: generate.py, steps.py)."""

    def _pdl_note(self) -> str:
        """'; programmatic dependent launch ...' for a plan whose extents ask for it (plan_dependent_launch)."""
        asked = sorted(n for n, r in self.extents.items() if r._pdl is not None)
        if not asked or self.device.type != "cuda":
            return ""
        if not self.extents[asked[0]]._pdl.available():
            return "; programmatic dependent launch off (NINFER_PDL=0)"
        kinds: dict[str, int] = {}
        for n in asked:  # decode_c*, verify_c*, mtp_* extents: say which kinds ask for it
            kind = "MTP" if n.startswith("mtp") else str(self.plan["extents"][n].get("phase", "decode"))
            kinds[kind] = kinds.get(kind, 0) + 1
        return (f"; programmatic dependent launch in {len(asked)} extents ("
                + ", ".join(f"{v} {k}" for k, v in sorted(kinds.items())) + ")")

    def __init__(self, plan_dir, artifact, *, device=None, kernels: str | None = None, progress: bool = True,
                 verify_weights: bool = False, tp=None):
        """`plan_dir`: a plan directory, or a plan source (`PlanDir`, `PlanInMemory`: plan_source.py).
        `artifact`: a .ninfer path, or an opened artifact (`ArtifactView`, or an object with its
        `objects` / `span` / `has_resource` / `resource_bytes` / `close`; the engine closes it).
        `device`: a torch device spec (default: the GPU, else the CPU) or a `DeviceBackend` (device.py).
        `kernels`: on the CPU "torch" (default) or "interpret"; a GPU runs the Triton kernels. `tp`: a
        `--tp N` rank's `TensorParallel` context (its plan section; collectives on its process group)."""
        t0 = time.perf_counter()
        self.verify_weights = verify_weights
        self.source = plan_dir if isinstance(plan_dir, (PlanDir, PlanInMemory)) else PlanDir(plan_dir)
        self.plan_dir = self.source.plan_dir
        self.plan, self.kernel_manifest = self.source.plan, self.source.kernels
        self._before_init = {"plan": time.perf_counter() - t0}  # load phases before _init (read, device, check)
        from .tensor_parallel import TensorParallel, degree, rank_view

        self.tp = tp if tp is not None else TensorParallel.current()
        n = degree(self.plan)
        if n > 1 and (self.tp is None or self.tp.world != n):
            raise PlanError(f"the plan is for --tp {n} ({n} GPUs, one process each): run it with ninfer-run / ninfer-serve, "
                            f"which start the ranks, or under torchrun --nproc-per-node {n}")
        self.plan = rank_view(self.plan, self.tp.rank) if n > 1 else self.plan
        self.lockstep = None  # tensor_parallel.Lockstep on rank 0 of a --tp plan: followers replay its steps
        self.backend: DeviceBackend = (device if isinstance(device, DeviceBackend)
                                       else TorchDevice(device, interpreting=_interpreting, kernels=kernels))
        self.device = self.backend.device
        self.kernels = getattr(self.backend, "kernels", "triton")  # "triton" | "interpret" | "torch"
        if kernels is not None and kernels != self.kernels:
            raise PlanError(f"--kernels {kernels}: the injected device runs {self.kernels} kernels")
        self.device_note = self.backend.check(self.plan)
        self._before_init["device"] = time.perf_counter() - t0 - self._before_init["plan"]
        self.binaries = self._kernel_setup = None
        if isinstance(artifact, (str, os.PathLike)):
            try:
                artifact = ArtifactView.open(artifact)
            except ArtifactViewError as exc:
                raise PlanMismatch(str(exc)) from None
        self.artifact = artifact
        try:
            t = time.perf_counter()
            self.source.check(self.artifact)
            self._before_init["plan_check"] = time.perf_counter() - t
            self._init(progress, t0)
        except BaseException:
            if self._kernel_setup is not None:  # joins its thread, releases what it registered
                self._kernel_setup.abandon()
            if self.binaries is not None:
                self.binaries.release()
            discard(getattr(self.artifact, "path", None))  # a stream prestarted for it, not taken
            self.artifact.close()
            raise

    # ------------------------------------------------------------------------- construction
    def _init(self, progress: bool, t0: float) -> None:
        from .frontend import Frontend
        from .graphs import capture_decode_graphs, warm_kernels, warmup_needed
        from .weight_shards import upload_shards, weight_refs

        self._read_options()
        self._objects: dict[str, Any] = {}
        self._weights: dict[tuple, Any] = {}
        self.stream_seconds = None  # the weight stream's run (weight_stream.py), when it carried the upload
        used, self._shard_refs = weight_refs(self.plan)  # whole objects; (object, shard) copies of a --tp rank
        if self.verify_weights:
            verify_weights(self.plan, self.artifact, sorted(set(used) | {n for n, _ in self._shard_refs}), progress)
        self.backend.prepare_kernels()
        ph: dict[str, float] = dict(self._before_init)  # Engine.load_phases, the main thread's

        def timed(name: str, fn, *args):
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                ph[name] = time.perf_counter() - t

        self.kernel_package = timed("import", self.source.import_kernels)
        self._launchers: dict[str, Any] = {}
        self._quant_weight_cls = None
        setup = self._kernel_setup = timed("kernels_start", self.backend.start_kernel_binaries, self.source,
                                           self.kernel_package)
        t_up = time.perf_counter()
        try:
            self._upload(used, progress)
            self._shards = upload_shards(self, _DIRECT, GROUPED)  # a --tp rank's copies (row / column ranges)
        finally:  # until every queued copy is done, before anything reads the weights
            timed("upload_wait", self.backend.finish_uploads)
        self.backend.synchronize()
        t_up = time.perf_counter() - t_up
        timed("allocate", self._allocate)  # these two beside the background binaries' setup
        self.frontend = timed("frontend", Frontend.from_artifact, self.artifact)  # tokenizer, template, stop ids
        self.binaries, self.kernel_note = timed("kernels_wait", setup.join)  # raises the background's error
        timed("binding", self._bind_extents)
        self.warmed = warmup_needed(self)
        timed("warmup", warm_kernels if self.warmed else (lambda engine: None), self)
        if self.binaries is not None:
            self.kernel_note = self.binaries.note() + ("" if self.warmed else "; no warm-up run (nothing to load)")
        self.device_note = f"{self.device_note}; {self.kernel_note}{self._pdl_note()}"
        # CUDA graphs: decode, verify and MTP extents (graphs.py)
        self.graphs = timed("capture", capture_decode_graphs if self.backend.capture_graphs else (lambda e: {}), self)
        t_kern = sum(ph[k] for k in ("import", "kernels_start", "kernels_wait", "binding", "warmup"))
        self.load_times = {"upload": t_up, "kernels": t_kern, "capture": ph["capture"],
                           "total": time.perf_counter() - t0}
        # the background's phases (binaries: triton_cache.PlanBinaries.phases; the weight stream's run)
        bg = " (bg)" if setup.background else ""
        if not bg:  # the setup ran inline: its time is the join's
            ph.pop("kernels_wait")
        binary_phases = self.binaries.phases if self.binaries is not None else {}
        self.load_phases = {**ph, **{k + bg: v for k, v in binary_phases.items()},
                            **({"kernels (bg)": setup.seconds} if bg else {}),
                            **({"upload (bg)": self.stream_seconds} if self.stream_seconds is not None else {})}
        if self.tp is not None and self.tp.world > 1 and self.tp.rank == 0:
            from .tensor_parallel import Lockstep

            self.lockstep = Lockstep(self)  # from here on the other ranks follow this engine's steps
        self.last_stats: dict[str, float] = {}

    def _read_options(self) -> None:
        opts = self.plan["options"]
        self.max_context = int(opts["max_context"])
        self.prefill_chunk = int(opts["prefill_chunk"])
        self.slots = int(opts.get("slots") or max(opts.get("concurrency") or [1]))
        k = int(opts.get("draft_tokens", 0))
        if not 0 <= k <= MAX_DRAFT_TOKENS:
            raise PlanError(f"options.draft_tokens {k} is outside [0, {MAX_DRAFT_TOKENS}]")
        self.draft_tokens = k  # K of the plan's verify extents (0: none; docs/SPECULATIVE.md)

    def _allocate(self) -> None:
        """The activation arena and the per-slot state buffers, on `self.device`."""
        try:
            self._allocate_buffers()
        except NinferRuntimeError:
            raise
        except (RuntimeError, ValueError, OverflowError, TypeError) as exc:  # an absurd (edited) size
            msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise PlanError(f"buffers: cannot allocate the plan's arena / state: {msg}") from None

    def _allocate_buffers(self) -> None:
        arena_bytes = int(self.plan["buffers"]["arena"]["bytes"])
        need = max([int(x.get("arena_bytes") or 0) for x in self.plan["extents"].values()] + [arena_bytes, 256])
        self.arena = self.backend.zeros((need + 255) // 256 * 256, torch.uint8)
        self._state: dict[str, torch.Tensor] = {}
        for name, b in sorted(self.plan["buffers"].get("state", {}).items()):
            dt = _DTYPES.get(b["dtype"])
            if dt is None:
                raise PlanError(f"state buffer {name}: unsupported dtype {b['dtype']}")
            if int(b["shape"][0]) != self.slots:
                raise PlanError(f"state buffer {name}: leading dim {b['shape'][0]} != slots {self.slots}")
            self._state[name] = self.backend.zeros([int(d) for d in b["shape"]], dt)

    def _bind_extents(self) -> None:
        """One `ExtentRunner` per extent, text and MTP (launches bound to the emitted launchers),
        grouped by graph and phase: `prefill_runner`, `decode_runners` (the text decode extents,
        by C), `verify_runners` (text verify, by C); `mtp_prefill_runner`, `mtp_decode_runners`,
        `mtp_verify_runners` (the MTP draft graphs; empty / None without them)."""
        from .executor import ExtentRunner

        self.extents: dict[str, ExtentRunner] = {}
        for name, entry in sorted(self.plan["extents"].items()):
            try:
                runner = ExtentRunner(self, name, entry)
            except NinferRuntimeError:
                raise
            except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
                msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else "(no message)"
                raise PlanError(f"extent {name}: invalid plan entry: {type(exc).__name__}: {msg}") from None
            graph = entry.get("graph", "text")
            if graph not in ("text", "mtp"):
                raise PlanError(f"extent {name}: unknown graph {graph!r} (text or mtp)")
            runner.graph = graph
            self.extents[name] = runner

        def group(graph: str, phase: str, head: str = "sample"):
            return sorted((r for r in self.extents.values() if r.graph == graph and r.phase == phase
                           and r.head == head), key=lambda r: r.concurrency)

        prefill = group("text", "prefill")
        if len(prefill) != 1:
            raise PlanError(f"plan has {len(prefill)} text prefill extents; the runtime needs exactly one")
        self.prefill_runner = prefill[0]
        self.decode_runners = group("text", "decode")
        if not self.decode_runners:
            raise PlanError("plan has no decode extent")
        self.argmax_decode_runners = group("text", "decode", "argmax")  # a --tp plan's greedy twins
        if {r.concurrency for r in self.argmax_decode_runners} - {r.concurrency for r in self.decode_runners}:
            raise PlanError("plan has a greedy decode twin without its decode extent")
        self.verify_runners = group("text", "verify")
        mtp_prefill = group("mtp", "prefill")
        if len(mtp_prefill) > 1:
            raise PlanError(f"plan has {len(mtp_prefill)} MTP prefill extents; the runtime needs at most one")
        self.mtp_prefill_runner = mtp_prefill[0] if mtp_prefill else None
        self.mtp_decode_runners = group("mtp", "decode")
        self.mtp_verify_runners = group("mtp", "verify")
        for r in self.extents.values():
            if ("logits" if r.head == "sample" else "ids") not in r.outputs:
                raise PlanError(f"extent {r.name} has no {'logits' if r.head == 'sample' else 'ids'} output")
        self.vocab_rows = int(self.prefill_runner.outputs["logits"].shape[-1])
        self.max_concurrency = min(self.slots, self.decode_runners[-1].concurrency)
        self._check_speculative()

    def _check_speculative(self) -> None:
        """A plan with K > 0 has one verify extent per decode C (T = C (K+1)), each with the
        inputs / outputs the rounds bind (docs/SPECULATIVE.md); MTP drafting needs the three MTP
        extent kinds at the same Cs. Sets `draft_tokens` (K) and `has_mtp_drafts`."""
        K = self.draft_tokens
        if K == 0:
            if self.verify_runners:
                raise PlanError(f"extent {self.verify_runners[0].name}: a verify extent in a plan with draft_tokens 0")
            self.has_mtp_drafts = False
            return
        W = K + 1
        dec = [r.concurrency for r in self.decode_runners]
        ver = [r.concurrency for r in self.verify_runners]
        if ver != dec:
            raise PlanError(f"plan with draft_tokens {K}: verify extents for C={ver}, decode extents for C={dec}")
        for r in self.verify_runners:
            if r.t != r.concurrency * W:
                raise PlanError(f"extent {r.name}: T={r.t}, a verify extent of C={r.concurrency}, K={K} needs {r.concurrency * W}")
            for n in ("ids", "positions", "slots", "n_drafts"):
                if n not in r.inputs:
                    raise PlanError(f"extent {r.name}: verify extent without input {n!r}")
            for n in ("tokens", "accepted"):
                if n not in r.outputs:
                    raise PlanError(f"extent {r.name}: verify extent without output {n!r}")
        mtp = [self.mtp_prefill_runner is not None, bool(self.mtp_decode_runners), bool(self.mtp_verify_runners)]
        self.has_mtp_drafts = all(mtp)
        if any(mtp) and not all(mtp):
            raise PlanError("plan has some MTP draft extents but not all of mtp_prefill, mtp_decode, mtp_verify")
        if self.has_mtp_drafts:
            if [r.concurrency for r in self.mtp_verify_runners] != dec or \
                    [r.concurrency for r in self.mtp_decode_runners] != dec:
                raise PlanError(f"plan with MTP drafts: MTP extents for C={[r.concurrency for r in self.mtp_verify_runners]}"
                                f" / {[r.concurrency for r in self.mtp_decode_runners]}, decode extents for C={dec}")
            needs = [(self.prefill_runner, "outputs", "hidden")] + \
                [(r, "outputs", "hidden") for r in self.verify_runners] + \
                [(r, io, n) for r in (self.mtp_prefill_runner, *self.mtp_decode_runners, *self.mtp_verify_runners)
                 for io, n in (("inputs", "hidden"), ("outputs", "hidden"), ("outputs", "ids"))]
            for r, io, n in needs:
                if n not in getattr(r, io):
                    raise PlanError(f"extent {r.name}: MTP drafting needs its {io[:-1]} {n!r}")
            if self.mtp_prefill_runner.t != self.prefill_runner.t:
                raise PlanError(f"extent {self.mtp_prefill_runner.name}: T={self.mtp_prefill_runner.t}, the text prefill "
                                f"has T={self.prefill_runner.t}")

    def captured_runners(self) -> list:
        """The runners a GPU replays from CUDA graphs (those the plan marks `cuda_graph.capture`)."""
        return [r for r in (*self.decode_runners, *self.argmax_decode_runners, *self.verify_runners,
                            *self.mtp_decode_runners, *self.mtp_verify_runners) if r.capture]

    def _upload(self, names: list[str], progress: bool) -> None:
        entries = [self.artifact.objects.get(n) for n in names]
        for n, e in zip(names, entries):
            if e is None or e.kind != "tensor":
                raise PlanMismatch(f"plan references object {n!r}, absent from artifact {self.artifact.path.name}")
        total = sum(e.bytes for e in entries)
        bar = byte_bar(total, "upload weights") if progress else None
        try:
            stream = self.backend.stream_weights(self.artifact, names)  # weight_stream.py (a GPU)
            if stream is not None:
                stream.wait(None if bar is None else lambda done: bar.update(done - bar.n))
                self.stream_seconds = stream.seconds
                device = stream.adopt(torch)
            for e in entries:
                dev = device[e.name] if stream is not None else self.backend.upload(
                    lambda n=e.name: torch.frombuffer(self.artifact.span(n), dtype=torch.uint8), int(e.bytes))
                self._objects[e.name] = self._bind_object(e, dev)
                if bar is not None and stream is None:
                    bar.update(e.bytes)
        finally:
            if bar is not None:
                bar.close()
        self.weight_bytes = total

    def process_group(self, name: str):
        """The process group a collective launch names (None: a one-GPU plan)."""
        return None if self.tp is None else self.tp.group(name)

    def _bind_object(self, e, dev: torch.Tensor):
        if e.format in _DIRECT:
            return dev.view(_DIRECT[e.format]).view(list(e.shape))
        if e.format in GROUPED:
            if len(e.shape) != 2:
                raise PlanMismatch(f"object {e.name}: {e.format} must be rank 2")
            cls = self.quant_weight_cls()  # plane geometry: the plan's kernels' (artifact/formats.py, emitted)
            g = sys.modules[cls.__module__].row_split_geometry(e.format, int(e.shape[0]), int(e.shape[1]))
            if g.total != e.bytes:
                raise PlanMismatch(f"object {e.name}: {e.bytes} bytes, {e.format} {list(e.shape)} needs {g.total}")
            return cls(format=e.format, n=g.n, k=g.k, k_pad=g.k_pad, groups_per_row=g.groups_per_row,
                       base=dev[g.base_offset:g.base_offset + g.base_bytes],
                       high=dev[g.high_offset:g.high_offset + g.high_bytes] if g.high_bytes else None,
                       scale=dev[g.scale_offset:g.scale_offset + g.scale_bytes])
        raise PlanMismatch(f"object {e.name}: format {e.format} is not supported by the runtime")

    def quant_weight_cls(self):
        """The kernel library's QuantWeight class, from the plan's emitted `linear.weights`."""
        if self._quant_weight_cls is None:
            try:
                mod = importlib.import_module(f"{self.kernel_package}.linear.weights")
                self._quant_weight_cls = mod.QuantWeight
            except (ImportError, AttributeError) as exc:
                raise PlanError(f"the plan's kernels have no linear.weights.QuantWeight (needed for row-split "
                                f"weights): {exc}") from None
        return self._quant_weight_cls

    # ------------------------------------------------------------------------- lookups
    def weight(self, name: str, rows: tuple[int, int] | None = None, shard: tuple | None = None):
        key = (name, rows, shard)
        w = self._weights.get(key)
        if w is None:
            base = self._objects.get(name) if shard is None else self._shards.get((name, shard))
            if base is None:
                raise PlanError(f"weight {name} was not uploaded")
            if rows is None:
                w = base
            else:
                n = int(base.n) if hasattr(base, "n") else int(base.shape[0])
                begin, count = int(rows[0]), int(rows[1])
                if begin < 0 or count < 1 or begin + count > n:
                    raise PlanError(f"weight {name}: row view [{begin}, +{count}) is outside its {n} rows")
                w = base.rows(begin, count) if hasattr(base, "rows") else base[begin:begin + count]
            self._weights[key] = w
        return w

    def state(self, name: str) -> torch.Tensor:
        s = self._state.get(name)
        if s is None:
            raise PlanError(f"state buffer {name!r} is not declared in the plan's buffers")
        return s

    def route_info(self, route: str) -> dict:
        info = (self.kernel_manifest.get("routes") or {}).get(route)
        if info is None:
            raise PlanError(f"route {route} has no entry in kernels/manifest.json")
        return info

    def launcher(self, route: str):
        """The callable behind every launch of `route`: its Triton launcher, or on the torch path its
        family's torch implementation (same arguments)."""
        fn = self._launchers.get(route)
        if fn is None:
            info = self.route_info(route)
            ref = info["launcher"]
            if self.kernels == "torch":
                ref = info.get("torch_launcher")
                if not ref:
                    what = (f"family {info.get('family')} (route {route}) has no torch implementation"
                            if "torch_launcher" in info else f"route {route} (family {info.get('family')}): the "
                            f"plan's kernels were emitted without torch implementations (recompile the plan)")
                    raise PlanError(f"{what}: the CPU's torch path cannot run it; use --kernels interpret (the "
                                    f"Triton interpreter, slow)")
            mod_name, _, attr = ref.partition(":")
            try:
                obj = importlib.import_module(f"{self.kernel_package}.{mod_name}")
                for part in attr.split("."):
                    obj = getattr(obj, part)
            except (ImportError, AttributeError) as exc:
                raise PlanError(f"route {route}: cannot load launcher {ref} from the plan's kernels: {exc}") from None
            fn = self._launchers[route] = obj
        return fn

    def alloc_workspace(self, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A zeroed workspace of `numel` elements on the engine's device (through its backend)."""
        return self.backend.zeros(int(numel), dtype)

    def zero_state(self) -> None:
        """Zero every per-slot state buffer (after dummy runs: warm-up, graph capture)."""
        for s in self._state.values():
            s.zero_()

    def reset_slot(self, slot: int) -> None:
        """Zero the per-slot state of one slot (a new sequence starts there)."""
        if self.lockstep is not None:
            self.lockstep.reset_slot(slot)
        for s in self._state.values():
            s[slot].zero_()

    def close(self) -> None:
        if getattr(self, "lockstep", None) is not None:
            self.lockstep, ls = None, self.lockstep
            ls.stop()
        self.graphs = {}
        if getattr(self, "binaries", None) is not None:
            self.binaries.release()
        self.artifact.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # generation API (generate.py)
    def generate(self, prompts, max_new_tokens: int = 32, **kw):
        from .generate import generate

        return generate(self, prompts, max_new_tokens, **kw)

    def stream(self, prompts, max_new_tokens: int = 32, **kw):
        from .generate import stream

        return stream(self, prompts, max_new_tokens, **kw)


def load(plan_dir, artifact, *, device=None, kernels: str | None = None, progress: bool = True,
         verify_weights: bool = False, tp=None) -> Engine:
    """Load `plan_dir` with `artifact` (the arguments are `Engine`'s; `tp` defaults to the context
    tensor_parallel.py set up in this rank process); errors other than the runtime's become PlanMismatch."""
    try:
        return Engine(plan_dir, artifact, device=device, kernels=kernels, progress=progress,
                      verify_weights=verify_weights, tp=tp)
    except NinferRuntimeError:
        raise
    except ArtifactViewError as exc:
        raise PlanMismatch(str(exc)) from None
