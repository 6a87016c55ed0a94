"""Peers of the end-to-end benchmark, measured beside our engine (issue: runtime speed on the H200).

Two peers, each in its own subprocess (GPU memory is freed between them; one failing or timing
out does not lose the other), on the shapes of a contract (qwen3.6-27b by default):

- `hf`: Hugging Face transformers `Qwen3_5ForCausalLM` built from the contract's dimensions with
  random bf16 weights made directly on the device (meta construction + `to_empty` + in-place
  init), eager attention. flash-linear-attention is used when importable (transformers then
  calls its kernels); which GDN path ran is recorded (the resolved functions, and on a GPU the
  kernel names of one profiled decode step).
- `reference`: this project's float32 `ReferenceModel` over an artifact's dequantized weights,
  streamed object by object to the device (grouped payloads are decoded on the device, exactly
  as `artifact.codecs` does on the host). Prefill runs eager; the decode loop runs with each
  decoder layer under `torch.compile` (mode default; compile time recorded apart from the
  steady state; eager with the reason recorded if compiling fails).

Per peer: prefill tok/s for a `--context`-token prompt (per sequence), greedy decode tok/s over
`--decode-tokens` steps with the peer's own KV/recurrent cache (one token per forward), at each
`--concurrency` C (HF only; the reference is single-sequence), and the weight-read roofline as
in bench_e2e.py: bytes of weights read per decode step (every weight but the embedding table:
bf16 parameter bytes for HF, fp32 bytes for the reference) / read bandwidth measured in the same
process (bf16 cuBLAS GEMV, `bench_e2e.read_bandwidth_gbs`).

    python bench/bench_peers.py --out DIR [--label 27b] [--contract qwen3.6-27b] [--artifact A.ninfer]
        [--peers hf,reference] [--context 4096] [--decode-tokens 16] [--concurrency 1]
        [--device cuda] [--compile inductor] [--timeout-hf 240] [--timeout-reference 300] [--budget-s S]

Writes DIR/peers_<label>.json and .md with provenance (GPU, driver, torch/transformers/triton/fla
versions, date). Without `--artifact` the reference peer packs a synthetic artifact of the
contract into a temporary directory first. `--peer hf|reference --result FILE` runs one peer in
this process (what the parent launches).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

PEERS = ("hf", "reference")
PROMPT_VOCAB = 1000  # random prompt ids below min(this, vocab) are valid in any vocabulary


# ------------------------------------------------------------------------------ shared helpers


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for mod in ("torch", "transformers", "triton", "fla", "causal_conv1d"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", "?")
        except Exception:  # noqa: BLE001  (absent or broken: recorded as such)
            out[mod] = None
    return out


def provenance(torch, device) -> dict:
    prov = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "device": str(device), **versions()}
    if device.type == "cuda":
        prov["gpu"] = torch.cuda.get_device_name(device)
        try:
            prov["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            prov["driver"] = "?"
    else:
        prov["gpu"], prov["driver"] = None, None
    return prov


def sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_streaming_read(torch, device) -> float | None:
    """The streaming read rate (bench/limits.py: read-only kernel, rotated cold buffers), GB/s; None on CPU."""
    if device.type != "cuda":
        return None
    from limits import streaming_read_gbs

    return streaming_read_gbs(torch)["gbs"]


def measure_read_bandwidth(torch, device) -> float | None:
    """bench_e2e's read roofline (bf16 cuBLAS GEMV over rotated cold weights), GB/s; None on CPU."""
    if device.type != "cuda":
        return None
    from bench_e2e import read_bandwidth_gbs

    return read_bandwidth_gbs(torch)


def roofline(entry: dict, wbytes: int, read_gbs: float | None) -> None:
    """Fill roofline_step_ms / fraction_of_roofline of a decode entry (None without a bandwidth)."""
    if read_gbs:
        roof_ms = wbytes / (read_gbs * 1e9) * 1e3
        entry["roofline_step_ms"] = roof_ms
        entry["fraction_of_roofline"] = roof_ms / entry["step_ms"]
    else:
        entry["roofline_step_ms"] = entry["fraction_of_roofline"] = None


def load_spec(contract: str):
    from ninfer_compile.contracts import load_contract

    c = load_contract(contract)
    return c.resolve(present=[p for p, s in c.part_status().items() if s == "optional"])


def prompts(n_seq: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """`n_seq` random prompts of `length` ids in [5, min(vocab, PROMPT_VOCAB)) (same for every peer)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    hi = min(vocab, PROMPT_VOCAB)
    return torch.randint(5, hi, (n_seq, length), generator=g).tolist()


# ------------------------------------------------------------------------------ HF peer


def hf_config(dims, params: dict | None = None, *, dtype=None):
    """A `Qwen3_5TextConfig` with the shapes of `dims` (a `HybridDims`), eager attention."""
    from transformers import Qwen3_5TextConfig

    params = dict(params or {})
    rotary = dims.rotary_dim
    half = rotary // 2
    mrope = params.get("mrope_section") or [half - 2 * (half // 4), half // 4, half // 4]
    rope = {"rope_type": "default", "rope_theta": dims.rope_theta,
            "partial_rotary_factor": rotary / dims.head_dim, "mrope_section": list(mrope),
            "mrope_interleaved": bool(params.get("mrope_interleaved", True))}
    kinds = ["full_attention" if k == "attention" else "linear_attention" for k in dims.layer_kinds]
    kw = {"dtype": dtype} if dtype is not None else {}
    return Qwen3_5TextConfig(
        vocab_size=dims.vocab_rows, hidden_size=dims.hidden, intermediate_size=dims.intermediate,
        num_hidden_layers=dims.layers, num_attention_heads=dims.attn_heads, num_key_value_heads=dims.kv_heads,
        head_dim=dims.head_dim, linear_key_head_dim=dims.gdn_k_dim, linear_value_head_dim=dims.gdn_v_dim,
        linear_num_key_heads=dims.gdn_k_heads, linear_num_value_heads=dims.gdn_v_heads,
        linear_conv_kernel_dim=dims.conv_kernel, rms_norm_eps=dims.rms_eps, tie_word_embeddings=False,
        rope_parameters=rope, layer_types=kinds, max_position_embeddings=int(params.get("max_positions") or 32768),
        attn_implementation="eager", **kw)


def build_hf_model(cfg, device, dtype, seed: int = 0):
    """`Qwen3_5ForCausalLM(cfg)` with random weights made on `device` in `dtype`, never on the host.

    Constructed on the meta device, materialised with `to_empty`, then every parameter drawn in
    place (role-appropriate magnitudes: ~1/sqrt(fan_in) projections, small zero-centred norms,
    gated norm near 1, A_log = log U[1,16]); the rotary buffers are rebuilt on the device.
    """
    import torch
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # meta parameters in `dtype`: to_empty allocates only that
    try:
        with torch.device("meta"):
            model = Qwen3_5ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    model = model.to_empty(device=device).to(dtype).eval()
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.requires_grad_(False)
            if name.endswith("linear_attn.norm.weight"):
                p.normal_(1.0, 0.1, generator=g)
            elif "norm" in name:
                p.normal_(0.0, 0.1, generator=g)
            elif name.endswith("A_log"):
                p.uniform_(1.0, 16.0, generator=g).log_()
            elif name.endswith("dt_bias"):
                p.uniform_(0.0, 1.0, generator=g)
            elif name.endswith("embed_tokens.weight"):
                p.normal_(0.0, 1.0, generator=g)
            else:  # [N, K] projections, conv taps
                fan_in = p.shape[-1]
                scale = 0.25 if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")) else 1.0
                p.normal_(0.0, scale / math.sqrt(fan_in), generator=g)
        for mname, mod in list(model.named_modules()):
            if any(True for _ in mod.buffers(recurse=False)):
                if "rotary" not in type(mod).__name__.lower():
                    raise RuntimeError(f"build_hf_model: module {mname} ({type(mod).__name__}) has buffers "
                                       "this builder does not know how to rebuild")
                with torch.device(device):
                    fresh = type(mod)(config=cfg)
                for bname, buf in fresh.named_buffers(recurse=False):
                    setattr(mod, bname, buf.to(device))
    model.config.use_cache = True
    return model


def _impl_name(fn) -> str | None:
    """'module.qualname' of the implementation behind a (possibly wrapped) function."""
    if fn is None:
        return None
    seen = [fn]
    for cell in getattr(fn, "__closure__", None) or ():  # transformers' hub/fallback wrappers
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if callable(v) and getattr(v, "__module__", "") and not v.__module__.startswith("transformers"):
            seen.append(v)
    f = seen[-1]
    return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', getattr(f, '__name__', '?'))}"


def hf_gdn_paths(model) -> dict:
    """Which GDN / causal-conv implementations the model's linear-attention layers resolve to."""
    import sys as _sys

    layer = next((m for n, m in model.named_modules() if n.endswith("linear_attn")), None)
    if layer is None:
        return {}
    mod = _sys.modules[type(layer).__module__]
    out = {}
    names = ("chunk_gated_delta_rule", "recurrent_gated_delta_rule", "fused_recurrent_gated_delta_rule",
             "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
             "causal_conv1d_fn", "causal_conv1d_update")
    for name in names:
        fn = getattr(layer, name, None)
        if fn is None:
            fn = getattr(mod, name, None)
        if fn is not None or hasattr(layer, name):
            out[name] = _impl_name(fn)
    if hasattr(mod, "is_fast_path_available"):
        out["is_fast_path_available"] = bool(mod.is_fast_path_available)
    return out


def fla_status() -> dict:
    try:
        import fla  # noqa: F401
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401

        return {"importable": True, "version": getattr(fla, "__version__", "?")}
    except Exception as exc:  # noqa: BLE001
        return {"importable": False, "reason": f"{type(exc).__name__}: {exc}"[:200]}


def hf_generate(model, ids, n_steps: int, device) -> dict:
    """Greedy: one prefill forward of `ids` [C, T] (cache on), then `n_steps` one-token forwards.

    Returns the tokens [C, 1 + n_steps] (the prefill's argmax first) and the timings."""
    import torch

    with torch.inference_mode():
        sync(torch, device)
        t0 = time.perf_counter()
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        past = out.past_key_values
        sync(torch, device)
        t1 = time.perf_counter()
        toks = [tok]
        for _ in range(n_steps):
            out = model(input_ids=tok, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            toks.append(tok)
        sync(torch, device)
        t2 = time.perf_counter()
    return {"tokens": torch.cat(toks, 1).cpu(), "prefill_s": t1 - t0, "decode_s": t2 - t1, "past": past}


def profile_decode_kernels(model, past, tok, device, top: int = 12) -> dict:
    """Device kernel names of one cached decode forward (what actually ran), by device time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(input_ids=tok, past_key_values=past, use_cache=True)
        sync(torch, device)
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0) or 0
        if t > 0:
            rows.append((t, e.key, e.count))
    rows.sort(reverse=True)
    names = [k for _, k, _ in rows]
    hits = [k for k in names if any(s in k.lower() for s in ("gated_delta", "fused_recurrent", "chunk_",
                                                              "causal_conv", "fla"))]
    return {"top": [{"kernel": k[:120], "us": round(t, 1), "count": c} for t, k, c in rows[:top]],
            "gdn_kernels": hits[:12]}


def hf_weight_bytes(model) -> int:
    """Bytes of parameters one decode step reads: all but the embedding table (one row a token)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)


def checkpoint(args, res: dict) -> None:
    """Write the partial result now (a peer killed later still reports what it measured)."""
    if args.result:
        Path(args.result).write_text(json.dumps(res, indent=1, default=str) + "\n")


def run_hf(args, device, res: dict) -> dict:
    import torch

    res.update({"peer": "hf", "provenance": provenance(torch, device), "dtype": args.hf_dtype,
                "attention": "eager", "fla": fla_status()})
    res["read_bandwidth_gbs"] = measure_read_bandwidth(torch, device)
    res["streaming_read_gbs"] = measure_streaming_read(torch, device)
    spec = load_spec(args.contract)
    from ninfer_compile.contracts.dims import HybridDims

    dims = HybridDims.from_spec(spec)
    dtype = getattr(torch, args.hf_dtype)
    t0 = time.perf_counter()
    model = build_hf_model(hf_config(dims, spec.params, dtype=dtype), device, dtype, seed=args.seed)
    sync(torch, device)
    res["build_s"] = time.perf_counter() - t0
    res["gdn_path"] = hf_gdn_paths(model)
    wbytes = res["weights_bytes_per_step"] = hf_weight_bytes(model)
    res["prefill"], res["decode"] = {}, {}
    print(f"hf: built {dims.layers} layers in {res['build_s']:.1f} s; fla {res['fla']}; "
          f"gdn path {res['gdn_path']}", flush=True)
    for c in args.concurrency:
        ids = torch.tensor(prompts(c, args.context, dims.vocab_rows, args.seed), device=device)
        t0 = time.perf_counter()
        hf_generate(model, ids, 2, device)  # warm: kernel JIT/autotune at these shapes
        warm_s = time.perf_counter() - t0
        r = hf_generate(model, ids, args.decode_tokens, device)
        res["prefill"][c] = {"tokens": c * args.context, "s": r["prefill_s"],
                             "tok_s": c * args.context / r["prefill_s"], "warm_s": warm_s}
        step = r["decode_s"] / args.decode_tokens
        d = res["decode"][c] = {"tok_s": c * args.decode_tokens / r["decode_s"], "step_ms": step * 1e3,
                                "steps": args.decode_tokens}
        roofline(d, wbytes, res["read_bandwidth_gbs"])
        if c == args.concurrency[0]:
            res["greedy_tokens_c1"] = r["tokens"][0].tolist()  # prefill's token, then the timed steps
            if device.type == "cuda":
                try:
                    res["profiled_decode_step"] = profile_decode_kernels(model, r["past"], r["tokens"][:, -1:], device)
                except Exception as exc:  # noqa: BLE001
                    res["profiled_decode_step"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(f"hf C={c}: prefill {res['prefill'][c]['tok_s']:.0f} tok/s, decode {d['tok_s']:.2f} tok/s "
              f"(step {d['step_ms']:.1f} ms); warm {warm_s:.1f} s", flush=True)
        del r
        if device.type == "cuda":
            torch.cuda.empty_cache()
        checkpoint(args, res)
    if device.type == "cuda":
        res["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return res


# ------------------------------------------------------------------------------ reference peer


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


# ------------------------------------------------------------------------------ parent / report


def _fmt(v, spec=".1f", none="-"):
    return none if v is None else format(v, spec)


def render_md(res: dict) -> str:
    prov = res.get("provenance") or {}
    lines = [f"# Peers, {res['label']}: {prov.get('gpu') or prov.get('device', '?')}, {prov.get('date', '?')}", "",
             f"driver {prov.get('driver')}, torch {prov.get('torch')}, transformers {prov.get('transformers')}, "
             f"triton {prov.get('triton')}, fla {prov.get('fla')}; contract {res['options']['contract']}, "
             f"context {res['options']['context']} tokens per sequence, {res['options']['decode_tokens']} "
             f"decode steps", "",
             "| peer | path | C | prefill tok/s | decode tok/s | step ms | weights GB/step | read GB/s | "
             "roofline step ms | % of roofline | setup |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for name, p in res["peers"].items():
        if "error" in p:
            notes.append(f"- {name} failed: {p['error'].strip().splitlines()[-1] if p['error'].strip() else '?'}")
            if not p.get("decode"):
                lines.append(f"| {name} | failed | | | | | | | | | |")
                continue
        gb = p["weights_bytes_per_step"] / 1e9
        if name == "hf":
            path = f"HF eager {p['dtype']}, GDN: {'fla' if p.get('fla', {}).get('importable') else 'torch'}"
            setup = f"build {p['build_s']:.1f} s"
        else:
            c = p["compile"]
            path = f"reference fp32, decode {'torch.compile (' + c['compile_backend'] + ')' if c['compiled'] else 'eager'}"
            setup = f"load {p['load_s']:.1f} s" + (f", compile {c['compile_s']:.1f} s" if c["compile_s"] is not None else "")
            if c["compile_error"]:
                notes.append(f"- reference: compile fell back to eager: {c['compile_error'][:200]}")
        for cc, d in p["decode"].items():
            pf = p["prefill"].get(cc) or p["prefill"].get(str(cc)) or {}
            frac = d.get("fraction_of_roofline")
            lines.append(f"| {name} | {path} | {cc} | {_fmt(pf.get('tok_s'), '.0f')} | {d['tok_s']:.2f} | "
                         f"{d['step_ms']:.1f} | {gb:.2f} | {_fmt(p.get('read_bandwidth_gbs'), '.0f')} | "
                         f"{_fmt(d.get('roofline_step_ms'), '.2f')} | {_fmt(None if frac is None else 100 * frac, '.0f')} | "
                         f"{setup} |")
        sg = p.get("streaming_read_gbs")
        if sg:
            per_c = ", ".join(f"C={cc} {100 * gb / sg / d['step_ms']:.0f}%" for cc, d in p["decode"].items())
            notes.append(f"- {name}: streaming read {sg:.0f} GB/s in its process; its weights at that rate "
                         f"{gb / sg * 1e3:.2f} ms/step ({per_c} of a step)")
        if name == "hf":
            notes.append(f"- hf GDN path: {json.dumps(p.get('gdn_path'))}; fla {json.dumps(p.get('fla'))}")
            k = (p.get("profiled_decode_step") or {}).get("gdn_kernels")
            if k is not None:
                notes.append(f"- hf decode-step GDN kernels (profiler): {', '.join(k) or 'none matched'}")
    return "\n".join(lines + [""] + notes) + "\n"


def run_child(args) -> int:
    import torch

    device = torch.device(args.device)
    fn = run_hf if args.peer == "hf" else run_reference
    res = {"peer": args.peer}
    try:
        fn(args, device, res)
    except Exception:  # noqa: BLE001  (what was measured before the failure is kept)
        res["error"] = traceback.format_exc()[-3000:]
        print(res["error"], file=sys.stderr, flush=True)
    checkpoint(args, res)
    return 0 if "error" not in res else 1


def child_argv(args, peer: str, result: Path) -> list[str]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--peer", peer, "--result", str(result),
            "--contract", args.contract, "--context", str(args.context), "--decode-tokens", str(args.decode_tokens),
            "--concurrency", ",".join(map(str, args.concurrency)), "--device", args.device,
            "--compile", args.compile, "--hf-dtype", args.hf_dtype, "--seed", str(args.seed),
            "--warm-steps", str(args.warm_steps), "--out", str(args.out)]
    if args.artifact is not None:
        argv += ["--artifact", str(args.artifact)]
    return argv


def run_with_timeout(argv: list[str], limit: float) -> tuple[int | None, str]:
    """Run `argv` in its own process group (stdout passed through, stderr captured); on timeout
    the whole group (the peer and any compile workers it started) is killed. rc None = timed out."""
    import signal

    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=limit)
        return proc.returncode, err or ""
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, err = proc.communicate()
        return None, err or ""


def run_parent(args) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"label": args.label, "options": {"contract": args.contract, "context": args.context,
                                            "decode_tokens": args.decode_tokens, "concurrency": args.concurrency,
                                            "device": args.device, "compile": args.compile,
                                            "hf_dtype": args.hf_dtype, "artifact": None if args.artifact is None
                                            else str(args.artifact)},
           "provenance": None, "peers": {}}
    timeouts = {"hf": args.timeout_hf, "reference": args.timeout_reference}
    start = time.perf_counter()
    for i, peer in enumerate(args.peers):
        result = args.out / f".peer_{args.label}_{peer}.json"
        result.unlink(missing_ok=True)
        t0 = time.perf_counter()
        err = None
        limit = timeouts[peer]
        if args.budget_s is not None:  # what is left, less a reserve for each peer still to run
            later = len(args.peers) - 1 - i
            limit = min(limit, args.budget_s - (t0 - start) - args.reserve_s * later)
            if limit < 30:
                res["peers"][peer] = {"peer": peer, "wall_s": 0.0,
                                      "error": f"skipped: {limit:.0f} s left of --budget-s {args.budget_s}"}
                print(f"peer {peer}: skipped (budget)", flush=True)
                continue
        rc, stderr = run_with_timeout(child_argv(args, peer, result), limit)
        if stderr:
            sys.stderr.write(stderr[-4000:])
        if rc is None:
            err = f"timed out after {limit:.0f} s: {stderr[-1500:]}"
        elif rc != 0 and not result.exists():
            err = f"exit {rc}: {stderr[-2000:]}"
        wall = time.perf_counter() - t0
        if result.exists():  # complete, or partial (written as the peer went)
            r = json.loads(result.read_text())
            result.unlink()
            if err and "error" not in r:
                r["error"] = err
        else:
            r = {"peer": peer, "error": err or "no result"}
        r["wall_s"] = wall
        res["peers"][peer] = r
        if res["provenance"] is None and r.get("provenance"):
            res["provenance"] = r["provenance"]
        print(f"peer {peer}: {'error' if 'error' in r else 'ok'} in {wall:.0f} s", flush=True)
    if res["provenance"] is None:
        res["provenance"] = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), **versions()}
    (args.out / f"peers_{args.label}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    md = render_md(res)
    (args.out / f"peers_{args.label}.md").write_text(md)
    print(md)
    return 0 if all("error" not in p for p in res["peers"].values()) else 1


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out/peers"))
    ap.add_argument("--label", default="run")
    ap.add_argument("--contract", default="qwen3.6-27b", help="model id under graphs/ or a contract YAML")
    ap.add_argument("--artifact", type=Path, default=None,
                    help="reference peer's artifact (default: a synthetic one of the contract, packed first)")
    ap.add_argument("--peers", default="hf,reference")
    ap.add_argument("--peer", choices=PEERS, default=None, help="run one peer in this process (the child)")
    ap.add_argument("--result", type=Path, default=None, help="child: where to write its JSON")
    ap.add_argument("--context", type=int, default=4096, help="prompt tokens per sequence")
    ap.add_argument("--decode-tokens", type=int, default=16, help="timed decode steps")
    ap.add_argument("--concurrency", default="1", help="HF batch sizes C (the reference runs C=1)")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--compile", default="inductor", choices=("inductor", "aot_eager", "eager", "none"),
                    help="torch.compile backend of the reference's decode layers ('none': eager)")
    ap.add_argument("--warm-steps", type=int, default=2, help="reference: untimed decode steps (compilation)")
    ap.add_argument("--hf-dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-hf", type=float, default=240)
    ap.add_argument("--timeout-reference", type=float, default=300)
    ap.add_argument("--budget-s", type=float, default=None,
                    help="parent: wall-clock budget for all peers (each peer's timeout is cut to what is left)")
    ap.add_argument("--reserve-s", type=float, default=150,
                    help="parent, with --budget-s: seconds kept back for each peer still to run")
    args = ap.parse_args(argv)
    args.peers = [p for p in args.peers.split(",") if p]
    bad = [p for p in args.peers if p not in PEERS]
    if bad:
        ap.error(f"unknown peer(s) {bad} (choose from {', '.join(PEERS)})")
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x]
    if args.context < 17:
        ap.error("--context must be at least 17 tokens")
    if args.decode_tokens < 1:
        ap.error("--decode-tokens must be >= 1")
    if args.device is None:
        try:
            import torch

            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            args.device = "cpu"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return run_child(args) if args.peer else run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
