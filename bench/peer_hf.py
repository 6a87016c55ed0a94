"""The Hugging Face peer of bench_peers.py: transformers `Qwen3_5ForCausalLM` built from a contract's
dimensions with random weights made on the device, eager attention, fla's GDN kernels when importable
(which GDN path ran is recorded); prefill and greedy decode timed at each concurrency.
"""

from __future__ import annotations

import math
import time

from peer_common import (checkpoint, load_spec, measure_read_bandwidth, measure_streaming_read, prompts,
                         provenance, roofline, sync)


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
