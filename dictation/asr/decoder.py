"""Qwen3 text decoder (spec §5): RMSNorm, attention with q/k norm + RoPE + GQA, SwiGLU MLP.

Module names follow the checkpoint's ``thinker.model.*`` tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dictation.asr.config import TextDecoderConfig
from dictation.asr.kv_cache import StaticKVCache
from dictation.asr.rope import apply_rope


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32, cast back, then scale: the reference's exact order (spec §5.2).
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: TextDecoderConfig) -> None:
        super().__init__()
        hd = cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * hd, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: StaticKVCache, layer: int, start: int
    ) -> torch.Tensor:
        """``x [1, s, hidden]`` at positions ``start .. start+s-1``; cos/sin ``[s, head_dim]``."""
        _, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(1, s, self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(1, s, self.n_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(1, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = cache.write(layer, start, k, v)
        mask = None
        if s > 1 and start > 0:
            # A later prefill chunk: causal within the chunk, everything before it visible.
            q_pos = torch.arange(start, start + s, device=x.device)[:, None]
            mask = torch.arange(start + s, device=x.device)[None, :] <= q_pos
        o = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, is_causal=(s > 1 and start == 0), enable_gqa=True
        )
        return self.o_proj(o.transpose(1, 2).reshape(1, s, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: TextDecoderConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TextDecoderConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: StaticKVCache, layer: int, start: int
    ) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, cache, layer, start)
        return h + self.mlp(self.post_attention_layernorm(h))


class TextDecoder(nn.Module):
    """Embeddings → layers → final norm. The output head lives in :class:`AsrModel`."""

    def __init__(self, cfg: TextDecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: StaticKVCache, start: int
    ) -> torch.Tensor:
        """Run ``h [1, s, hidden]`` through every layer; returns the final-normed last position."""
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, cache, i, start)
        return self.norm(h[:, -1:])
