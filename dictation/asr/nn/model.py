"""The whole network: audio tower + text decoder + output head, with prefill and one-token steps."""

from __future__ import annotations

from dataclasses import fields

import torch
import torch.nn.functional as F
from torch import nn

from dictation.asr.config import AsrConfig
from dictation.asr.nn import compiled, native_step
from dictation.asr.nn.compact import HalfTable
from dictation.asr.nn.decoder import TextDecoder, stamp
from dictation.asr.nn.encoder import AudioEncoder
from dictation.asr.nn.graphs import DecodeSlot
from dictation.asr.nn.int8_table import Int8Table
from dictation.asr.nn.kv_cache import StaticKVCache
from dictation.asr.nn.options import DEFAULT_OPTIONS, ModelOptions
from dictation.asr.nn.rope import rope_tables

# Positions reserved for generated tokens at prefill; the cache grows in steps of this size.
DECODE_RESERVE = 512
CACHE_ROUND = 512
# Prefill buckets: on CUDA a prompt prefilled from position 0 that fits one of these lengths
# runs padded to the smallest that holds it, as one CUDA graph per bucket (graphs.StaticCall), so that
# the prefill at release is a few launches. Padding goes after the prompt, where the causal attention
# keeps it from every prompt position; the cache positions it writes are overwritten before any step
# reads them (as with a rejected draft). Longer prompts and later pieces (extend) run as before.
PREFILL_BUCKETS = (64, 96, 128, 160, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024)
# Row buckets: on CUDA, decoder work that continues a prompt already in the cache (the
# prompt tail at a streaming finish or preview, an 8-s window extended while the user speaks, a draft
# check) runs padded to the smallest of these lengths that holds it, as one CUDA graph per bucket
# that takes its first position as a device tensor (AsrModel.forward_rows): attention spans the whole
# cache under a mask built from it. The padding's cache positions lie after the real rows and are
# overwritten before any later query sees them (as with a rejected draft). Longer pieces, and pieces
# that would reach past the cache's end, run as before.
ROW_BUCKETS = (16, 32, 64, 128, 192, 256, 384, 512)
# Which of these run, and how (prefill pieces, buckets, capture): the model's options (options.py;
# prompts longer than ``prefill_chunk`` are prefilled in pieces, so attention memory stays bounded for
# 20-minute clips, 15,600 audio tokens, on any device).


# Options that only choose which of the same computations a call takes (padded to a bucket or not, in
# pieces of which size): changing them leaves every captured graph valid.
_ROUTING = {
    *("prefill_bucketed", "rows_bucketed", "encoder_bucketed", "prefill_chunk", "conv_batch", "conv_batch_cpu"),
    *("static_step", "capture_step"),  # the decode graph is checked at each decode (graphs.DecodeSlot)
    "fuse_projections",  # re-planned fusions change weights_key(): graphs keyed on it are captured again
}


def _changed(old: ModelOptions, new: ModelOptions) -> set[str]:
    return {f.name for f in fields(ModelOptions) if getattr(old, f.name) != getattr(new, f.name)}


class AsrModel(nn.Module):
    def __init__(self, cfg: AsrConfig, options: ModelOptions = DEFAULT_OPTIONS) -> None:
        super().__init__()
        self.cfg = cfg
        self._options = options
        self.audio_tower = AudioEncoder(cfg.audio, options)
        self.decoder = TextDecoder(cfg.text, options)
        # Tie rule (docs/model.md §1): text_config.tie_word_embeddings decides; a stored lm_head is then ignored.
        self.lm_head = (
            None if cfg.text.tie_word_embeddings else nn.Linear(cfg.text.hidden_size, cfg.text.vocab_size, bias=False)
        )
        self.cache: StaticKVCache | None = None
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        # The captured CUDA-graph decode step (graphs.DecodeGraph) for this cache, released with it, and
        # whether capturing failed once: filled by decoding (decode/greedy.py).
        self.decode_slot = DecodeSlot()
        # Bucketed prefills and rows (graphs.StaticCall) by length, for ``_prefills_for``: this cache and
        # these weights.
        self._prefills: dict[int, object] = {}
        self._rows: dict[int, object] = {}
        self._prefills_for: tuple | None = None
        self._prefill_pool = None  # one memory pool for all of them: they never run at the same time
        # The static step compiled by torch.compile (compiled.py) instead of the default one; the
        # CompiledStep once compiled, False where it does not apply or failed (logged once).
        self.compile_step = compiled.COMPILE_STEP
        self.compiled_step = None
        # The native CPU step (native_step.py) for this pass's weights and cache: None until a step
        # builds it, False where it does not apply this pass; dropped at every pass start.
        self._native: native_step.NativeStep | bool | None = None

    @property
    def options(self) -> ModelOptions:
        """The code paths this model runs (options.py): set one to change them, as
        ``model.options = replace(model.options, rows_bucketed=True)``."""
        return self._options

    @options.setter
    def options(self, options: ModelOptions) -> None:
        old, self._options = self._options, options
        if _changed(old, options) - _ROUTING:  # captured graphs ran the old code: capture again
            self._drop_graph()
        self.audio_tower.use_options(options)
        self.decoder.use_options(options)
        self.spread_options()

    def spread_options(self) -> None:
        """Hand the options to every layer that reads them and has others (quantized layers swapped in
        after the model was built: quantization, loading, adapters)."""
        options = self._options
        for module in self.modules():
            if "options" in module.__dict__ and module.__dict__["options"] is not options:
                module.options = options

    @property
    def decode_graph(self):
        """The decode step's graph for this cache (graphs.DecodeGraph), or None."""
        return self.decode_slot.graph

    @property
    def graph_failed(self) -> bool:
        """Whether capturing the decode step failed once (it then runs uncaptured)."""
        return self.decode_slot.failed

    @property
    def output_weight(self) -> torch.Tensor:
        return self.decoder.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype (the final norm's; the embedding table may be held in float16: nn/compact.py)."""
        return self.decoder.norm.weight.dtype

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
            self._drop_graph()  # it captured the old cache's addresses
            self.cache = StaticKVCache(
                t.num_hidden_layers, t.num_key_value_heads, t.head_dim, size, self.dtype, self.device
            )
            if old is not None:
                self.cache.copy_from(old)
            cos, sin = rope_tables(torch.arange(size, device=self.device), t.head_dim, t.rope_theta)
            self._rope = (cos.to(self.dtype), sin.to(self.dtype))
        return self.cache

    def release_cache(self) -> None:
        self._drop_graph()
        self._native = None
        self.cache = None
        self._rope = None

    def _drop_graph(self) -> None:
        self.decode_slot.close()
        self._drop_prefills()

    def _apply(self, fn, recurse: bool = True):
        # A move or cast (.to("cpu") after a GPU failure, .half(), ...): the cache and a captured step
        # belong to the old device and dtype; the decoder plans its fused weights again (decoder.py).
        self.release_cache()
        return super()._apply(fn, recurse)

    def sync_weights(self) -> bool:
        """Bring the fused projections up to date with the weights (cheap when nothing changed): called
        at the start of every pass, so weights may change between passes (adapters, quantization).
        True if anything was planned again."""
        self.spread_options()
        self._native = None  # its pointers are checked again at the pass's first step
        return self.decoder.refresh_fusion()

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
        return self.head(h_last).reshape(-1)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """``h [..., hidden]`` → logits ``[..., vocab]``: the output head (tied to the embedding table
        or not; a float16-held table and an int8 head compute the float32 head's argmax, in float32:
        nn/compact.py, nn/int8_table.py)."""
        table = self.decoder.embed_tokens if self.lm_head is None else self.lm_head
        if isinstance(table, HalfTable | Int8Table):
            return table.project(h)
        return h @ self.output_weight.T

    def _run(self, h: torch.Tensor, start: int) -> torch.Tensor:
        assert self.cache is not None and self._rope is not None
        cos, sin = self._rope
        stop = start + h.shape[1]
        return self.decoder(h, cos[start:stop], sin[start:stop], self.cache, start)

    def weights_key(self) -> tuple:
        """What a decode step reads, as addresses and versions: every decoder and head tensor, the fused
        projections and the quantized layers' kernel layouts. A captured step stays valid while this
        is unchanged (in-place changes of a weight, e.g. merged adapters, keep the addresses)."""
        return self.step_state()[0]

    def step_state(self) -> tuple[tuple, bool]:
        """(:meth:`weights_key`, whether the decoder holds an unmerged adapter), from one walk over the
        modules: what each CUDA decode checks before it replays a captured step (about 0.6 ms for
        1.7B on a slow CPU; the two separate scans took 2)."""
        # Which code the step runs is part of the key too: a graph captured with the fused kernels
        # (or the compiled step) must not be replayed after they are turned off, nor the reverse.
        compiled_on = bool(self.compile_step) and self.compiled_step is not False
        key: list = [self.decoder.weights_epoch, self.lm_head is None, self.decoder.path_key(), compiled_on]
        unmerged = False
        modules = [*self.decoder.modules(), *self.decoder.fused_layers()]
        if self.lm_head is not None:
            modules.append(self.lm_head)
        for module in modules:
            unmerged = unmerged or getattr(type(module), "unmerged_adapter", False)  # a class attribute
            key.append(stamp(module))
            for tensors in module.__dict__.get("_cache", {}).values():  # see stamp on __dict__
                key += [t.data_ptr() for t in tensors]
        return tuple(key), bool(unmerged)

    @torch.inference_mode()
    def prefill(self, embeds: torch.Tensor, max_new_tokens: int, start: int = 0) -> torch.Tensor:
        """Fill the cache with the prompt ``[1, S, hidden]``; return the last position's logits.

        ``start > 0``: ``embeds`` continue a prompt whose first ``start`` positions are already in
        the cache (see :meth:`extend`).
        """
        total = embeds.shape[1]
        self.sync_weights()
        bucket = self.prefill_bucket(start, total)
        # Room for the usual output; decoding grows the cache if a long text needs more.
        self.ensure_capacity(max(start + total + min(max_new_tokens, DECODE_RESERVE) + 1, bucket or 0))
        if bucket is not None:
            return self._bucketed_prefill(embeds, bucket)
        return self.logits(self._fill(embeds, start))

    def prefill_bucket(self, start: int, total: int) -> int | None:
        """The padded length a prefill of ``total`` positions from ``start`` runs at, or None (unpadded)."""
        on = self.device.type == "cuda" if self._options.prefill_bucketed is None else self._options.prefill_bucketed
        if not on or start != 0:
            return None
        return next((b for b in PREFILL_BUCKETS if b >= total), None)

    def forward_prefill(self, embeds: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The prefill from position 0 of ``embeds [1, P, hidden]`` (a prompt and padding after it),
        returning the logits at the device index ``last [1]`` (the prompt's last position). Static
        shapes: what a CUDA graph captures per bucket. The cache must hold ``P`` positions."""
        assert self.cache is not None and self._rope is not None
        cos, sin = self._rope
        length = embeds.shape[1]
        h = embeds
        for i, layer in enumerate(self.decoder.layers):  # TextDecoder.forward, but every position kept
            h = layer(h, cos[:length], sin[:length], self.cache, i, 0)
        return self.logits(self.decoder.norm(h.index_select(1, last)))

    def _bucketed_prefill(self, embeds: torch.Tensor, bucket: int) -> torch.Tensor:
        total = embeds.shape[1]
        padded = F.pad(embeds, (0, 0, 0, bucket - total))
        last = torch.tensor([total - 1], device=self.device)
        return self._static_call("prefill", bucket, [padded, last])

    def row_bucket(self, start: int, total: int) -> int | None:
        """The padded length ``total`` rows continuing the cache at ``start`` run at (ROW_BUCKETS), or
        None (unpadded): bucketing off, no bucket holds them, or the padding would pass the cache's end."""
        on = self.device.type == "cuda" if self._options.rows_bucketed is None else self._options.rows_bucketed
        if not on or self.cache is None:
            return None
        bucket = next((b for b in ROW_BUCKETS if b >= total), None)
        return None if bucket is None or start + bucket > self.cache.max_len else bucket

    def forward_rows(self, embeds: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """``embeds [1, R, hidden]`` at positions ``start .. start+R-1``, after the first ``start`` cache
        positions, for the device index ``start [1]`` (int64): k/v written by index, attention over
        the whole cache under a causal mask built from ``start``. Returns every row's final-normed
        hidden state ``[1, R, hidden]``. Static shapes: what a CUDA graph captures per row bucket. The
        caller keeps ``start + R <= cache.max_len``; every cache position must hold finite values."""
        cache = self.cache
        assert cache is not None and self._rope is not None
        positions = start + cache.positions[: embeds.shape[1]]
        mask = cache.positions[None, :] <= positions[:, None]  # [R, max_len]
        cos, sin = self._rope
        cos, sin = cos.index_select(0, positions), sin.index_select(0, positions)
        return self.decoder(embeds, cos, sin, cache, positions, mask, last_only=False)

    def _bucketed_rows(self, embeds: torch.Tensor, start: int, bucket: int) -> torch.Tensor:
        """:meth:`forward_rows` of ``embeds`` padded to ``bucket``; the real rows ``[1, S, hidden]``."""
        total = embeds.shape[1]
        padded = F.pad(embeds, (0, 0, 0, bucket - total))
        at = torch.tensor([start], device=self.device)
        return self._static_call("rows", bucket, [padded, at])[:, :total]

    def _static_call(self, kind: str, bucket: int, inputs: list[torch.Tensor]) -> torch.Tensor:
        """:meth:`forward_prefill` (``kind`` "prefill") or :meth:`forward_rows` ("rows") of ``inputs``
        through the StaticCall of ``bucket`` (made, on CUDA captured, at its first use). All of them
        are dropped when the cache or the weights change."""
        from dictation.asr.nn.graphs import StaticCall

        # The graphs hold the cache's and the weights' addresses. Not weights_key(): it also counts the
        # kernel layouts built lazily, which decoding adds to after the first prefill (entries added,
        # none replaced: a layout is only dropped with its layer or a fusion planned again).
        modules = [*self.decoder.modules(), *self.decoder.fused_layers()]
        if self.lm_head is not None:
            modules.append(self.lm_head)
        key = (id(self.cache), self.decoder.weights_epoch, self.decoder.path_key(), tuple(stamp(m) for m in modules))
        if key != self._prefills_for:
            self._drop_prefills()
            self._prefills_for = key
        calls, fn, name = (
            (self._prefills, self.forward_prefill, "prefill")
            if kind == "prefill"
            else (self._rows, self.forward_rows, "decoder rows")
        )
        call = calls.get(bucket)
        if call is not None:
            return call(inputs)
        capture = self._options.prefill_graph and self.device.type == "cuda"
        if capture and self._prefill_pool is None:
            self._prefill_pool = torch.cuda.graph_pool_handle()
        call = StaticCall(fn, inputs, capture=capture, name=name, pool=self._prefill_pool)
        calls[bucket] = call
        return call(inputs)

    @torch.inference_mode()
    def prepare_graphs(self) -> int:
        """Build (on CUDA: capture) the bucketed encoder for every bucket, and the bucketed prefill and
        rows for every bucket the cache holds, on zeros, so that no dictation pays for a capture (the
        warm-up calls this; the zeros' cache entries are overwritten before anything reads them). A
        no-op where nothing is bucketed. Returns how many were built."""
        from dictation.asr.nn import encoder as encoder_mod

        built = 0
        audio = self.audio_tower
        if audio.bucket(audio.window_frames, audio.window_frames) is not None:
            for windows in encoder_mod.ENCODER_BUCKETS:
                if windows not in audio._graphs:
                    audio(torch.zeros(self.cfg.audio.num_mel_bins, windows * audio.window_frames, device=self.device))
                    built += 1
        hidden = self.cfg.text.hidden_size
        for bucket in PREFILL_BUCKETS:
            if self.prefill_bucket(0, bucket) is None or self.cache is None or bucket > self.cache.max_len:
                break
            if bucket not in self._prefills:
                self._bucketed_prefill(torch.zeros(1, bucket, hidden, dtype=self.dtype, device=self.device), bucket)
                built += 1
        for bucket in ROW_BUCKETS:
            if self.row_bucket(0, bucket) is None:
                break
            if bucket not in self._rows:
                self._bucketed_rows(torch.zeros(1, bucket, hidden, dtype=self.dtype, device=self.device), 0, bucket)
                built += 1
        return built

    def _drop_prefills(self) -> None:
        for call in [*self._prefills.values(), *self._rows.values()]:
            call.close()
        self._prefills, self._rows, self._prefills_for, self._prefill_pool = {}, {}, None, None

    @torch.inference_mode()
    def extend(self, embeds: torch.Tensor, start: int, headroom: int = 0) -> None:
        """Put prompt positions ``start .. start+S-1`` into the cache (after those before ``start``),
        without computing logits: a prompt prefilled piece by piece as its parts become known.
        ``headroom``: extra positions to allocate when the cache has to grow anyway."""
        stop = start + embeds.shape[1]
        self.sync_weights()
        need = stop + DECODE_RESERVE + 1
        if self.cache is None or self.cache.max_len < need:
            self.ensure_capacity(need + headroom)
        self._fill(embeds, start)

    def _fill(self, embeds: torch.Tensor, start: int) -> torch.Tensor:
        h_last = None
        chunk = self._options.prefill_chunk
        for offset in range(0, embeds.shape[1], chunk):
            piece, at = embeds[:, offset : offset + chunk], start + offset
            bucket = self.row_bucket(at, piece.shape[1])
            h_last = self._run(piece, at) if bucket is None else self._bucketed_rows(piece, at, bucket)[:, -1:]
        return h_last

    def make_room(self, position: int) -> bool:
        """Grow the cache (by ``DECODE_RESERVE``) if ``position`` is past its end; True if it grew."""
        if position < self.cache.max_len:
            return False
        self.ensure_capacity(position + DECODE_RESERVE)
        return True

    @torch.inference_mode()
    def step(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """One token ``[1]`` at ``position`` → logits ``[vocab]``."""
        self.make_room(position)
        h = self.decoder.embed_tokens(token).view(1, 1, -1)
        native = self.native_step()
        if native is not None:
            cos, sin = self._rope
            h = native.run(h, cos[position].float(), sin[position].float(), position)
            return self.logits(self.decoder.norm(h.view(1, 1, -1)).to(self.dtype))
        return self.logits(self._run(h, position))

    def native_step(self) -> native_step.NativeStep | None:
        """The native CPU step (native_step.py) where it applies: the ``native_cpu_step`` option not
        False, an int8 decoder on the CPU, the library built. Checked once per pass (``sync_weights``
        drops it) and again when the cache grows."""
        native = self._native
        if native is False or self.options.native_cpu_step is False:
            return None
        cache = self.cache
        if native is not None and native.cache_ptrs == (cache.keys.data_ptr(), cache.values.data_ptr()):
            return native
        lib = native_step.library() if native_step.eligible(self) else None
        self._native = native_step.NativeStep(self, lib) if lib is not None else False
        return self._native or None

    @torch.inference_mode()
    def static_step(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """:meth:`step` with static shapes and no host read: ``token [1]`` and ``position [1]`` (int64)
        live on the device, the k/v write and the RoPE rows are indexed there. Three forms: with the
        fused kernels (where the decoder uses them, CUDA by default) attention reads the cache's filled
        positions only; otherwise it covers the whole cache under a mask built from ``position``; with
        ``compile_step`` the step compiled by torch.compile (compiled.py). The caller keeps
        ``position < cache.max_len``. What graphs.DecodeGraph captures; on the CPU it is the same
        step, tested against :meth:`step`."""
        cache = self.cache
        assert cache is not None and self._rope is not None
        if self.compile_step:
            logits = compiled.run(self, token, position)
            if logits is not None:
                return logits
        cos, sin = self._rope
        h = self.decoder.embed_tokens(token).view(1, 1, -1)
        if self.decoder.uses_kernels(h):  # the fused kernels: RoPE rows and the cache read by position
            return self.logits(self.decoder.forward_fused_step(h, cos, sin, cache, position))
        cos, sin = cos.index_select(0, position), sin.index_select(0, position)  # [1, head_dim]
        visible = (cache.positions <= position).view(1, -1)  # the one row's mask over the whole cache
        return self.logits(self.decoder(h, cos, sin, cache, position, visible))

    @torch.inference_mode()
    def forward_tokens(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        """Tokens ``[k]`` at positions ``position .. position+k-1`` → logits ``[k, vocab]``: row ``i`` is
        the next-token logits after ``tokens[: i + 1]`` (draft verification, see :func:`decode.greedy.greedy`).

        Writes the k positions into the cache like ``k`` calls of :meth:`step`; attention sees only
        positions ``< position + k``, so entries a later call does not overwrite stay invisible to it."""
        k = tokens.shape[0]
        self.sync_weights()
        if position + k > self.cache.max_len:
            self.ensure_capacity(position + k + DECODE_RESERVE)
        assert self._rope is not None
        cos, sin = self._rope
        stop = position + k
        h = self.decoder.embed_tokens(tokens).unsqueeze(0)
        bucket = self.row_bucket(position, k)
        if bucket is not None:
            h = self._bucketed_rows(h, position, bucket)
        else:
            h = self.decoder(h, cos[position:stop], sin[position:stop], self.cache, position, last_only=False)
        return self.head(h).reshape(k, -1)
