"""Audio encoder ("AuT", spec §4): chunked conv stack, per-chunk positions, windowed attention.

Module names follow the checkpoint (``audio_tower.conv2d1``, ``layers.N.self_attn.q_proj`` ...),
so loading is a prefix map.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dictation.asr.config import AudioEncoderConfig
from dictation.asr.features import conv_out_len, n_audio_tokens

# Chunks per conv batch: a memory bound (no numeric effect). 100 one-second chunks of the first
# conv's output are 600 MB in fp32; the checkpoint's 500 would be 3 GB for long clips.
CONV_BATCH = 100


def sinusoid_table(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """``[length, channels]``: sin block then cos block (spec §4.2), computed in float32."""
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-increment * torch.arange(channels // 2).float())
    t = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class EncoderAttention(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.encoder_attention_heads
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, window: int) -> torch.Tensor:
        """Bidirectional attention inside consecutive blocks of ``window`` tokens, none across.

        Full windows go through one batched SDPA call; the shorter tail window through a second.
        """
        n, d = x.shape
        heads = self.n_heads

        def split(t: torch.Tensor) -> torch.Tensor:  # [n_win, w, d] -> [n_win, heads, w, hd]
            return t.view(t.shape[0], t.shape[1], heads, d // heads).transpose(1, 2)

        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        n_full = (n // window) * window
        parts = []
        for start, stop, w in ((0, n_full, window), (n_full, n, n - n_full)):
            if stop == start:
                continue
            shape = ((stop - start) // w, w, d)
            o = F.scaled_dot_product_attention(
                split(q[start:stop].reshape(shape)),
                split(k[start:stop].reshape(shape)),
                split(v[start:stop].reshape(shape)),
            )
            parts.append(o.transpose(1, 2).reshape(stop - start, d))
        return self.out_proj(torch.cat(parts) if len(parts) > 1 else parts[0])


class EncoderLayer(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.self_attn = EncoderAttention(cfg)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, h: torch.Tensor, window: int) -> torch.Tensor:
        h = h + self.self_attn(self.self_attn_layer_norm(h), window)
        h = h + self.fc2(F.gelu(self.fc1(self.final_layer_norm(h))))
        if h.dtype == torch.float16:
            limit = torch.finfo(torch.float16).max - 1000
            h = h.clamp(-limit, limit)
        return h


class AudioEncoder(nn.Module):
    """Log-mel ``[n_mels, T]`` → audio embeddings ``[n_audio_tokens(T), output_dim]``."""

    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        ch = cfg.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, ch, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(ch, ch, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(ch, ch, 3, 2, padding=1)
        freq_out = conv_out_len(cfg.num_mel_bins)
        self.conv_out = nn.Linear(ch * freq_out, cfg.d_model, bias=False)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.ln_post = nn.LayerNorm(cfg.d_model)
        self.proj1 = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj2 = nn.Linear(cfg.d_model, cfg.output_dim)
        # Only conv_out_len(chunk) rows are ever used; not part of the checkpoint. On the meta device
        # (loading) it stays empty until reset_buffers: computing it there would run torch's Python
        # meta kernels, whose first use imports torch._dynamo (about 1 s of every load).
        rows = conv_out_len(cfg.chunk_frames)
        self.register_buffer("positions", torch.empty(rows, cfg.d_model), persistent=False)
        if self.positions.device.type != "meta":
            self.reset_buffers()

    def _position_table(self, device: torch.device | None = None) -> torch.Tensor:
        rows = conv_out_len(self.cfg.chunk_frames)
        return sinusoid_table(rows, self.cfg.d_model).to(device)

    def reset_buffers(self) -> None:
        """Recompute the position table (after construction on the meta device)."""
        self.positions = self._position_table(self.conv_out.weight.device)

    def conv_tokens(self, features: torch.Tensor, clip_frames: int | None = None) -> torch.Tensor:
        """Conv stack per 1-s chunk, positions restarting every chunk, valid rows gathered.

        ``clip_frames``: the length of the whole clip when ``features`` is a part of it that starts at
        a chunk boundary (the padding width depends on the clip, not on the part).
        """
        n_mels, frames = features.shape
        c = self.cfg.chunk_frames
        clip = frames if clip_frames is None else clip_frames
        width = c if clip >= c else clip  # every chunk is padded to the longest one
        n_chunks = -(-frames // width)
        x = F.pad(features, (0, n_chunks * width - frames))
        x = x.view(n_mels, n_chunks, width).permute(1, 0, 2).unsqueeze(1).contiguous()  # [n_chunks, 1, n_mels, width]
        outs = []
        for part in x.split(min(self.cfg.conv_chunksize, CONV_BATCH)):
            y = F.gelu(self.conv2d1(part))
            y = F.gelu(self.conv2d2(y))
            y = F.gelu(self.conv2d3(y))  # [n, ch, 16, t]
            n, ch, f, t = y.shape
            outs.append(self.conv_out(y.permute(0, 3, 1, 2).contiguous().view(n, t, ch * f)))
        y = torch.cat(outs) if len(outs) > 1 else outs[0]  # [n_chunks, t, d]
        y = y + self.positions[: y.shape[1]].to(y.dtype)
        # Only the last chunk is padded and its valid rows come first, so a flat prefix is exact.
        n_tokens = n_audio_tokens(frames, c)
        return y.reshape(-1, y.shape[-1])[:n_tokens]

    def attention_window(self, frames: int) -> int:
        """Tokens per attention block: 104 (8 s) for clips of at least a chunk (spec §4.4)."""
        c = self.cfg.chunk_frames
        per_chunk = conv_out_len(c if frames >= c else frames)
        return per_chunk * (self.cfg.n_window_infer // c)

    @property
    def window_frames(self) -> int:
        """Mel frames per attention window (800 = 8 s): the encoder never looks across these."""
        return self.cfg.n_window_infer

    def forward(self, features: torch.Tensor, clip_frames: int | None = None) -> torch.Tensor:
        """Features ``[n_mels, T]`` of a clip → its audio embeddings.

        With ``clip_frames``, ``features`` are the frames of a clip of that length from a multiple of
        :attr:`window_frames` on (whole attention windows and possibly the clip's tail): the result
        is those windows' rows of the whole clip's embeddings, since nothing crosses a window.
        """
        frames = features.shape[-1]
        clip = frames if clip_frames is None else clip_frames
        h = self.conv_tokens(features.to(self.conv2d1.weight.dtype), clip)
        expected = n_audio_tokens(frames, self.cfg.chunk_frames)
        assert h.shape[0] == expected, f"encoder produced {h.shape[0]} tokens, expected {expected}"
        window = self.attention_window(clip)
        for layer in self.layers:
            h = layer(h, window)
        return self.proj2(F.gelu(self.proj1(self.ln_post(h))))
