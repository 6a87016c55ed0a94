"""fp32 PyTorch references of the KV-cache append and of every KV format's codecs (formats.py).

Cache layout: k_cache, v_cache [slots, max_ctx, Hkv, code width] and, for formats with scales,
k_scale, v_scale [slots, max_ctx, Hkv, scale width] (formats.cache_buffers). The format of a set
of caches is identified from their dtypes and widths (formats.identify).

INT8-G64 codec (symmetric, per token, per KV head, per 64 consecutive values of D):
    amax  = max |x| over the group (x: the bf16 value in fp32)
    scale = fp16(amax / 127)                     (round-to-nearest-even into binary16)
    code  = clamp(round_half_away(x / scale), -127, 127)   (code 0 for the whole group when scale == 0)
    x'    = float(scale) * code
The other codecs (e4m3_row, e2m1_g16, int4_g32, lloyd4_g64) and the rotations are specified in
formats.py; `encode` / `decode` below are their oracles (torch's float8_e4m3fn conversion for
e4m3, an explicit grid for e2m1).
"""

from __future__ import annotations

import math

import torch

from . import formats as F

GROUP = 64
_TORCH = {"bf16": torch.bfloat16, "i8": torch.int8, "u8": torch.uint8, "f16": torch.float16}
# (float32 reads as bf16: the fp32 IR executor, ir/execute.py, holds every bf16 buffer as float32)
_NAME = {**{v: k for k, v in _TORCH.items()}, torch.float32: "bf16"}
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def quantize_g64(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] (D % 64 == 0) -> (codes int8 [..., D], scales float16 [..., D/64])."""
    xf = x.float()
    g = xf.reshape(*xf.shape[:-1], -1, GROUP)
    scale = (g.abs().amax(-1) / 127.0).to(torch.float16)  # [..., D/64]
    s = scale.float()[..., None]
    y = torch.where(s > 0, g / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(g))
    code = (torch.sign(y) * torch.floor(y.abs() + 0.5)).clamp(-127, 127)
    return code.to(torch.int8).reshape(xf.shape), scale


def dequantize_g64(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """codes int8 [..., D], scales f16 [..., D/64] -> float32 [..., D]."""
    c = codes.float().reshape(*codes.shape[:-1], -1, GROUP)
    return (c * scales.float()[..., None]).reshape(codes.shape)


# ------------------------------------------------------------------ rotations

def hadamard(n: int, dtype=torch.float32) -> torch.Tensor:
    """The normalised Sylvester Hadamard matrix H_n / sqrt(n) [n, n] (symmetric, orthonormal)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    if h.shape[0] != n:
        raise ValueError(f"Hadamard size {n} is not a power of two")
    return (h / math.sqrt(n)).to(dtype)


def rotate(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [..., D] times the block-diagonal normalised Hadamard of `block`-value blocks (block = D:
    over the whole row; 0: x itself). Its own inverse."""
    if not block:
        return x
    d = x.shape[-1]
    h = hadamard(block, x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32).to(x.device)
    y = x.reshape(*x.shape[:-1], d // block, block).to(h.dtype) @ h
    return y.reshape(x.shape)


# ------------------------------------------------------------------ codecs

def _pack4(nib: torch.Tensor) -> torch.Tensor:
    """uint8 nibbles [..., D] -> [..., D/2] bytes (even dimension in the low nibble)."""
    n = nib.to(torch.uint8)
    return n[..., 0::2] | (n[..., 1::2] << 4)


def _unpack4(b: torch.Tensor) -> torch.Tensor:
    """[..., D/2] bytes -> int64 nibbles [..., D]."""
    b = b.to(torch.int64)
    return torch.stack([b & 15, (b >> 4) & 15], dim=-1).reshape(*b.shape[:-1], 2 * b.shape[-1])


def e4m3_encode(y: torch.Tensor) -> torch.Tensor:
    """float32 -> e4m3fn bytes (nearest even; saturated to ±448 first)."""
    return y.float().clamp(-F.E4M3_MAX, F.E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_decode(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float8_e4m3fn).float()


def e2m1_encode(y: torch.Tensor) -> torch.Tensor:
    """float32 -> e2m1 nibbles (nearest even on the grid; saturated to ±6)."""
    a = y.float().abs().clamp(max=F.E2M1_MAX)
    _, e = torch.frexp(a)
    ex = (e - 1).clamp(min=0).float()  # floor(log2 a), at least 0 (the subnormal binade)
    quantum = torch.exp2(ex - 1)
    v = torch.round(a / quantum) * quantum
    idx = torch.bucketize(v, torch.tensor(E2M1_GRID, device=v.device))
    return (idx | torch.where(y < 0, 8, 0)).to(torch.uint8)


def e2m1_decode(n: torch.Tensor) -> torch.Tensor:
    n = n.to(torch.int64)
    mag = torch.tensor(E2M1_GRID, device=n.device)[n & 7]
    return torch.where((n & 8) != 0, -mag, mag)


def lloyd4_decode_codes(n: torch.Tensor) -> torch.Tensor:
    """Nibbles -> their integer code values ±LLOYD4_CODES[index] (float32)."""
    n = n.to(torch.int64)
    mag = torch.tensor(F.LLOYD4_CODES, dtype=torch.float32, device=n.device)[n & 7]
    return torch.where((n & 8) != 0, -mag, mag)


def _grouped(x: torch.Tensor, g: int) -> torch.Tensor:
    return x.reshape(*x.shape[:-1], x.shape[-1] // g, g)


def encode(codec: F.Codec, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows x [..., D] (bf16 values; rotated first where the codec rotates) -> (codes in the code
    dtype [..., code width], scales [..., scale width] or None)."""
    d = x.shape[-1]
    if codec.kind == F.BF16:
        return x.to(torch.bfloat16), None
    xf = rotate(x.float(), codec.rotation_size(d))
    if codec.kind == F.INT8:
        return quantize_g64(xf)
    g = _grouped(xf, codec.group_size(d))  # [..., NG, G]
    amax = g.abs().amax(-1)                # [..., NG]
    if codec.kind == F.E4M3:
        s16 = (amax / F.E4M3_MAX).to(torch.float16)
        s = s16.float()[..., None]
        y = torch.where(s > 0, g / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(g))
        return e4m3_encode(y).reshape(xf.shape), s16
    if codec.kind == F.E2M1:
        sb = e4m3_encode(amax / F.E2M1_MAX)
        s = e4m3_decode(sb)[..., None]
        y = torch.where(s > 0, g / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(g))
        return _pack4(e2m1_encode(y).reshape(xf.shape)), sb
    if codec.kind == F.INT4:
        s16 = (amax / 7.0).to(torch.float16)
        s = s16.float()[..., None]
        y = torch.where(s > 0, g / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(g))
        code = (torch.sign(y) * torch.floor(y.abs() + 0.5)).clamp(-7, 7).to(torch.int64)
        return _pack4((code & 15).reshape(xf.shape)), s16
    if codec.kind == F.LLOYD4:
        rms = torch.sqrt((g * g).sum(-1) / g.shape[-1])[..., None]   # [..., NG, 1]
        inv = torch.where(rms > 0, 1.0 / torch.where(rms > 0, rms, torch.ones_like(rms)), torch.zeros_like(rms))
        z = g.abs() * inv
        idx = sum((z >= b).to(torch.int64) for b in F.LLOYD4_BOUNDARIES)
        nib = idx | torch.where(g < 0, 8, 0)
        c = lloyd4_decode_codes(nib)
        cc = (c * c).sum(-1)
        s = torch.where(rms[..., 0] > 0, (g * c).sum(-1) / cc, torch.zeros_like(cc))
        return _pack4(nib.reshape(xf.shape)), s.to(torch.float16)
    raise ValueError(f"codec {codec.name}: unknown kind {codec.kind}")


def decode(codec: F.Codec, codes: torch.Tensor, scales: torch.Tensor | None, d: int,
           unrotate: bool = True) -> torch.Tensor:
    """Stored rows -> float32 [..., D]: in the original basis (`unrotate`), else the stored one."""
    if codec.kind == F.BF16:
        return codes.float()
    if codec.kind == F.INT8:
        x = dequantize_g64(codes, scales)
    else:
        g = codec.group_size(d)
        if codec.kind == F.E4M3:
            vals = e4m3_decode(codes)
        else:
            n = _unpack4(codes)
            vals = {F.E2M1: e2m1_decode, F.INT4: lambda n: ((n ^ 8) - 8).float(),
                    F.LLOYD4: lloyd4_decode_codes}[codec.kind](n)
        sc = e4m3_decode(scales) if codec.scale_dtype == "u8" else scales.float()
        x = (_grouped(vals, g) * sc[..., None]).reshape(*vals.shape[:-1], d)
    return rotate(x, codec.rotation_size(d)) if unrotate else x


def roundtrip(fmt: F.KvFormat, x_k: torch.Tensor, x_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize -> dequantize of K and V rows [..., D] in format `fmt` (float32, original basis)."""
    d = x_k.shape[-1]
    return decode(fmt.k, *encode(fmt.k, x_k), d), decode(fmt.v, *encode(fmt.v, x_v), d)


# ------------------------------------------------------------------ caches

def _plane(t) -> tuple[str, int] | None:
    return None if t is None else (_NAME.get(t.dtype, str(t.dtype)), int(t.shape[-1]))


def format_of(k_cache, v_cache, k_scale, v_scale, head_dim: int) -> F.KvFormat:
    """The format these caches hold at head width `head_dim` (ValueError: none)."""
    f = F.identify(head_dim, _plane(k_cache), _plane(v_cache), _plane(k_scale), _plane(v_scale))
    if f is None:
        raise ValueError(f"no KV format stores head width {head_dim} as k {_plane(k_cache)} v {_plane(v_cache)} "
                         f"scales {_plane(k_scale)} / {_plane(v_scale)}")
    return f


def kv_append(k, v, positions, slots, k_cache, v_cache, k_scale=None, v_scale=None):
    """Write column t's k[t], v[t] ([T, Hkv, D]) at cache[slots[t], positions[t]].

    Returns new (k_cache, v_cache, k_scale, v_scale) copies (scales None for a bf16 cache).
    """
    fmt = format_of(k_cache, v_cache, k_scale, v_scale, int(k.shape[-1]))
    kc, vc = k_cache.clone(), v_cache.clone()
    ks = None if k_scale is None else k_scale.clone()
    vs = None if v_scale is None else v_scale.clone()
    for t in range(k.shape[0]):
        s, p = int(slots[t]), int(positions[t])
        for codec, x, c, sc in ((fmt.k, k[t], kc, ks), (fmt.v, v[t], vc, vs)):
            if codec.kind == F.BF16 and c.dtype == torch.float32:  # the fp32 IR executor: values kept exact
                c[s, p] = x.float()
                continue
            codes, scales = encode(codec, x)
            c[s, p] = codes.to(c.dtype)
            if sc is not None:
                sc[s, p] = scales
    return kc, vc, ks, vs


def kv_as_float(k_cache, v_cache, k_scale, v_scale, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Caches of any format -> (K, V) float32 [slots, ctx, Hkv, D] in the original basis."""
    fmt = format_of(k_cache, v_cache, k_scale, v_scale, head_dim)
    return (decode(fmt.k, k_cache, k_scale, head_dim), decode(fmt.v, v_cache, v_scale, head_dim))


def kv_roundtrip_fn(name: str):
    """(k, v) -> (k', v'): what a cache of format `name` gives back for bf16 K / V rows [..., D]
    (quantize -> dequantize, original basis). For model-level references with a quantized KV cache
    (e.g. wrapping ninfer_compile.reference's KVCache.append in tests and bench/bench_kv.py)."""
    fmt = F.kv_format(name)

    def fn(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kk, vv = roundtrip(fmt, k.to(torch.bfloat16), v.to(torch.bfloat16))
        return kk.to(k.dtype), vv.to(v.dtype)

    return fn
