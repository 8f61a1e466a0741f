"""Where the decoder's fused kernels run, and the torch operators that launch them.

The kernels are in triton_fused.py: the residual add + RMSNorm, q/k norm + RoPE + the KV-cache
write (+ the decode step's attention over the filled cache), and SiLU * up. Each is registered as
a torch operator (``torch.ops.dictation.*``), so that it is one dispatched operation like an aten
op: a CUDA graph captures it, and the dispatch count of a step (``dictation.bench.kernel_count``)
and profilers see one operation per kernel.

Where: ``FUSED_KERNELS`` (None: on CUDA; True: everywhere, which on the CPU needs Triton's
interpreter, ``TRITON_INTERPRET=1``, as the tests run it; False: never), per model
``TextDecoder.kernels``. Before the first use on a device and dtype every kernel is run once on a
small problem against the torch code it replaces (:func:`reference_step`); a machine without Triton,
without a working compiler or with a kernel that answers wrongly keeps the torch path, with one log
line. The environment variable ``DICTATION_FUSED_KERNELS=0`` (or ``1``) sets the default.
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from dictation.asr.nn.kernels import triton_fused

log = logging.getLogger(__name__)


def _env_flag(name: str) -> bool | None:
    value = os.environ.get(name, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return None


# None: on CUDA (where Triton runs them right); True: on every device; False: never.
FUSED_KERNELS: bool | None = _env_flag("DICTATION_FUSED_KERNELS")
# The decode step's float projections through our GEMV with the norms, SiLU * up and residual adds
# folded in (5 kernels per layer instead of 8); an option to measure: TextDecoder.gemv overrides.
FUSED_GEMV: bool = bool(_env_flag("DICTATION_FUSED_GEMV"))
# Programs per query head of the decode attention: None = triton_fused.attention_splits(cache size).
ATTENTION_SPLITS: int | None = (
    int(os.environ["DICTATION_ATTENTION_SPLITS"]) if os.environ.get("DICTATION_ATTENTION_SPLITS") else None
)
_PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}  # x max |reference|


# --- operators ---------------------------------------------------------------------------------------


_SCHEMAS = {
    "rms_norm": "rms_norm(Tensor x, Tensor? delta, Tensor weight, float eps) -> (Tensor, Tensor)",
    "silu_mul": "silu_mul(Tensor gate, Tensor up) -> Tensor",
    "rope_qk_cache": "rope_qk_cache(Tensor q, Tensor k, Tensor v, Tensor q_weight, Tensor k_weight, Tensor cos, "
    "Tensor sin, Tensor(a!) key_cache, Tensor(b!) value_cache, int start, float eps) -> Tensor",
    "decode_attention": "decode_attention(Tensor q, Tensor k, Tensor v, Tensor q_weight, Tensor k_weight, "
    "Tensor cos, Tensor sin, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor position, float eps, "
    "int splits) -> Tensor",
    "gemv": "gemv(Tensor x, Tensor weight, Tensor? norm_weight, Tensor? residual, float eps, bool silu) -> Tensor",
}
_LIBRARY = torch.library.Library("dictation", "FRAGMENT")  # kept alive with the module


def _implementation(name: str):
    # Looked up at each call, so that a test can stand in for a kernel (triton_fused.<name>).
    return lambda *args: getattr(triton_fused, name)(*args)


for _name, _schema in _SCHEMAS.items():
    if not hasattr(torch.ops.dictation, _name):  # a re-imported module: already defined
        _LIBRARY.define(_schema)
        _LIBRARY.impl(_name, _implementation(_name), "CompositeExplicitAutograd")
OPS = torch.ops.dictation


def rms_norm(h: torch.Tensor, delta: torch.Tensor | None, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``h + delta`` (the residual stream; ``h`` itself without ``delta``) and ``norm`` of it (a
    decoder.RMSNorm), in one kernel."""
    return OPS.rms_norm(h, delta, norm.weight, norm.eps)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return OPS.silu_mul(gate, up)


def rope_qk_cache(q, k, v, q_norm: nn.Module, k_norm: nn.Module, cos, sin, key_cache, value_cache, start: int):
    """See triton_fused.rope_qk_cache (``q_norm``/``k_norm``: the attention's RMSNorm modules)."""
    return OPS.rope_qk_cache(q, k, v, q_norm.weight, k_norm.weight, cos, sin, key_cache, value_cache, start, q_norm.eps)


def gemv(x, weight, norm: nn.Module | None = None, residual=None, silu: bool = False):
    """``weight @ a + residual`` for one row, ``a`` = ``norm(x)``, ``silu(gate) * up`` of ``x = [gate,
    up]``, or ``x`` (see triton_fused.gemv)."""
    eps = norm.eps if norm is not None else 0.0
    return OPS.gemv(x, weight, norm.weight if norm is not None else None, residual, eps, silu)


def decode_attention(q, k, v, q_norm: nn.Module, k_norm: nn.Module, cos, sin, key_cache, value_cache, position):
    """See triton_fused.decode_attention; the split count follows the cache size (or ATTENTION_SPLITS)."""
    splits = ATTENTION_SPLITS or triton_fused.attention_splits(key_cache.shape[2])
    return OPS.decode_attention(
        q, k, v, q_norm.weight, k_norm.weight, cos, sin, key_cache, value_cache, position, q_norm.eps, splits
    )


# --- the torch code they replace (the probe's reference, and the tests') ---------------------------------


def reference_rms_norm(x, delta, weight, eps):
    h = x.clone() if delta is None else x + delta
    h32 = h.float()
    return h, weight * (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)


def reference_norm_rope(x, weight, cos, sin, eps):
    """``x [..., hd]`` per head: RMSNorm then RoPE, as decoder.RMSNorm and rope.apply_rope compute it."""
    y = reference_rms_norm(x, None, weight, eps)[1]
    half = y.shape[-1] // 2
    return y * cos + torch.cat([-y[..., half:], y[..., :half]], dim=-1) * sin


def reference_rope_qk_cache(q, k, v, q_weight, k_weight, cos, sin, keys, values, start, eps):
    """triton_fused.rope_qk_cache in torch ops (decoder.Attention._qkv + StaticKVCache.write)."""
    hd = keys.shape[-1]
    s = q.shape[-2]
    qh = reference_norm_rope(q.reshape(s, -1, hd), q_weight, cos[:, None], sin[:, None], eps)
    keys[0, :, start : start + s] = reference_norm_rope(
        k.reshape(s, -1, hd), k_weight, cos[:, None], sin[:, None], eps
    ).transpose(0, 1)
    values[0, :, start : start + s] = v.reshape(s, -1, hd).transpose(0, 1)
    return qh.transpose(0, 1)[None].contiguous()


def reference_decode_attention(q, k, v, q_weight, k_weight, cos, sin, keys, values, position, eps, splits=1):
    """triton_fused.decode_attention in torch ops (what the static step computes), ``position`` a
    device tensor [1] or an int; writes k/v into the cache."""
    position = int(position)
    hd = keys.shape[-1]
    heads, kv = q.shape[-1] // hd, k.shape[-1] // hd
    qh = reference_norm_rope(q.reshape(heads, hd), q_weight, cos[position], sin[position], eps)
    kh = reference_norm_rope(k.reshape(kv, hd), k_weight, cos[position], sin[position], eps)
    keys[0, :, position] = kh
    values[0, :, position] = v.reshape(kv, hd)
    qg = qh.view(1, kv, heads // kv, hd)
    o = F.scaled_dot_product_attention(qg, keys[:, :, : position + 1], values[:, :, : position + 1])
    return o.reshape(1, 1, heads * hd)


def reference_silu_mul(gate, up):
    return F.silu(gate) * up


def reference_gemv(x, weight, norm_weight, residual, eps, silu):
    """triton_fused.gemv in torch ops (the decoder's code for the same work)."""
    if norm_weight is not None:
        x = reference_rms_norm(x, None, norm_weight, eps)[1]
    elif silu:
        x = reference_silu_mul(*x.chunk(2, dim=-1))
    y = F.linear(x.reshape(1, 1, -1), weight)
    return y if residual is None else residual.reshape(1, 1, -1) + y


# The torch code of each kernel (same arguments): the probe's reference, and the tests' stand-ins.
REFERENCES = {
    "rms_norm": reference_rms_norm,
    "silu_mul": reference_silu_mul,
    "rope_qk_cache": reference_rope_qk_cache,
    "decode_attention": reference_decode_attention,
    "gemv": reference_gemv,
}


# --- where they run -------------------------------------------------------------------------------------


_USABLE: dict[tuple, bool] = {}


def wanted(device: torch.device, setting: bool | None = None) -> bool:
    """Whether the fused kernels are asked for on ``device``: ``setting`` (a model's own), else
    ``FUSED_KERNELS``, else on CUDA."""
    if setting is None:
        setting = FUSED_KERNELS
    return device.type == "cuda" if setting is None else setting


class Dims(NamedTuple):
    """The decoder's sizes the kernels are specialized for (the probe compiles those variants)."""

    hidden: int = 96
    intermediate: int = 160
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 128


SMALL = Dims()  # the probe's default: small, with the real head size


def usable(device: torch.device, dtype: torch.dtype, dims: Dims = SMALL, gemv: bool = False) -> bool:
    """Whether the kernels (``gemv``: the GEMV of the FUSED_GEMV option, only) run and answer right on
    (device, dtype): checked once (:func:`probe`), with the first model's ``dims``."""
    key = (device.type, device.index, dtype, gemv)
    if key not in _USABLE:
        _USABLE[key] = probe(device, dtype, dims, gemv)
    return _USABLE[key]


def probe(device: torch.device, dtype: torch.dtype, dims: Dims = SMALL, gemv: bool = False) -> bool:
    """Run every kernel once against :func:`reference_rms_norm` & co., on a few rows of the model's
    sizes: one row and several (decode, prefill), both forms of the decode attention. So Triton
    compiles here, once, the variants the model then uses (on a GPU's first start, a second each;
    then Triton's on-disk cache). A kernel that cannot run (no Triton, no compiler, an unsupported
    GPU) or answers wrongly: False, logged once."""
    what = "the fused GEMV" if gemv else "fused decoder kernels"
    try:
        error = _probe_error(device, dtype, dims, gemv)
    except Exception as exc:  # ImportError, a compile error, a CPU tensor outside the interpreter, ...
        log.warning(
            "%s unavailable on %s for %s (%s: %s); using the torch ops",
            what,
            device,
            dtype,
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "",
        )
        return False
    if error is not None:
        log.warning(
            "fused decoder kernels give wrong results on %s for %s (%s); using the torch ops", device, dtype, error
        )
        return False
    log.info("fused decoder kernels in use on %s for %s", device, dtype)
    return True


def _probe_error(device: torch.device, dtype: torch.dtype, dims: Dims = SMALL, gemv: bool = False) -> str | None:
    gen = torch.Generator().manual_seed(4321)
    hidden, inter, heads, kv, hd = dims
    max_len, rows = 8, 3

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    errors: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    with torch.inference_mode():
        weight = rand(hidden, scale=0.1) + 1
        for n in (1, rows):  # the decode step's one row, the prefill's several per program
            x, delta = rand(n, hidden), rand(n, hidden)
            for d in (None, delta):
                got, want = OPS.rms_norm(x, d, weight, 1e-6), reference_rms_norm(x, d, weight, 1e-6)
                errors += [("rms_norm residual", got[0], want[0]), ("rms_norm", got[1], want[1])]
            gate, up = rand(n, 2 * inter).split(inter, dim=-1)
            errors.append(("silu_mul", OPS.silu_mul(gate, up), F.silu(gate) * up))
        if gemv:  # the option's kernel, at the model's shapes: q/k/v with the norm, down with SiLU
            x, res = rand(1, 1, hidden), rand(1, 1, hidden)
            w_qkv, w_down = rand((heads + 2 * kv) * hd, hidden, scale=0.05), rand(hidden, inter, scale=0.05)
            gu, o, w_o = rand(1, 1, 2 * inter), rand(1, 1, heads * hd), rand(hidden, heads * hd, scale=0.05)
            cases = ((x, w_qkv, weight, None, 1e-6, False), (o, w_o, None, res, 0.0, False))
            for args in (*cases, (gu, w_down, None, res, 0.0, True)):
                errors.append(("gemv", OPS.gemv(*args), reference_gemv(*args)))
            return _first_error(errors, dtype)
        angles = torch.rand(max_len, hd, generator=gen) * 6
        cos, sin = angles.cos().to(device, dtype), angles.sin().to(device, dtype)
        qw, kw = rand(hd, scale=0.1) + 1, rand(hd, scale=0.1) + 1
        qkv = rand(rows, (heads + 2 * kv) * hd)
        q, k, v = qkv.split([heads * hd, kv * hd, kv * hd], dim=-1)
        keys, values = rand(1, kv, max_len, hd), rand(1, kv, max_len, hd)
        ref_keys, ref_values = keys.clone(), values.clone()
        start = 2
        rows_cos, rows_sin = cos[start : start + rows], sin[start : start + rows]
        got_q = OPS.rope_qk_cache(q, k, v, qw, kw, rows_cos, rows_sin, keys, values, start, 1e-6)
        want_q = reference_rope_qk_cache(q, k, v, qw, kw, rows_cos, rows_sin, ref_keys, ref_values, start, 1e-6)
        errors += [("rope_qk_cache q", got_q, want_q), ("rope_qk_cache k", keys, ref_keys)]
        errors.append(("rope_qk_cache v", values, ref_values))
        for splits in (1, 3):
            position = max_len - 2
            kc, vc, kr, vr = keys.clone(), values.clone(), keys.clone(), values.clone()
            pos = torch.tensor([position], device=device)
            got = OPS.decode_attention(q[:1], k[:1], v[:1], qw, kw, cos, sin, kc, vc, pos, 1e-6, splits)
            want = reference_decode_attention(q[:1], k[:1], v[:1], qw, kw, cos, sin, kr, vr, position, 1e-6)
            errors += [(f"decode_attention ({splits} split)", got, want), ("decode_attention cache", kc, kr)]
    return _first_error(errors, dtype)


def _first_error(errors: list[tuple[str, torch.Tensor, torch.Tensor]], dtype: torch.dtype) -> str | None:
    tolerance = _PROBE_TOLERANCE.get(dtype, 2e-2)
    for name, got, want in errors:
        if got.shape != want.shape or got.dtype != want.dtype:
            return f"{name}: {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}"
        err = float((got.float() - want.float()).abs().max())
        bound = tolerance * float(want.float().abs().max())
        if not err <= bound:  # also catches NaN
            return f"{name}: max error {err:.3g}, allowed {bound:.3g}"
    return None
