"""The whole network: audio tower + text decoder + output head, with prefill and one-token steps."""

from __future__ import annotations

import torch
from torch import nn

from dictation.asr.config import AsrConfig
from dictation.asr.decoder import TextDecoder
from dictation.asr.encoder import AudioEncoder
from dictation.asr.kv_cache import StaticKVCache
from dictation.asr.rope import rope_tables

# Prompts longer than this are prefilled in pieces, so attention memory stays bounded for
# 20-minute clips (15,600 audio tokens) on any device.
PREFILL_CHUNK = 1024
# Positions reserved for generated tokens at prefill; the cache grows in steps of this size.
DECODE_RESERVE = 512
CACHE_ROUND = 512


class AsrModel(nn.Module):
    def __init__(self, cfg: AsrConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.audio_tower = AudioEncoder(cfg.audio)
        self.decoder = TextDecoder(cfg.text)
        # Tie rule (spec §2.1): text_config.tie_word_embeddings decides; a stored lm_head is then ignored.
        self.lm_head = (
            None if cfg.text.tie_word_embeddings else nn.Linear(cfg.text.hidden_size, cfg.text.vocab_size, bias=False)
        )
        self.cache: StaticKVCache | None = None
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def output_weight(self) -> torch.Tensor:
        return self.decoder.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.decoder.embed_tokens.weight.device

    def ensure_capacity(self, max_len: int) -> StaticKVCache:
        """Grow the KV cache and RoPE tables to ``max_len`` positions, keeping what is stored."""
        if self.cache is None or self.cache.max_len < max_len:
            t = self.cfg.text
            # Round up so slightly longer clips reuse the buffer.
            size = -(-max_len // CACHE_ROUND) * CACHE_ROUND
            old = self.cache
            self.cache = StaticKVCache(
                t.num_hidden_layers, t.num_key_value_heads, t.head_dim, size, self.dtype, self.device
            )
            if old is not None:
                self.cache.copy_from(old)
            cos, sin = rope_tables(torch.arange(size, device=self.device), t.head_dim, t.rope_theta)
            self._rope = (cos.to(self.dtype), sin.to(self.dtype))
        return self.cache

    def release_cache(self) -> None:
        self.cache = None
        self._rope = None

    def embed_prompt(self, prompt_ids: torch.Tensor, audio_embeds: torch.Tensor) -> torch.Tensor:
        """``[S]`` ids → ``[1, S, hidden]``, audio pad rows replaced in order by the audio embeddings."""
        h = self.decoder.embed_tokens(prompt_ids)
        is_audio = prompt_ids == self.cfg.special.audio_token_id
        n_pad = int(is_audio.sum())
        if n_pad != audio_embeds.shape[0]:
            raise ValueError(f"prompt has {n_pad} audio pads but the encoder gave {audio_embeds.shape[0]} tokens")
        h[is_audio] = audio_embeds.to(h.dtype)
        return h.unsqueeze(0)

    def logits(self, h_last: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden ``[1, 1, hidden]`` → logits ``[vocab]`` in the model dtype."""
        return (h_last @ self.output_weight.T).reshape(-1)

    def _run(self, h: torch.Tensor, start: int) -> torch.Tensor:
        assert self.cache is not None and self._rope is not None
        cos, sin = self._rope
        stop = start + h.shape[1]
        return self.decoder(h, cos[start:stop], sin[start:stop], self.cache, start)

    @torch.inference_mode()
    def prefill(self, embeds: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Fill the cache with the prompt ``[1, S, hidden]``; return the last position's logits."""
        total = embeds.shape[1]
        # Room for the usual output; decoding grows the cache if a long text needs more.
        self.ensure_capacity(total + min(max_new_tokens, DECODE_RESERVE) + 1)
        h_last = None
        for start in range(0, total, PREFILL_CHUNK):
            h_last = self._run(embeds[:, start : start + PREFILL_CHUNK], start)
        return self.logits(h_last)

    @torch.inference_mode()
    def step(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """One token ``[1]`` at ``position`` → logits ``[vocab]``."""
        if position >= self.cache.max_len:
            self.ensure_capacity(position + DECODE_RESERVE)
        h = self.decoder.embed_tokens(token).view(1, 1, -1)
        return self.logits(self._run(h, position))
