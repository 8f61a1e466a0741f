"""Qwen3 text decoder (docs/model.md §6): RMSNorm, attention with q/k norm + RoPE + GQA, SwiGLU MLP.

Module names follow the checkpoint's ``thinker.model.*`` tensors.

Fused projections: q/k/v and gate/up each run as ONE matmul. The per-module layers
(``q_proj`` ... ``up_proj``) stay what loading, quantization, adapters and ``state_dict`` see; a
:class:`Fusion` beside them holds the stacked weight, and the members' own weights are re-pointed
to row views of it, so every weight is stored once and an in-place change of a member (a merged
adapter, ``load_state_dict``) is a change of the fused weight. Plain ``nn.Linear`` members stack
their float weights; Int8Linear / Int4Linear members stack their integer tensors into one
unregistered quantized layer (``quant_rows.fuse_rows``). Anything else (an unmerged ``LoraLinear``, mixed
kinds or devices) runs member by member. A fusion is checked cheaply on every call (the members
are still the same modules) and fully at the start of every pass (``TextDecoder.refresh_fusion``:
same modules, same tensor addresses, same quantized-layer versions); whatever changed is planned
again. Moving or casting the model (``_apply``) drops the fusion, to be rebuilt on the next use.

Fused kernels (kernels/fused.py): where they run (CUDA by default), each layer is ``forward_fused``:
the residual add and the RMSNorm after it are one kernel, q/k norm + RoPE + the KV-cache write
another (in the decode step together with the attention over the filled cache), SiLU * up a third;
the projections stay what they are (float, int8/int4, adapters). The residual stream is carried as
``(h, delta)``, the add of each sublayer's output done by the next norm's kernel.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dictation.asr.config import TextDecoderConfig
from dictation.asr.heap import Arena
from dictation.asr.nn import quant_rows, quantized
from dictation.asr.nn.kernels import fused
from dictation.asr.nn.kv_cache import StaticKVCache
from dictation.asr.nn.options import DEFAULT_OPTIONS, ModelOptions
from dictation.asr.nn.rope import apply_rope

# The model's options (options.py) choose whether projections are fused (``fuse_projections``; False:
# every projection on its own, the plain path the fused one is tested against) and whether masked
# attention (later prefill chunks, extend, draft checks) folds GQA into rows instead of enable_gqa
# (``fold_masked_gqa``: None = on CUDA only, see Attention._folded_attention).


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32, cast back, then scale: the reference's exact order (docs/model.md §6.1).
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def stamp(module: nn.Module) -> tuple:
    """What a fusion (and a captured decode step, ``AsrModel.weights_key``) depends on in one module:
    its tensors' addresses and its quantized version."""
    tensors = [*module._parameters.values(), *module._buffers.values()]
    # From __dict__: getattr of a missing attribute goes through nn.Module.__getattr__ and raises (slow).
    return module.__dict__.get("version", 0), tuple(t.data_ptr() if t is not None else 0 for t in tensors)


def _adjacent_rows(members: Sequence[nn.Module]) -> torch.Tensor | None:
    """The members' weights as one ``[sum(out), in]`` tensor without copying, if they already are
    consecutive row blocks of one storage that holds nothing else (``TextDecoder.allocate_fused``)."""
    weights = [m.weight for m in members]
    storage = weights[0].untyped_storage()
    offset = 0
    for w in weights:
        if (
            w.untyped_storage().data_ptr() != storage.data_ptr()
            or w.storage_offset() != offset
            or not w.is_contiguous()
        ):
            return None
        offset += w.numel()
    if offset * weights[0].element_size() != storage.nbytes():
        return None
    rows = sum(w.shape[0] for w in weights)
    return weights[0].detach().as_strided((rows, weights[0].shape[1]), (weights[0].shape[1], 1), 0)


def _point_rows(members: Sequence[nn.Module], whole: torch.Tensor) -> None:
    """Make the members' weights consecutive row views of ``whole``, in order."""
    start = 0
    for m in members:
        m.weight.data = whole[start : start + m.out_features]
        start += m.out_features


class Fusion:
    """How one group of projections runs: ``weight`` (float, ``[sum(out), in]``) or ``layer`` (a
    fused quantized layer) for one matmul, neither for the members one by one."""

    def __init__(self, members: Sequence[nn.Module], enabled: bool) -> None:
        self.members = tuple(weakref.ref(m) for m in members)
        self.enabled = enabled
        self.sizes = [m.out_features for m in members]
        self.weight: torch.Tensor | None = None
        self.layer: nn.Module | None = None
        if enabled and _float_fusable(members):
            with torch.inference_mode(False), torch.no_grad():
                self.weight = _adjacent_rows(members)  # loaded in place (TextDecoder.allocate_fused)
                if self.weight is None:
                    self.weight = torch.cat([m.weight for m in members])
                _point_rows(members, self.weight)
        elif (
            enabled
            and isinstance(members[0], quantized.QUANT_MODULES)
            and all(members[0].fusable_with(m) for m in members)
        ):
            self.layer = quant_rows.fuse_rows(members)
        else:
            _unshare(members)
        self.stamps = tuple(stamp(m) for m in members)

    @property
    def fused(self) -> bool:
        return self.weight is not None or self.layer is not None

    def same_members(self, members: Sequence[nn.Module]) -> bool:
        return all(ref() is m for ref, m in zip(self.members, members, strict=True))

    def current(self, members: Sequence[nn.Module], enabled: bool) -> bool:
        return (
            enabled == self.enabled
            and self.same_members(members)
            and all(stamp(m) == s for m, s in zip(members, self.stamps, strict=True))
        )

    def run(self, x: torch.Tensor, members: Sequence[nn.Module]) -> Sequence[torch.Tensor]:
        if self.weight is not None:
            return F.linear(x, self.weight).split(self.sizes, dim=-1)
        if self.layer is not None:
            return self.layer(x).split(self.sizes, dim=-1)
        return [m(x) for m in members]


def _float_fusable(members: Sequence[nn.Module]) -> bool:
    first = members[0].weight if type(members[0]) is nn.Linear else None
    return (
        first is not None
        and first.device.type != "meta"
        and all(
            type(m) is nn.Linear
            and m.bias is None
            and not m.weight.requires_grad
            and m.weight.shape[1] == first.shape[1]
            and m.weight.dtype == first.dtype
            and m.weight.device == first.device
            for m in members
        )
    )


def _unshare(members: Sequence[nn.Module]) -> None:
    """Members that run one by one but still hold views of a fused weight whose other rows belong to
    no member any more (one was replaced, e.g. re-quantized) get their own copies, freeing those rows."""
    tensors = []  # (owner module, buffer name or None for a parameter, tensor)
    for m in members:
        while hasattr(m, "base") and isinstance(m.base, nn.Module):  # LoraLinear stacks
            m = m.base
        tensors += [(m, name, t) for name, t in m._parameters.items() if t is not None]
        tensors += [(m, name, t) for name, t in m._buffers.items() if t is not None]
    used: dict[int, int] = {}
    for _, _, t in tensors:
        key = t.untyped_storage().data_ptr()
        used[key] = used.get(key, 0) + t.numel() * t.element_size()
    for m, name, t in tensors:
        storage = t.untyped_storage()
        if storage.device.type != "meta" and used[storage.data_ptr()] < storage.nbytes():
            with torch.inference_mode(False), torch.no_grad():
                if name in m._parameters:
                    m._parameters[name].data = t.detach().clone()
                else:
                    m._buffers[name] = t.clone()
            if hasattr(m, "clear_cache"):
                m.clear_cache()


class _Projections(nn.Module):
    """A module whose ``GROUP`` of linear layers runs fused (see the module docstring)."""

    GROUP: tuple[str, ...] = ()

    def __init__(self, options: ModelOptions) -> None:
        super().__init__()
        self.options = options
        self.fusion: Fusion | None = None
        self.fuse = options.fuse_projections

    def _members(self) -> list[nn.Module]:
        return [self._modules[name] for name in self.GROUP]

    def refresh_fusion(self) -> bool:
        """Plan the group again if anything it depends on changed; True if it did."""
        members = self._members()
        if self.fusion is not None and self.fusion.current(members, self.fuse):
            return False
        self.fusion = None  # drop the old fused weight before building the new one
        self.fusion = Fusion(members, self.fuse)
        return True

    def project(self, x: torch.Tensor) -> Sequence[torch.Tensor]:
        members = self._members()
        if self.fusion is None or not self.fusion.same_members(members):
            self.refresh_fusion()
        return self.fusion.run(x, members)

    def _apply(self, fn, recurse: bool = True):
        self.fusion = None  # a move or cast gives every weight new storage: plan again at the next use
        return super()._apply(fn, recurse)


class Attention(_Projections):
    GROUP = ("q_proj", "k_proj", "v_proj")

    def __init__(self, cfg: TextDecoderConfig, options: ModelOptions = DEFAULT_OPTIONS) -> None:
        super().__init__(options)
        hd = cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * hd, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """``x [1, s, hidden]`` → q ``[1, heads, s, hd]``, k and v ``[1, kv_heads, s, hd]`` (RoPE applied)."""
        _, s, _ = x.shape
        q, k, v = self.project(x)
        q = self.q_norm(q.view(1, s, self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(k.view(1, s, self.n_kv_heads, self.head_dim)).transpose(1, 2)
        v = v.view(1, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: StaticKVCache,
        layer: int,
        at: int | torch.Tensor,
        mask: torch.Tensor | None = None,
        kernels: bool = False,
    ) -> torch.Tensor:
        """``x [1, s, hidden]``, ``cos``/``sin`` their RoPE rows ``[s, head_dim]``, at one of two kinds of
        positions. ``at`` an int: positions ``at .. at+s-1``, attention over the cache up to the last
        (prefill, extend). ``at`` the device positions ``[s]`` with ``mask [s, max_len]`` (bool): every
        shape fixed by the cache size, k/v written by index, attention over the whole cache with
        ``mask`` hiding what each row must not see (``AsrModel.forward_rows``, and with one row the
        static decode step). ``kernels``: q/k norm, RoPE and the cache write by the fused kernel
        (fused.py)."""
        if mask is not None:
            return self._rows(x, cos, sin, cache, layer, at, mask, kernels)
        start = at
        _, s, _ = x.shape
        if kernels:
            q, k, v = self.project(x)
            q = fused.rope_qk_cache(q, k, v, self.q_norm, self.k_norm, cos, sin, *cache.layer(layer), start)
            keys, values = cache.upto(layer, start + s)
        else:
            q, k, v = self._qkv(x, cos, sin)
            keys, values = cache.write(layer, start, k, v)
        mask = None
        if s > 1 and start > 0:
            # A later prefill chunk: causal within the chunk, everything before it visible.
            q_pos = torch.arange(start, start + s, device=x.device)[:, None]
            mask = torch.arange(start + s, device=x.device)[None, :] <= q_pos
            fold = self.options.fold_masked_gqa
            if fold if fold is not None else x.is_cuda:
                return self.o_proj(self._folded_attention(q, keys, values, mask))
        o = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, is_causal=(s > 1 and start == 0), enable_gqa=True
        )
        return self.o_proj(o.transpose(1, 2).reshape(1, s, self.n_heads * self.head_dim))

    def _folded_attention(self, q, keys, values, mask) -> torch.Tensor:
        """Masked attention with the query heads of each kv head folded into its rows (the device
        positions' path of :meth:`forward`, and later prefill chunks on CUDA): no ``enable_gqa``, which
        CUDA's memory-efficient kernel refuses (and flash refuses any mask), so that the math kernel
        with its full score matrix and repeated k/v does not take every later prefill chunk, extend
        and draft check. ``q [1, heads, s, hd]``, ``mask [s, L]`` → ``[1, s, heads * hd]``."""
        s = q.shape[2]
        group = self.n_heads // self.n_kv_heads
        q = q.reshape(1, self.n_kv_heads, group * s, self.head_dim)  # row g * s + i: head kv*group+g, token i
        # One row (the static decode step): its mask broadcasts over the group's rows as it is.
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask if s == 1 else mask.repeat(group, 1))
        # Only split the row dim (a view whatever o's strides): CUDA's kernels return o as a transpose
        # of [1, rows, kv_heads, hd] in memory, where merging kv_heads and group by a view is impossible.
        o = o.unflatten(2, (group, s))  # [1, kv_heads, group, s, hd]
        return o.permute(0, 3, 1, 2, 4).reshape(1, s, self.n_heads * self.head_dim)

    def _rows(self, x, cos, sin, cache: StaticKVCache, layer: int, positions, mask, kernels: bool) -> torch.Tensor:
        """:meth:`forward` at the device positions ``positions [s]``. GQA without repeating the cache:
        the query heads of one kv head become that head's rows (:meth:`_folded_attention`). With
        ``kernels``, q/k norm and RoPE by the fused kernel into a scratch k/v, copied into the cache
        by index (the kernel writes at a host position)."""
        if kernels:
            q, k, v = self.project(x)
            s = x.shape[1]
            k_rows = k.new_empty(1, self.n_kv_heads, s, self.head_dim)
            v_rows = v.new_empty(1, self.n_kv_heads, s, self.head_dim)
            q = fused.rope_qk_cache(q, k, v, self.q_norm, self.k_norm, cos, sin, k_rows, v_rows, 0)
            keys, values = cache.write_at(layer, positions, k_rows, v_rows)
        else:
            q, k, v = self._qkv(x, cos, sin)
            keys, values = cache.write_at(layer, positions, k, v)
        return self.o_proj(self._folded_attention(q, keys, values, mask))

    def forward_decode(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: StaticKVCache, layer: int, position
    ) -> torch.Tensor:
        """The decode step with the fused kernel (fused.py): one token ``x [1, 1, hidden]`` at the
        device position ``position [1]``, ``cos``/``sin`` the whole tables ``[max_len, head_dim]``;
        attention reads only the cache's filled positions, ``0 .. position``."""
        q, k, v = self.project(x)
        o = fused.decode_attention(q, k, v, self.q_norm, self.k_norm, cos, sin, *cache.layer(layer), position)
        return self.o_proj(o)


class MLP(_Projections):
    GROUP = ("gate_proj", "up_proj")

    def __init__(self, cfg: TextDecoderConfig, options: ModelOptions = DEFAULT_OPTIONS) -> None:
        super().__init__(options)
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, kernels: bool = False) -> torch.Tensor:
        gate, up = self.project(x)
        return self.down_proj(fused.silu_mul(gate, up) if kernels else F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TextDecoderConfig, options: ModelOptions = DEFAULT_OPTIONS) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, options)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, options)

    def forward(
        self, h: torch.Tensor, cos, sin, cache: StaticKVCache, layer: int, at, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The layer without the fused kernels; ``at`` and ``mask`` as in :meth:`Attention.forward`."""
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, cache, layer, at, mask)
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward_fused(
        self,
        h: torch.Tensor,
        delta: torch.Tensor | None,
        cos,
        sin,
        cache: StaticKVCache,
        layer: int,
        at,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer with the fused kernels: takes and returns the residual stream as ``(h, delta)``,
        whose sum it is (``delta`` None before the first layer); each add is done by the norm after it.
        ``at`` and ``mask`` as in :meth:`Attention.forward`, plus one more case: ``at`` one token's
        device position without a mask is the decode step (``Attention.forward_decode``, with the whole
        RoPE tables)."""
        h, x = fused.rms_norm(h, delta, self.input_layernorm)
        if mask is None and isinstance(at, torch.Tensor):
            attn = self.self_attn.forward_decode(x, cos, sin, cache, layer, at)
        else:
            attn = self.self_attn(x, cos, sin, cache, layer, at, mask, kernels=True)
        h, x = fused.rms_norm(h, attn, self.post_attention_layernorm)
        return h, self.mlp(x, kernels=True)

    def gemv_ready(self) -> bool:
        """Whether :meth:`forward_gemv` applies: fused float q/k/v and gate/up, float o and down."""
        attn, mlp = self.self_attn, self.mlp
        return (
            attn.fusion is not None
            and attn.fusion.weight is not None
            and mlp.fusion is not None
            and mlp.fusion.weight is not None
            and all(type(m) is nn.Linear and m.bias is None for m in (attn.o_proj, mlp.down_proj))
        )

    def forward_gemv(self, h: torch.Tensor, cos, sin, cache: StaticKVCache, layer: int, position) -> torch.Tensor:
        """:meth:`forward_fused` for one token with the projections through our GEMV (the FUSED_GEMV
        option, fused.py), each norm, SiLU * up and residual add folded into the GEMV next to it:
        5 kernels. Takes and returns the residual stream ``h``."""
        attn, mlp = self.self_attn, self.mlp
        q, k, v = fused.gemv(h, attn.fusion.weight, norm=self.input_layernorm).split(attn.fusion.sizes, dim=-1)
        o = fused.decode_attention(q, k, v, attn.q_norm, attn.k_norm, cos, sin, *cache.layer(layer), position)
        h = fused.gemv(o, attn.o_proj.weight, residual=h)
        gate_up = fused.gemv(h, mlp.fusion.weight, norm=self.post_attention_layernorm)
        return fused.gemv(gate_up, mlp.down_proj.weight, residual=h, silu=True)


class TextDecoder(nn.Module):
    """Embeddings → layers → final norm. The output head lives in :class:`AsrModel`."""

    def __init__(self, cfg: TextDecoderConfig, options: ModelOptions = DEFAULT_OPTIONS) -> None:
        super().__init__()
        self.cfg = cfg
        self.options = options
        # Given its table, nn.Embedding skips its own init: on the meta device (loading) normal_ runs
        # a Python reference kernel whose first use imports torch._dynamo (about 1 s of every load).
        table = torch.empty(cfg.vocab_size, cfg.hidden_size)
        if table.device.type != "meta":
            nn.init.normal_(table)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=table)
        self.layers = nn.ModuleList(DecoderLayer(cfg, options) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Bumped whenever a fusion is planned again: what a captured decode step read may be gone.
        self.weights_epoch = 0
        # The fused kernels (fused.py): None = fused.FUSED_KERNELS's choice, True / False force them;
        # and with them the decode step's GEMV option (None = fused.FUSED_GEMV).
        self.kernels: bool | None = None
        self.gemv: bool | None = None
        # Where the quantized layers' integer tensors live on the CPU (allocate_fused); the engine's
        # warm-up moves it into huge pages (heap.Arena.collapse).
        self.arena: Arena | None = None

    def path_key(self) -> tuple:
        """The settings that choose which code a step runs (fused kernels, GEMV, attention splits):
        part of what a captured CUDA graph is keyed on, so turning one of them replays no graph
        captured with the other code."""
        return (self.kernels, self.gemv, fused.FUSED_KERNELS, fused.FUSED_GEMV, fused.ATTENTION_SPLITS)

    def uses_kernels(self, h: torch.Tensor) -> bool:
        """Whether the layers run the fused kernels for activations like ``h`` (asked for on its device,
        and checked there once: fused.usable)."""
        if not (fused.wanted(h.device, self.kernels) and self.norm.weight.dtype == h.dtype):
            return False
        return fused.usable(h.device, h.dtype, self._dims())

    def uses_gemv(self, h: torch.Tensor) -> bool:
        """Whether the fused decode step runs its projections through our GEMV (``gemv``, the FUSED_GEMV
        option; every layer's weights float and fused, and the kernel checked on this device)."""
        return (
            (self.gemv if self.gemv is not None else fused.FUSED_GEMV)
            and self.uses_kernels(h)
            and all(layer.gemv_ready() for layer in self.layers)
            and fused.usable(h.device, h.dtype, self._dims(), gemv=True)
        )

    def _dims(self) -> fused.Dims:
        c = self.cfg
        return fused.Dims(c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: StaticKVCache,
        at: int | torch.Tensor,
        mask: torch.Tensor | None = None,
        last_only: bool = True,
    ) -> torch.Tensor:
        """Run ``h [1, s, hidden]`` through every layer (``at`` and ``mask`` as in :meth:`Attention.forward`:
        a host start, or device positions with a mask); returns the final-normed last position (every
        position unless ``last_only``)."""
        if self.uses_kernels(h):
            delta = None
            for i, layer in enumerate(self.layers):
                h, delta = layer.forward_fused(h, delta, cos, sin, cache, i, at, mask)
            if last_only:
                h, delta = h[:, -1:], delta[:, -1:]
            return fused.rms_norm(h, delta, self.norm)[1]
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, cache, i, at, mask)
        return self.norm(h[:, -1:] if last_only else h)

    def forward_fused_step(self, h, cos, sin, cache: StaticKVCache, position) -> torch.Tensor:
        """The decode step with the fused kernels: one token ``h [1, 1, hidden]`` at the device
        position ``position [1]``, ``cos``/``sin`` the whole RoPE tables; attention reads only the
        filled part of the cache (``Attention.forward_decode``). With the GEMV option, 5 kernels a layer."""
        if self.uses_gemv(h):
            for i, layer in enumerate(self.layers):
                h = layer.forward_gemv(h, cos, sin, cache, i, position)
            return fused.rms_norm(h, None, self.norm)[1]
        delta = None
        for i, layer in enumerate(self.layers):
            h, delta = layer.forward_fused(h, delta, cos, sin, cache, i, position)
        return fused.rms_norm(h, delta, self.norm)[1]

    def _groups(self) -> list[_Projections]:
        return [g for layer in self.layers for g in (layer.self_attn, layer.mlp)]

    def use_options(self, options: ModelOptions) -> None:
        """Run with ``options`` from now on (AsrModel.options): fused or not as they say, and the fused
        quantized layers (not submodules) told too."""
        self.options = options
        if any(group.fuse != options.fuse_projections for group in self._groups()):
            self.set_fusion(options.fuse_projections)
        for layer in self.fused_layers():
            layer.options = options

    def set_fusion(self, enabled: bool) -> None:
        """Fuse the q/k/v and gate/up projections (the default) or run each on its own."""
        for group in self._groups():
            group.fuse = enabled
        self.refresh_fusion()

    def refresh_fusion(self) -> bool:
        """Bring every layer's fusion up to date with its weights (start of every pass; cheap when
        nothing changed); True if any was planned again."""
        changed = False
        for group in self._groups():
            changed |= group.refresh_fusion()
        if changed:
            self.weights_epoch += 1
        return changed

    def allocate_fused(self) -> None:
        """Give each group of plain float projections one uninitialised ``[sum(out), in]`` tensor and
        make the members' weights its row views, so that loading writes straight into the fused
        layout: the fusion then adopts it instead of concatenating (no copy, no transient second
        copy of most of the decoder). Quantized groups get their rows the same way; on the CPU every
        quantized layer's integer tensors come from one fresh mapping (heap.Arena, which a decode
        step reads faster). Called by ``weights.load_model`` before it fills the weights."""
        quantized_layers = [m for m in self.modules() if isinstance(m, quantized.QUANT_MODULES)]
        arena = None
        if quantized_layers and all(m.weight_device().type == "cpu" for m in quantized_layers):
            arena = self.arena = Arena(quant_rows.integer_bytes(quantized_layers))
        placed: set[int] = set()
        for group in self._groups():
            members = group._members()
            if group.fuse and isinstance(members[0], quantized.QUANT_MODULES):
                # a pre-quantized folder, or quantized as it is read
                if quant_rows.allocate_rows(members, arena):
                    placed.update(id(m) for m in members)
                continue
            if not (group.fuse and _float_fusable(members)) or _adjacent_rows(members) is not None:
                continue
            first = members[0].weight
            with torch.inference_mode(False), torch.no_grad():
                rows = sum(m.out_features for m in members)
                _point_rows(members, torch.empty(rows, first.shape[1], dtype=first.dtype, device=first.device))
        if arena is not None:
            for layer in quantized_layers:
                if id(layer) not in placed:
                    quant_rows.place_in_arena(layer, arena)

    def fused_layers(self) -> list[nn.Module]:
        """The fused quantized layers, which are not submodules (for memory accounting)."""
        return [g.fusion.layer for g in self._groups() if g.fusion is not None and g.fusion.layer is not None]

    def fused_groups(self) -> tuple[int, int]:
        """(groups fused, groups) over all layers."""
        groups = self._groups()
        return sum(1 for g in groups if g.fusion is not None and g.fusion.fused), len(groups)

    def _apply(self, fn, recurse: bool = True):
        self.weights_epoch += 1
        return super()._apply(fn, recurse)
