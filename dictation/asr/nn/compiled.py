"""The decode step compiled by ``torch.compile``: an option beside the fused Triton kernels.

Inductor fuses the step's elementwise work into a few generated kernels, as gpt-fast does: static
shapes (the cache size), ``fullgraph=True``, compiled at the first use (the warm-up's decode step:
tens of seconds for the real models on a GPU the first time, then Inductor's on-disk cache), and
captured in the CUDA graph like the other steps (graphs.DecodeGraph). Off by default: set
``AsrModel.compile_step`` (or ``DICTATION_COMPILE_STEP=1``); ``dictation bench --decode-steps
compiled`` times it beside the default step.

The compiled function is pure: it takes the weights, the cache and the tables as arguments and
returns the logits and the token's k/v per layer, which one ``index_copy_`` per cache tensor then
writes (a cache written inside the graph would be copied whole by Inductor's functionalization).
Attention covers the whole static cache under a mask (positions before the token) plus the token's
own k/v, in float32.

It applies to float decoder weights only (the fused projections of decoder.py, plain linear layers);
a quantized model, unmerged adapters or a failed compile use the default step, with one log line.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

# The default of AsrModel.compile_step.
COMPILE_STEP: bool = os.environ.get("DICTATION_COMPILE_STEP", "").strip().lower() in ("1", "true", "yes", "on")


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def decode_step(
    token: torch.Tensor,
    position: torch.Tensor,
    layers: Sequence[Sequence[torch.Tensor]],
    embed: torch.Tensor,
    norm: torch.Tensor,
    head: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    heads: int,
    kv_heads: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token ``token [1]`` at the device position ``position [1]`` through the decoder, in torch
    ops only (what is compiled): returns the logits ``[vocab]`` and the token's keys and values per
    layer, ``[layers, 1, kv_heads, 1, head_dim]``, for the caller to write into the cache.

    ``layers``: per layer (input norm, fused q/k/v, q norm, k norm, o, post-attention norm, fused
    gate/up, down) weights; ``keys``/``values`` the cache ``[layers, 1, kv_heads, max_len, head_dim]``
    (read only), ``cos``/``sin`` the RoPE tables, ``positions`` ``0 .. max_len-1``."""
    hd = keys.shape[-1]
    group = heads // kv_heads
    dtype = embed.dtype
    c, s = cos.index_select(0, position), sin.index_select(0, position)  # [1, hd]
    before = (positions < position).view(1, 1, -1)  # cached positions the token attends to
    h = F.embedding(token, embed)  # [1, hidden]
    new_k, new_v = [], []
    for i, (w_in, w_qkv, w_qn, w_kn, w_o, w_post, w_gu, w_down) in enumerate(layers):
        q, k, v = F.linear(_rms(h, w_in, eps), w_qkv).split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
        q = _rope(_rms(q.view(heads, hd), w_qn, eps), c, s).view(kv_heads, group, 1, hd).float()
        k = _rope(_rms(k.view(kv_heads, hd), w_kn, eps), c, s)
        v = v.view(kv_heads, hd)
        new_k.append(k)
        new_v.append(v)
        cached_k = keys[i, 0].float()[:, None]  # [kv, 1, max_len, hd]
        scores = (q * cached_k).sum(-1) * hd**-0.5  # [kv, group, max_len]
        scores = scores.masked_fill(~before, float("-inf"))
        own = (q[:, :, 0] * k.float()[:, None]).sum(-1, keepdim=True) * hd**-0.5  # [kv, group, 1]
        top = torch.maximum(scores.amax(-1, keepdim=True), own)
        p, p_own = (scores - top).exp(), (own - top).exp()
        o = (p[..., None] * values[i, 0].float()[:, None]).sum(-2) + p_own * v.float()[:, None]
        o = (o / (p.sum(-1, keepdim=True) + p_own)).to(dtype).reshape(1, heads * hd)
        h = h + F.linear(o, w_o)
        gate, up = F.linear(_rms(h, w_post, eps), w_gu).chunk(2, dim=-1)
        h = h + F.linear(F.silu(gate) * up, w_down)
    logits = F.linear(_rms(h, norm, eps), head).view(-1)
    shape = (len(new_k), 1, kv_heads, 1, hd)
    return logits, torch.stack(new_k).view(shape), torch.stack(new_v).view(shape)


def step_arguments(model) -> tuple | str:
    """The weights :func:`decode_step` takes from ``model`` (an AsrModel), or why it cannot."""
    decoder = model.decoder
    layers = []
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for group in (attn, mlp):
            if group.fusion is None:  # planned at the start of every pass; here only if never used yet
                group.refresh_fusion()
        if attn.fusion.weight is None or mlp.fusion.weight is None:
            kinds = {type(m).__name__ for g in (attn, mlp) for m in g._members()}
            return f"the projections are {', '.join(sorted(kinds))}, not fused float weights"
        if type(attn.o_proj) is not nn.Linear or type(mlp.down_proj) is not nn.Linear:
            return f"o_proj/down_proj are {type(attn.o_proj).__name__}/{type(mlp.down_proj).__name__}"
        if mlp.gate_proj.out_features != mlp.up_proj.out_features:
            return "gate and up differ in size"
        weights = (
            layer.input_layernorm.weight,
            attn.fusion.weight,
            attn.q_norm.weight,
            attn.k_norm.weight,
            attn.o_proj.weight,
            layer.post_attention_layernorm.weight,
            mlp.fusion.weight,
            mlp.down_proj.weight,
        )
        layers.append(tuple(w.detach() for w in weights))
    head = model.output_weight
    if not head.is_floating_point():
        return "the output head is not a float weight"
    cache = model.cache
    cos, sin = model._rope
    return (
        tuple(layers),
        decoder.embed_tokens.weight.detach(),
        decoder.norm.weight.detach(),
        head.detach(),
        cache.keys,
        cache.values,
        cos,
        sin,
        cache.positions,
        decoder.cfg.num_attention_heads,
        decoder.cfg.num_key_value_heads,
        decoder.norm.eps,
    )


class CompiledStep:
    """:func:`decode_step` compiled once per process shape (``torch.compile``, static shapes, no graph
    breaks), and the cache write after it. ``kernels``: the kernels Inductor generated for the last
    compile (Inductor's metric; restored from its cache on a cache hit), matrix products (library
    calls) not included."""

    _compiled = None  # one per process: Dynamo caches per code object anyway

    def __init__(self) -> None:
        if CompiledStep._compiled is None:
            CompiledStep._compiled = torch.compile(decode_step, fullgraph=True, dynamic=False)
        self.kernels: int | None = None

    def __call__(self, model, token: torch.Tensor, position: torch.Tensor, arguments: tuple) -> torch.Tensor:
        from torch._inductor import metrics

        before = metrics.generated_kernel_count
        logits, new_k, new_v = CompiledStep._compiled(token, position, *arguments)
        if metrics.generated_kernel_count != before:  # compiled (or loaded from Inductor's cache) just now
            self.kernels = metrics.generated_kernel_count - before
        model.cache.keys.index_copy_(3, position, new_k)
        model.cache.values.index_copy_(3, position, new_v)
        return logits


def run(model, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor | None:
    """The compiled step's logits for ``model`` (AsrModel.static_step), or None where it does not
    apply or failed to compile (logged once per model; the caller then runs the default step)."""
    if model.compiled_step is False:
        return None
    arguments = step_arguments(model)
    if isinstance(arguments, str):
        if model.compiled_step is None:
            log.warning("the compiled decode step needs float decoder weights (%s); using the default step", arguments)
            model.compiled_step = False
        return None
    step = model.compiled_step or CompiledStep()
    try:
        logits = step(model, token, position, arguments)
    except Exception as exc:  # no C++ compiler / Triton, an Inductor error, a graph break
        log.warning(
            "compiling the decode step failed (%s: %s); using the default step",
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "",
        )
        model.compiled_step = False
        return None
    model.compiled_step = step
    return logits
