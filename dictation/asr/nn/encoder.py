"""Audio encoder ("AuT", docs/model.md §5): chunked conv stack, per-chunk positions, windowed attention.

Module names follow the checkpoint (``audio_tower.conv2d1``, ``layers.N.self_attn.q_proj`` ...),
so loading is a prefix map.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dictation.asr.config import AudioEncoderConfig
from dictation.asr.heap import release_freed_memory
from dictation.asr.nn.features import conv_out_len, n_audio_tokens
from dictation.asr.nn.options import DEFAULT_OPTIONS, ModelOptions

# Chunks per conv batch (options.conv_batch): a memory bound (no numeric effect). 100 one-second chunks
# of the first conv's output are 600 MB in fp32; the checkpoint's 500 would be 3 GB for long clips.
# On the CPU (options.conv_batch_cpu), where nothing is captured and the conv stack runs at the same
# speed a chunk pair at a time: 2 chunks per call. A 10-s clip's conv stack then adds 57 MiB at its
# peak rather than 126 MiB (0.6B, fp32, 2 threads; 477 against 508 ms), and the encoder's peak is what
# the transcription's is.
#
# Buckets: on CUDA a clip of at least one chunk is encoded padded to the smallest of these
# numbers of 8-s attention windows that holds it, as one CUDA graph per bucket (graphs.StaticCall), so
# that what is left of the encoder at release is a few launches. Longer clips run uncaptured, padded
# to whole windows. The padding is exact: chunks, rows and windows are computed independently (the
# CPU tests check bucketed == unpadded bit for bit in fp32) and padded keys are masked.
# Up to 32 s: dictation's usual lengths; each bucket's graph keeps its activations (one pool shared by
# all buckets, the largest bucket's size: ~0.1 GB for 1.7B in bf16 with the conv run a window at a time).
# Whether a clip is bucketed (options.encoder_bucketed; None: on CUDA, unpadded elsewhere: fewer rows,
# faster on a CPU) and captured (options.encoder_graph): the model's options (options.py).
ENCODER_BUCKETS = (1, 2, 3, 4)
# On the CPU the three conv weights are kept channels-last (options.channels_last_on_cpu): oneDNN then
# runs the 480-channel stride-2 convs, a third of the 0.6B encoder's time, about 20 % faster (measured:
# the convs of a 10-s clip, 2 cores, 380 -> 300 ms; the official encoder keeps PyTorch's default
# layout). The results differ from the default layout's only by float rounding (3e-7 on that clip),
# and a chunk's rows stay the same whatever batch of chunks it runs in (AudioEncoder._first_conv).
# CUDA keeps the default layout (unmeasured there).


def sinusoid_table(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """``[length, channels]``: sin block then cos block (docs/model.md §5.2), computed in float32."""
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

    def forward(self, x: torch.Tensor, window: int, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Bidirectional attention inside consecutive blocks of ``window`` tokens, none across.

        All windows go through one batched SDPA call: a shorter tail window is padded to ``window``
        rows (only inside the attention) and its padded keys hidden by ``key_mask``
        (``[n_windows, 1, 1, window]`` bool, :func:`window_key_mask`), so that a clip padded to more
        windows (``AudioEncoder.forward_bucketed``) computes its rows exactly as the clip alone.
        """
        n, d = x.shape
        heads = self.n_heads
        rows = -(-n // window) * window

        def split(t: torch.Tensor) -> torch.Tensor:  # [rows, d] -> [n_win, heads, window, hd]
            t = F.pad(t, (0, 0, 0, rows - n)) if rows != n else t
            return t.view(rows // window, window, heads, d // heads).transpose(1, 2)

        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        o = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=key_mask)
        o = o.transpose(1, 2).reshape(rows, d)
        return self.out_proj(o[:n] if rows != n else o)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.self_attn = EncoderAttention(cfg)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.encoder_ffn_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_dim, cfg.d_model)
        self.final_layer_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, h: torch.Tensor, window: int, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = h + self.self_attn(self.self_attn_layer_norm(h), window, key_mask)
        h = h + self.fc2(F.gelu(self.fc1(self.final_layer_norm(h))))
        if h.dtype == torch.float16:
            limit = torch.finfo(torch.float16).max - 1000
            h = h.clamp(-limit, limit)
        return h


def window_key_mask(n_valid: int | torch.Tensor, rows: int, window: int, device: torch.device) -> torch.Tensor:
    """``[rows // window, 1, 1, window]`` bool: which keys a query of each window sees. The first
    ``n_valid`` rows are the clip; keys past them are hidden, except in windows holding no row of the
    clip, which see themselves (their rows are dropped; this keeps them finite). ``n_valid`` may be a
    0-d device tensor (a captured graph's input)."""
    index = torch.arange(rows, device=device)
    starts = (index // window) * window
    return ((index < n_valid) | (starts >= n_valid)).view(rows // window, 1, 1, window)


class AudioEncoder(nn.Module):
    """Log-mel ``[n_mels, T]`` → audio embeddings ``[n_audio_tokens(T), output_dim]``."""

    def __init__(self, cfg: AudioEncoderConfig, options: ModelOptions = DEFAULT_OPTIONS) -> None:
        super().__init__()
        self.cfg = cfg
        self.options = options
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
        self._channels_last = False  # set by reset_buffers: the conv weights' layout
        if self.positions.device.type != "meta":
            self.reset_buffers()
        # Bucketed encoders (graphs.StaticCall) by number of windows, with the weights' stamp they
        # were made for; dropped by a move or cast (_apply).
        self._graphs: dict[int, object] = {}
        self._graphs_key: tuple | None = None
        self._graph_pool = None  # one memory pool for all of them: they never run at the same time

    def _position_table(self, device: torch.device | None = None) -> torch.Tensor:
        rows = conv_out_len(self.cfg.chunk_frames)
        return sinusoid_table(rows, self.cfg.d_model).to(device)

    def reset_buffers(self) -> None:
        """Recompute the position table and lay the conv weights out for their device (after
        construction on the meta device and loading the weights)."""
        self.positions = self._position_table(self.conv2d1.weight.device)
        self._lay_out_convs()

    def _lay_out_convs(self) -> None:
        self._channels_last = self.options.channels_last_on_cpu and self.conv2d1.weight.device.type == "cpu"
        layout = torch.channels_last if self._channels_last else torch.contiguous_format
        for conv in (self.conv2d1, self.conv2d2, self.conv2d3):
            conv.to(memory_format=layout)

    def use_options(self, options: ModelOptions) -> None:
        """Run with ``options`` from now on (AsrModel.options): where the capture or the conv layout
        changes, the conv weights laid out again and the captured buckets dropped."""
        old, self.options = self.options, options
        if (old.encoder_graph, old.channels_last_on_cpu) != (options.encoder_graph, options.channels_last_on_cpu):
            self.release_graphs()
            if self.conv2d1.weight.device.type != "meta":
                self._lay_out_convs()

    def _first_conv(self, part: torch.Tensor) -> torch.Tensor:
        """``conv2d1`` on a batch of chunks. With channels-last weights oneDNN computes a batch of one
        chunk in another order than larger batches (the same up to float rounding), so one chunk runs
        padded to two: a chunk's rows must not depend on what it was batched with (streaming encodes a
        window at a time, ``transcribe`` the whole clip; tests/asr/test_buckets.py)."""
        if self._channels_last and part.shape[0] == 1:
            return self.conv2d1(torch.cat([part, torch.zeros_like(part)]))[:1]
        return self.conv2d1(part)

    def conv_tokens(
        self, features: torch.Tensor, clip_frames: int | None = None, batch: int | None = None
    ) -> torch.Tensor:
        """Conv stack per 1-s chunk, positions restarting every chunk, valid rows gathered.

        ``clip_frames``: the length of the whole clip when ``features`` is a part of it that starts at
        a chunk boundary (the padding width depends on the clip, not on the part). ``batch``: chunks
        per conv call (memory only: each chunk's result is the same); by default ``options.conv_batch`` on a
        GPU, ``options.conv_batch_cpu`` on the CPU.
        """
        if batch is None:
            batch = self.options.conv_batch_cpu if features.device.type == "cpu" else self.options.conv_batch
        n_mels, frames = features.shape
        c = self.cfg.chunk_frames
        clip = frames if clip_frames is None else clip_frames
        width = c if clip >= c else clip  # every chunk is padded to the longest one
        n_chunks = -(-frames // width)
        x = F.pad(features, (0, n_chunks * width - frames))
        x = x.view(n_mels, n_chunks, width).permute(1, 0, 2).unsqueeze(1).contiguous()  # [n_chunks, 1, n_mels, width]
        outs = []
        for part in x.split(min(self.cfg.conv_chunksize, batch)):
            y = F.gelu(self._first_conv(part))
            y = F.gelu(self.conv2d2(y))
            y = F.gelu(self.conv2d3(y))  # [n, ch, 16, t]
            n, ch, f, t = y.shape
            y = y.permute(0, 3, 1, 2).contiguous().view(n, t, ch * f)
            if y.device.type == "cpu":
                # One product per chunk: a CPU's GEMM picks its kernel (and order of summation) by the
                # number of rows, which at this width (ch * f = 7680) changes the last bits of a chunk's
                # rows with the chunks beside it. Per chunk, a chunk's rows are the same whether it runs
                # alone, with its window or with the whole clip (streaming and transcribe agree), at
                # about the cost of products of two chunks.
                outs.extend(self.conv_out(y[i : i + 1]) for i in range(n))
            else:
                outs.append(self.conv_out(y))
        y = torch.cat(outs) if len(outs) > 1 else outs[0]  # [n_chunks, t, d]
        y = y + self.positions[: y.shape[1]].to(y.dtype)
        # Only the last chunk is padded and its valid rows come first, so a flat prefix is exact.
        n_tokens = n_audio_tokens(frames, c)
        return y.reshape(-1, y.shape[-1])[:n_tokens]

    def attention_window(self, frames: int) -> int:
        """Tokens per attention block: 104 (8 s) for clips of at least a chunk (docs/model.md §5.4)."""
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

        On CUDA a clip of at least one chunk runs padded to a bucket of whole windows, captured per
        bucket (``ENCODER_BUCKETS``, :meth:`forward_bucketed`); elsewhere unpadded.
        """
        frames = features.shape[-1]
        clip = frames if clip_frames is None else clip_frames
        windows = self.bucket(frames, clip)
        if windows is not None:
            return self._run_bucketed(features, windows)
        h = self.conv_tokens(features.to(self.conv2d1.weight.dtype), clip)
        expected = n_audio_tokens(frames, self.cfg.chunk_frames)
        assert h.shape[0] == expected, f"encoder produced {h.shape[0]} tokens, expected {expected}"
        window = self.attention_window(clip)
        key_mask = None
        if h.shape[0] % window:
            key_mask = window_key_mask(h.shape[0], -(-h.shape[0] // window) * window, window, h.device)
        out = self._layers(h, window, key_mask)
        if out.device.type == "cpu":
            del h, key_mask
            release_freed_memory()  # the conv stack's and the layers' freed activations, before the prefill
        return out

    def _layers(self, h: torch.Tensor, window: int, key_mask: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layers:
            h = layer(h, window, key_mask)
        return self.proj2(F.gelu(self.proj1(self.ln_post(h))))

    def bucket(self, frames: int, clip: int) -> int | None:
        """Windows to pad ``frames`` (from a window boundary of a clip of ``clip`` frames) to, or None
        where the encoder runs unpadded: off CUDA (``options.encoder_bucketed``), and for clips under one chunk, whose
        chunks are narrower. Past the largest bucket: whole windows, uncaptured."""
        on = self.conv2d1.weight.is_cuda if self.options.encoder_bucketed is None else self.options.encoder_bucketed
        if not on or clip < self.cfg.chunk_frames:
            return None
        needed = -(-frames // self.window_frames)
        return next((b for b in ENCODER_BUCKETS if b >= needed), needed)

    def forward_bucketed(self, features: torch.Tensor, n_valid: int | torch.Tensor) -> torch.Tensor:
        """The encoder on ``features [n_mels, windows * window_frames]`` (a clip, or a clip's part from a
        window boundary, zero-padded), of which the first ``n_valid`` output rows are the clip's
        (``n_valid`` may be a 0-d device tensor): every row, padded ones included. Static shapes: what
        a CUDA graph captures per bucket. Its first ``n_valid`` rows equal :meth:`forward` of the clip."""
        per_window = self.window_frames // self.cfg.chunk_frames  # conv a window at a time: less memory
        h = self.conv_tokens(features.to(self.conv2d1.weight.dtype), self.cfg.chunk_frames, batch=per_window)
        window = self.attention_window(self.cfg.chunk_frames)
        return self._layers(h, window, window_key_mask(n_valid, h.shape[0], window, h.device))

    def _run_bucketed(self, features: torch.Tensor, windows: int) -> torch.Tensor:
        n_mels, frames = features.shape
        n = n_audio_tokens(frames, self.cfg.chunk_frames)
        padded = F.pad(features.to(self.conv2d1.weight.dtype), (0, windows * self.window_frames - frames))
        if windows not in ENCODER_BUCKETS:
            return self.forward_bucketed(padded, n)[:n]
        from dictation.asr.nn.decoder import stamp
        from dictation.asr.nn.graphs import StaticCall

        key = tuple(stamp(m) for m in self.modules())
        if key != self._graphs_key:  # new weights (addresses): the old graphs read the old ones
            self.release_graphs()
            self._graphs_key = key
        n_valid = torch.tensor(n, device=features.device)
        call = self._graphs.get(windows)
        if call is None:
            capture = self.options.encoder_graph and features.is_cuda
            if capture and self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            call = StaticCall(
                self.forward_bucketed, [padded, n_valid], capture=capture, name="audio encoder", pool=self._graph_pool
            )
            self._graphs[windows] = call
        return call([padded, n_valid])[:n]

    def release_graphs(self) -> None:
        for call in self._graphs.values():
            call.close()
        self._graphs = {}
        self._graphs_key = None
        self._graph_pool = None

    def _apply(self, fn, recurse: bool = True):
        self.release_graphs()  # a move or cast gives every weight new storage
        return super()._apply(fn, recurse)
