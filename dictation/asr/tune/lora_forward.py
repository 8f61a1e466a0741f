"""The trained model: LoRA layers beside the frozen base (:class:`LoraTrainLinear`, :func:`add_lora`),
each example's frozen part computed once (:func:`prepare`), and the forward and loss a training step
runs (:func:`decoder_logits`, :func:`example_loss`).

The forward for training (:func:`decoder_logits`) runs the decoder's own layers over the whole sequence
with causal attention and no KV cache; a test checks it against the inference path's logits. With
gradient checkpointing (by default on a GPU only: on the CPU memory is plentiful and the recompute
costs a third of a step) only each decoder layer's input is kept, and the layer's activations are
recomputed in the backward pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from dictation.asr.nn.features import LogMel, n_audio_tokens
from dictation.asr.nn.model import AsrModel
from dictation.asr.nn.rope import rope_tables
from dictation.asr.text.prompt import PromptBuilder
from dictation.asr.tune.data import Example
from dictation.asr.tune.train_options import DEFAULT_TARGETS, GROUPS, HEAD, TrainOptions


class LoraTrainLinear(nn.Module):
    """``base(x) + scaling * B (A x)`` with trainable float32 ``A``/``B`` beside a frozen base."""

    def __init__(self, base: nn.Module, rank: int, alpha: float, generator: torch.Generator) -> None:
        super().__init__()
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        device = next(iter([*base.parameters(), *base.buffers()])).device
        a = torch.empty(rank, self.in_features)
        # PEFT's init: A as nn.Linear's default (Kaiming uniform, a = sqrt(5)), B zeros.
        bound = 1.0 / math.sqrt(self.in_features)
        a.uniform_(-bound, bound, generator=generator)
        self.lora_A = nn.Parameter(a.to(device))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=device))
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the LoRA branch in float32 whatever the base's dtype (bf16 on a GPU): small, and exact updates
        delta = F.linear(F.linear(x.float(), self.lora_A), self.lora_B) * self.scaling
        return self.base(x) + delta.to(x.dtype)


def first_adapted(model: AsrModel, options: TrainOptions) -> int:
    """The index of the lowest decoder layer ``options`` adapts (0: all of them)."""
    n = len(model.decoder.layers)
    return 0 if options.layers is None else max(0, n - options.layers)


def add_lora(model: AsrModel, options: TrainOptions) -> dict[str, LoraTrainLinear]:
    """Freeze ``model`` and wrap the target layers of the adapted decoder layers (the top
    ``options.layers``); returns them by our module name."""
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(options.seed)
    out = {}
    start = first_adapted(model, options)
    for i, layer in enumerate(model.decoder.layers):
        if i < start:
            continue
        for target in DEFAULT_TARGETS:  # a fixed order, whatever the option's: the same init for a seed
            if target not in options.targets:
                continue
            parent = getattr(layer, GROUPS[target])
            wrapped = LoraTrainLinear(getattr(parent, target), options.rank, options.alpha, generator)
            setattr(parent, target, wrapped)
            out[f"decoder.layers.{i}.{GROUPS[target]}.{target}"] = wrapped
    if HEAD in options.targets:
        head = model.lm_head
        if head is None:  # tied: PEFT adapts the head alone, so the adapted head is a copy of the embeddings
            embed = model.decoder.embed_tokens.weight
            head = nn.Linear(embed.shape[1], embed.shape[0], bias=False, device=embed.device, dtype=embed.dtype)
            with torch.no_grad():
                head.weight.copy_(embed)
            head.requires_grad_(False)
        model.lm_head = out[HEAD] = LoraTrainLinear(head, options.rank, options.alpha, generator)
    return out


def _layer_forward(layer: nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    s = h.shape[1]
    attn = layer.self_attn
    q, k, v = attn._qkv(layer.input_layernorm(h), cos, sin)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    h = h + attn.o_proj(o.transpose(1, 2).reshape(1, s, attn.n_heads * attn.head_dim))
    return h + layer.mlp(layer.post_attention_layernorm(h))


def _rope(model: AsrModel, embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t = model.cfg.text
    cos, sin = rope_tables(torch.arange(embeds.shape[1], device=embeds.device), t.head_dim, t.rope_theta)
    return cos.to(embeds.dtype), sin.to(embeds.dtype)


def decoder_logits(
    model: AsrModel, embeds: torch.Tensor, first: int, *, checkpointing: bool = False, start: int = 0
) -> torch.Tensor:
    """The next-token logits ``[S - first, vocab]`` at positions ``first .. S-1`` of the sequence
    ``embeds [1, S, hidden]``: the decoder's layers with causal attention over the whole sequence
    and no cache (differentiable), the final norm and the head. ``start > 0``: ``embeds`` is the
    input of decoder layer ``start`` (the layers below already run), not the embeddings."""
    s = embeds.shape[1]
    cos, sin = _rope(model, embeds)
    h = embeds
    for layer in model.decoder.layers[start:]:
        if checkpointing and torch.is_grad_enabled():
            # gradient checkpointing: keep only the layer's input; its activations are recomputed
            # in the backward pass (memory of one layer instead of all of them)
            h = checkpoint(_layer_forward, layer, h, cos, sin, use_reentrant=False)
        else:
            h = _layer_forward(layer, h, cos, sin)
    h = model.decoder.norm(h[:, first:])
    logits = h @ model.decoder.embed_tokens.weight.T if model.lm_head is None else model.lm_head(h)
    return logits.reshape(s - first, -1)


@dataclass
class Prepared:
    embeds: torch.Tensor  # [1, S, hidden]: the input of decoder layer ``start`` (0: the embeddings)
    labels: torch.Tensor  # [T]: the target ids (last T positions)
    start: int = 0  # the lowest adapted decoder layer: the frozen ones below ran once, in prepare

    @property
    def first(self) -> int:
        """The position whose logits predict the first target token."""
        return self.embeds.shape[1] - self.labels.shape[0] - 1


@torch.no_grad()
def prepare(model: AsrModel, prompt: PromptBuilder, mel: LogMel, example: Example, start: int = 0) -> Prepared:
    """An example's input to decoder layer ``start`` and its labels. Everything below that layer is
    frozen (the encoder, the embeddings, the decoder layers no LoRA adapts), so it is computed here,
    once per clip, instead of at every step and epoch."""
    features = mel(example.audio)
    audio_embeds = model.audio_tower(features)
    n = n_audio_tokens(features.shape[-1], model.cfg.audio.chunk_frames)
    ids = prompt.prompt_ids(n)
    target = prompt.encode(example.target) + [prompt.special.im_end]
    all_ids = torch.tensor(ids + target, device=model.device)
    h = model.embed_prompt(all_ids, audio_embeds).detach()
    if start:
        cos, sin = _rope(model, h)
        for layer in model.decoder.layers[:start]:
            h = _layer_forward(layer, h, cos, sin)
    return Prepared(h, torch.tensor(target, device=model.device), start)


def example_loss(model: AsrModel, item: Prepared, checkpointing: bool = False) -> torch.Tensor:
    logits = decoder_logits(model, item.embeds, item.first, checkpointing=checkpointing, start=item.start)
    logits = logits[:-1]  # the last position predicts nothing
    return F.cross_entropy(logits.float(), item.labels)
