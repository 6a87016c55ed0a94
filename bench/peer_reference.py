"""The reference peer of bench_peers.py: this project's float32 `ReferenceModel` over an artifact's
dequantized weights, streamed object by object to the device (grouped payloads decoded there, bit-exact
with `artifact.codecs`); eager prefill, decode with each decoder layer under `torch.compile`.
"""

from __future__ import annotations

import tempfile
import time
import traceback
import warnings
from pathlib import Path

from peer_common import (checkpoint, measure_read_bandwidth, measure_streaming_read, prompts, provenance,
                         roofline, sync)


def decode_grouped_on(device, fmt: str, shape, payload, *, max_elems: int = 1 << 25):
    """`row-split-k128-v1` payload (a 1-D uint8 tensor, any device) -> float32 [N, K] on `device`.

    The same math as `artifact.codecs.decode_row_split(...).dequantize()` (bit-exact), in torch ops
    on the device, a block of rows at a time (transients bounded by ~`max_elems` weights).
    """
    import torch

    from ninfer_compile.artifact.formats import FORMATS, row_split_geometry

    spec = FORMATS[fmt]
    n, k = (int(s) for s in shape)
    geom = row_split_geometry(fmt, n, k)
    payload = payload.to(device)
    out = torch.empty(n, k, dtype=torch.float32, device=device)
    rows = max(1, max_elems // geom.k_pad)
    shifts = torch.arange(8, dtype=torch.uint8, device=device)
    G, lg = geom.group, geom.logical_groups
    for r0 in range(0, n, rows):
        r = min(rows, n - r0)
        b0 = geom.base_offset + r0 * geom.base_row_bytes
        base = payload[b0:b0 + r * geom.base_row_bytes].view(r, geom.base_row_bytes)
        if spec.bits == 8:
            codes = base.view(torch.int8)                                   # [r, k_pad]
        else:
            u = torch.empty(r, geom.k_pad, dtype=torch.uint8, device=device)
            u[:, 0::2] = base & 0x0F
            u[:, 1::2] = base >> 4
            if spec.bits > 4:
                h0 = geom.high_offset + r0 * geom.high_row_bytes
                high = payload[h0:h0 + r * geom.high_row_bytes].view(r, geom.high_row_bytes)
                bits = ((high.unsqueeze(-1) >> shifts) & 1).reshape(r, geom.k_pad, spec.bits - 4)
                for j in range(spec.bits - 4):
                    u |= bits[:, :, j] << (4 + j)
            shift = 8 - spec.bits
            codes = (u << shift).view(torch.int8) >> shift
        s0 = geom.scale_offset + r0 * geom.scale_row_bytes
        scales = payload[s0:s0 + r * geom.scale_row_bytes].clone().view(torch.float16).view(r, geom.groups_per_row)
        code32 = codes[:, :lg * G].to(torch.float32)
        if code32.shape[1] < lg * G:  # (k_pad >= lg*G always; kept for clarity)
            code32 = torch.nn.functional.pad(code32, (0, lg * G - code32.shape[1]))
        w = (code32.view(r, lg, G) * scales[:, :lg].to(torch.float32).unsqueeze(2)).view(r, lg * G)
        out[r0:r0 + r] = w[:, :k]
    return out


class DeviceArtifactWeights:
    """A `WeightSource` over an open artifact that streams each object to `device` as it is read:
    the grouped payload bytes are copied up and decoded there (`decode_grouped_on`), direct
    formats decoded on the host (they are small) and moved. Cached on the device."""

    def __init__(self, artifact, device):
        from ninfer_compile.reference import ArtifactWeights

        self.artifact = artifact
        self.device = device
        self._host = ArtifactWeights(artifact, cache=False, device=device)
        self._cache: dict = {}
        self.load_s = {"grouped": 0.0, "direct": 0.0}

    def get(self, name: str):
        import torch

        from ninfer_compile.artifact.formats import FORMATS

        if name in self._cache:
            return self._cache[name]
        obj = self.artifact.tensor(name)
        t0 = time.perf_counter()
        if FORMATS[obj.format].kind == "grouped":
            with warnings.catch_warnings():  # a read-only mmap span: read, never written
                warnings.simplefilter("ignore", UserWarning)
                raw = torch.frombuffer(self.artifact.span(name), dtype=torch.uint8)
            t = decode_grouped_on(self.device, obj.format, obj.shape, raw)
            kind = "grouped"
        else:
            t = self._host.load(name)
            kind = "direct"
        self.load_s[kind] += time.perf_counter() - t0
        self._cache[name] = t
        return t

    def __contains__(self, name: str) -> bool:
        return name in self.artifact.by_name


def reference_weight_bytes(model) -> int:
    """fp32 bytes one decode step reads: every bound text weight (fused parents once) but the
    embedding table."""
    from dataclasses import fields, is_dataclass

    seen: dict[int, int] = {}

    def walk(x):
        if is_dataclass(x):
            for f in fields(x):
                walk(getattr(x, f.name))
        elif isinstance(x, list):
            for v in x:
                walk(v)
        elif hasattr(x, "untyped_storage"):
            st = x.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()

    walk(model.weights)
    emb = model.weights.embedding.untyped_storage()
    seen.pop(emb.data_ptr(), None)
    return sum(seen.values())


def compile_layer_fn(backend: str):
    """`torch.compile(decoder_layer)` (mode default) for `backend`, or None for 'none'."""
    import torch

    from ninfer_compile.reference.model import decoder_layer

    if backend == "none":
        return None
    return torch.compile(decoder_layer, backend=backend)


def mark_kv_dynamic(state) -> None:
    """The KV length grows every step: mark it dynamic so one compiled attention graph serves all."""
    import torch

    for c in state.kv.values():
        if c.length >= 2:
            torch._dynamo.mark_dynamic(c.k, 0)
            torch._dynamo.mark_dynamic(c.v, 0)


def reference_generate(model, prompt, n_steps: int, device, *, compile_backend: str = "none",
                       warm_steps: int = 2) -> dict:
    """Greedy on the reference: eager prefill of `prompt` (logits of the last row only), then
    `warm_steps` decode steps (where compilation happens) and `n_steps` timed steps with
    `model.layer_fn` compiled by `compile_backend` ('none': eager). A compile failure falls back
    to eager (state restored from a snapshot), its reason recorded."""
    import torch

    from ninfer_compile.reference.model import decoder_layer, linear

    out = {"compile_backend": compile_backend, "compiled": False, "compile_error": None}
    with torch.no_grad():
        model.layer_fn = decoder_layer
        st = model.new_state()
        sync(torch, device)
        t0 = time.perf_counter()
        hidden = model.forward_hidden(prompt, st)
        logits = linear(hidden[-1:], model.weights.output_head)[0]
        tok = logits.argmax()
        sync(torch, device)
        out["prefill_s"] = time.perf_counter() - t0
        toks = [int(tok)]
        fn = None
        if compile_backend != "none":
            try:
                fn = compile_layer_fn(compile_backend)
            except Exception as exc:  # noqa: BLE001
                out["compile_error"] = f"{type(exc).__name__}: {exc}"[:500]
        def warm(tok, st):
            """warm_steps decode steps (the compiled path compiles in the first): (token, seconds each)."""
            times = []
            for _ in range(warm_steps):
                ts = time.perf_counter()
                tok = model.decode(tok, st).argmax()
                sync(torch, device)
                times.append(time.perf_counter() - ts)
                toks.append(int(tok))
            return tok, times

        warm_times = []
        if fn is not None:
            snap = (st.clone(), tok.clone())
            try:
                import torch._dynamo

                torch._dynamo.reset()
                model.layer_fn = fn
                mark_kv_dynamic(st)
                tok, warm_times = warm(tok, st)
                out["compiled"] = True
                try:
                    from torch._dynamo.utils import counters

                    out["dynamo"] = {"unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
                                     "graph_breaks": int(sum(counters["graph_break"].values()))}
                except Exception:  # noqa: BLE001
                    pass
            except Exception as exc:  # noqa: BLE001
                out["compile_error"] = f"{type(exc).__name__}: {exc}"[:500]
                traceback.print_exc()
                model.layer_fn = decoder_layer
                st, tok = snap
                toks = toks[:1]
                warm_times = []
        if not out["compiled"]:
            tok, warm_times = warm(tok, st)
        out["warm_step_s"] = warm_times
        sync(torch, device)
        t1 = time.perf_counter()
        for _ in range(n_steps):
            tok = model.decode(tok, st).argmax()
            toks.append(tok)
        sync(torch, device)
        out["decode_s"] = time.perf_counter() - t1
        out["tokens"] = [int(t) for t in toks]
        out["decode_steps"] = n_steps
        # compile time: the warm steps beyond what a steady step costs
        steady = out["decode_s"] / max(1, n_steps)
        out["compile_s"] = max(0.0, sum(warm_times) - steady * len(warm_times)) if out["compiled"] else None
    model.layer_fn = decoder_layer
    return out


def pack_synthetic(contract: str, path: Path, seed: int = 0) -> None:
    from ninfer_compile.convert.synthetic import pack_synthetic as _pack

    _pack(contract, path, seed=seed, progress=False)


def run_reference(args, device, res: dict) -> dict:
    import torch

    from ninfer_compile.artifact.reader import Artifact
    from ninfer_compile.contracts import check_artifact, find_contract
    from ninfer_compile.reference import ReferenceModel

    res.update({"peer": "reference", "provenance": provenance(torch, device), "dtype": "float32",
                "concurrency_note": "single sequence (ReferenceModel has one state)",
                "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32)})
    res["read_bandwidth_gbs"] = measure_read_bandwidth(torch, device)
    res["streaming_read_gbs"] = measure_streaming_read(torch, device)
    tmp = None
    artifact = args.artifact
    if artifact is None:
        tmp = tempfile.TemporaryDirectory(prefix="peers_")
        artifact = Path(tmp.name) / f"{args.contract}.ninfer"
        t0 = time.perf_counter()
        pack_synthetic(args.contract, artifact, seed=args.seed)
        res["synthetic_pack_s"] = time.perf_counter() - t0
    res["artifact"] = str(artifact)
    try:
        with Artifact.open(artifact) as art:
            spec = find_contract(artifact, art.model_id, None).resolve_for(art)
            check_artifact(art, spec)
            t0 = time.perf_counter()
            weights = DeviceArtifactWeights(art, device)
            model = ReferenceModel(spec, weights)
            sync(torch, device)
            res["load_s"] = time.perf_counter() - t0
            res["load_detail_s"] = dict(weights.load_s)
        wbytes = res["weights_bytes_per_step"] = reference_weight_bytes(model)
        print(f"reference: loaded {wbytes / 1e9:.2f} GB fp32 (per decode step) in {res['load_s']:.1f} s", flush=True)
        checkpoint(args, res)
        prompt = prompts(1, args.context, model.dims.vocab_rows, args.seed)[0]
        with torch.no_grad():  # warm the eager kernels on a short prompt
            st = model.new_state()
            model.forward_hidden(prompt[:16], st)
            model.decode(prompt[16], st)
            del st
        r = reference_generate(model, prompt, args.decode_tokens, device, compile_backend=args.compile,
                               warm_steps=args.warm_steps)
        res["compile"] = {k: r[k] for k in ("compile_backend", "compiled", "compile_error", "compile_s",
                                            "warm_step_s")}
        res["compile"]["scope"] = ("each decoder layer (torch.compile(decoder_layer), mode default; KV "
                                   "length marked dynamic); embedding, final norm, head and prefill eager")
        if "dynamo" in r:
            res["compile"]["dynamo"] = r["dynamo"]
        res["prefill"] = {1: {"tokens": args.context, "s": r["prefill_s"], "tok_s": args.context / r["prefill_s"],
                              "mode": "eager"}}
        step = r["decode_s"] / r["decode_steps"]
        d = {"tok_s": r["decode_steps"] / r["decode_s"], "step_ms": step * 1e3, "steps": r["decode_steps"],
             "mode": "torch.compile" if r["compiled"] else "eager"}
        roofline(d, wbytes, res["read_bandwidth_gbs"])
        res["decode"] = {1: d}
        res["greedy_tokens_c1"] = r["tokens"]  # prefill's token, then the warm and the timed steps
        print(f"reference: prefill {res['prefill'][1]['tok_s']:.1f} tok/s (eager), decode {d['tok_s']:.2f} tok/s "
              f"({d['mode']}; compile {r['compile_s']}, error {r['compile_error']})", flush=True)
        if device.type == "cuda":
            res["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    finally:
        if tmp is not None:
            tmp.cleanup()
    return res
