"""Training a LoRA adapter on a loaded model: LoRA on a float or NF4 base, then a PEFT folder.

The recipe is QLoRA's: the base model is frozen, either in its floating dtype (``bits=16``) or with
the adapted decoder layers' linear layers in NF4 with double quantization (``bits=4``, ``nf4.py``); LoRA matrices
``A [r, in]`` (Kaiming-uniform, as PEFT initialises them) and ``B [out, r]`` (zeros) beside the chosen
decoder layers (by default every attention and MLP projection of the top ``layers`` = 8 decoder
layers; the encoder stays frozen) are the only trained parameters, in float32, with AdamW: a linear
warm-up over the first tenth of the steps, then a cosine decay to a tenth of the peak rate
(:meth:`TrainOptions.lr_at`); by default 8 passes over the clips, two a step, within 40 to 160 steps.
On a GPU the base runs in bfloat16 (QLoRA's compute dtype) and the LoRA branch in float32 beside it
(:func:`training_dtype`); on the CPU all is float32 (bf16 matmuls measured 2.8 times slower on an
AVX2 CPU: benchmarks/results/train-2026-12-02.md).

One example is the official fine-tuning format: the prompt of a transcription without a forced
language (system turn, the audio, ``<|im_start|>assistant\\n``) followed by the target
``language X<asr_text>text<|im_end|>``. The loss is the cross-entropy of the target tokens only (the
prompt is masked), teacher-forced. The encoder, the embeddings and the decoder layers below the
adapted ones are frozen, so each example's input to the first adapted layer is computed once, before
the first step (:func:`prepare`), on the weights as loaded and before any NF4 (the layers below then
never run again, so they are not quantized), and every step runs the adapted layers alone. The NF4 weights of
the adapted layers are dequantized once where they fit in half the memory still available
(:func:`keep_dequantized`), not at every forward and backward. Each step averages the loss over
``batch_size`` examples (gradient accumulation: the forward runs one sequence at a time, as
inference does), taken in a seeded shuffled order, epoch after epoch. With the same seed, data and
machine, training gives the same adapter.

The forward for training (:func:`decoder_logits`) runs the decoder's own layers over the whole sequence
with causal attention and no KV cache; a test checks it against the inference path's logits. With
gradient checkpointing (by default on a GPU only: on the CPU memory is plentiful and the recompute
costs a third of a step) only each decoder layer's input is kept, and the layer's activations are
recomputed in the backward pass.

A run with a work folder (:func:`train_adapter`: ``.<out name>.training`` beside the output) saves a
checkpoint every ``save_every`` steps and when cancelled: the LoRA matrices, AdamW's state, the
data order and random state, and a fingerprint of the data and settings; resuming from it gives
the very adapter an uninterrupted run gives. Running out of memory is one TrainingError.

The adapter is written as PEFT writes one (``adapter_config.json`` + ``adapter_model.safetensors``,
tensors ``base_model.model.<module>.lora_A.weight``), in the checkpoint's own module names (the
official ``thinker.model.layers...`` or the ``-hf`` layout's ``model.language_model.layers...``),
with ``target_modules`` a regular expression that selects the decoder's layers only. The folder is
written under a temporary name and renamed, so it appears whole or not at all; an existing
destination is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from dictation.asr.checkpoints.locate import checkpoint_name
from dictation.asr.checkpoints.output import atomic_outputs
from dictation.asr.errors import ModelError
from dictation.asr.nn.features import LogMel, n_audio_tokens
from dictation.asr.nn.model import AsrModel
from dictation.asr.nn.rope import rope_tables
from dictation.asr.text.prompt import PromptBuilder
from dictation.asr.tune.adapter_files import CONFIG_FILE, WEIGHTS_FILE
from dictation.asr.tune.data import Example, TrainingCancelled, TrainingError
from dictation.asr.tune.nf4 import NF4Linear, nf4_decoder

log = logging.getLogger(__name__)

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_GROUPS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}
_GROUPS |= {"gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
HEAD = "lm_head"  # also a possible target (not a default): the output head, untied first if tied


# The default length: DEFAULT_EPOCHS passes over the clips, within [MIN_STEPS, MAX_STEPS] steps of
# ``batch_size`` clips (20 dictations, 16 trained on: 64 steps of two clips; see TrainOptions.lr_at).
DEFAULT_EPOCHS = 8
MIN_STEPS, MAX_STEPS = 40, 160


@dataclass(frozen=True)
class TrainOptions:
    steps: int | None = None  # None: from the number of clips (total_steps)
    rank: int = 16
    alpha: float = 32.0
    lr: float = 1e-3  # the peak: a linear warm-up over ``warmup`` of the steps, then a cosine decay to a tenth
    targets: tuple[str, ...] = DEFAULT_TARGETS
    bits: int = 4  # 4: NF4 base (QLoRA); 16: the float base
    double_quant: bool = True
    seed: int = 0
    batch_size: int = 2
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    epochs: int | None = None  # instead of steps: passes over the data (steps = ceil(epochs * n / batch))
    checkpointing: bool | None = None  # recompute each layer's activations in the backward; None: on a GPU
    layers: int | None = 8  # the top decoder layers adapted (None: all); those below run once per clip
    warmup: float = 0.1
    save_every: int = 50  # steps between resumable checkpoints (with a work folder)

    def total_steps(self, n_examples: int) -> int:
        """The optimizer steps of a run on ``n_examples``: ``steps``, ``epochs`` passes over them, or
        by default ``DEFAULT_EPOCHS`` passes within ``MIN_STEPS .. MAX_STEPS``."""
        if self.steps is not None:
            return self.steps
        if self.epochs is not None:
            return max(1, math.ceil(self.epochs * n_examples / self.batch_size))
        return min(MAX_STEPS, max(MIN_STEPS, math.ceil(DEFAULT_EPOCHS * n_examples / self.batch_size)))

    def lr_at(self, step: int, steps: int) -> float:
        """The learning rate of optimizer step ``step`` (1-based) of ``steps``: a linear warm-up to
        ``lr`` over the first ``warmup`` share of the steps, then a cosine decay to ``lr / 10`` at the
        last (a constant rate left the loss of the last steps jumping about)."""
        warm = max(1, round(self.warmup * steps)) if self.warmup > 0 else 0
        if step <= warm:
            return self.lr * step / warm
        done = (step - warm) / max(1, steps - warm)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))

    def check(self) -> None:
        if self.bits not in (4, 16):
            raise TrainingError(f"bits must be 4 (NF4 base) or 16 (float base), not {self.bits}")
        if (self.steps is not None and self.steps < 1) or self.rank < 1 or self.batch_size < 1 or self.save_every < 1:
            raise TrainingError("steps, rank and batch size must be positive")
        if self.layers is not None and self.layers < 1:
            raise TrainingError(f"the adapted layers must be at least 1, not {self.layers}")
        if not 0 <= self.warmup < 1:
            raise TrainingError(f"the warm-up share must be at least 0 and below 1, not {self.warmup:g}")
        if self.epochs is not None and self.epochs < 1:
            raise TrainingError(f"epochs must be at least 1, not {self.epochs}")
        if not (math.isfinite(self.lr) and self.lr > 0 and math.isfinite(self.alpha) and self.alpha > 0):
            raise TrainingError("the learning rate and alpha must be positive numbers")
        unknown = sorted(set(self.targets) - {*DEFAULT_TARGETS, HEAD})
        if unknown or not self.targets:
            raise TrainingError(
                f"unknown LoRA targets {', '.join(unknown) or '(none)'}; "
                f"choose from {', '.join((*DEFAULT_TARGETS, HEAD))}"
            )


@dataclass(frozen=True)
class Progress:
    step: int
    steps: int
    loss: float
    seconds_left: float


@dataclass
class TrainResult:
    losses: list[float]  # every step's (a resumed run's too)
    seconds: float  # this run (since the start or the resume)
    tokens: int  # decoder positions processed in this run (prompt and target, every step)
    target_tokens: int  # the positions the loss covered, every step of the whole run
    base_bytes_per_parameter: float | None = None  # the NF4 base's decoder linears (bits=4)
    lora: dict[str, LoraTrainLinear] = field(default_factory=dict)
    resumed_at: int = 0  # the step a resumed run went on from (0: from the start)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


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
            parent = getattr(layer, _GROUPS[target])
            wrapped = LoraTrainLinear(getattr(parent, target), options.rank, options.alpha, generator)
            setattr(parent, target, wrapped)
            out[f"decoder.layers.{i}.{_GROUPS[target]}.{target}"] = wrapped
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


def _fingerprint(examples: Sequence[Example], options: TrainOptions) -> str:
    """What a checkpoint was made from: the settings that shape training and every example's audio
    and text. A checkpoint is resumed only with the same."""
    digest = hashlib.sha256()
    fields = {k: v for k, v in vars(options).items() if k not in ("save_every", "checkpointing")}
    digest.update(json.dumps(fields, sort_keys=True, default=str).encode())
    for example in examples:
        digest.update(example.target.encode())
        digest.update(np.ascontiguousarray(example.audio, dtype=np.float32).tobytes())
    return digest.hexdigest()


CHECKPOINT = "checkpoint.safetensors"


def save_checkpoint(work: Path, lora: dict, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """The LoRA matrices, AdamW's moments and the loop's state (step, data order, random state) in
    one safetensors file (no pickle), written under a temporary name and renamed."""
    from safetensors.torch import save_file

    tensors = {}
    for name, module in lora.items():
        tensors[f"lora.{name}.A"] = module.lora_A.detach().float().cpu().contiguous()
        tensors[f"lora.{name}.B"] = module.lora_B.detach().float().cpu().contiguous()
    opt = optimizer.state_dict()
    for index, entry in opt["state"].items():
        for key, value in entry.items():
            tensors[f"opt.{index}.{key}"] = torch.as_tensor(value).detach().float().cpu().contiguous()
    meta = dict(state, param_groups=opt["param_groups"])
    work.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = work / f".{CHECKPOINT}.tmp"
    save_file(tensors, str(tmp), metadata={"state": json.dumps(meta)})
    os.chmod(tmp, 0o600)
    os.replace(tmp, work / CHECKPOINT)


def load_checkpoint(work: Path, lora: dict, optimizer: torch.optim.Optimizer, fingerprint: str) -> dict:
    """Restore what :func:`save_checkpoint` wrote; TrainingError when there is none or it was made
    from other data or settings."""
    from safetensors import safe_open

    path = work / CHECKPOINT
    if not path.is_file():
        raise TrainingError(f"{work}: no checkpoint to resume from; start without --resume")
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["state"])
        if meta.get("fingerprint") != fingerprint:
            raise TrainingError(
                f"{path}: made from other data or settings; resume with the same ones, or start without --resume"
            )
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (a safe_open handle, not a dict)
    with torch.no_grad():
        for name, module in lora.items():
            module.lora_A.copy_(tensors[f"lora.{name}.A"])
            module.lora_B.copy_(tensors[f"lora.{name}.B"])
    opt_state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("opt."):
            _, index, field_name = key.split(".", 2)
            opt_state.setdefault(int(index), {})[field_name] = value
    optimizer.load_state_dict({"state": opt_state, "param_groups": meta.pop("param_groups")})
    return meta


@contextmanager
def _memory_errors(message: Callable[[], str]) -> Iterator[None]:
    """Running out of memory (a GPU's, or the CPU allocator's) inside becomes one TrainingError
    saying ``message()``; every other error passes through."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        if isinstance(exc, torch.OutOfMemoryError) or (
            isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
        ):
            raise TrainingError(message()) from None
        raise


def _layer_index(name: str) -> int:
    return int(name.split(".")[2])  # decoder.layers.<i>.…


def available_memory(device: torch.device) -> int:
    """Bytes that could still be allocated on ``device``: a GPU's free memory, or the system's
    available memory (``MemAvailable``; the free pages where there is no /proc/meminfo)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def keep_dequantized(model: AsrModel, layers: Sequence[NF4Linear]) -> bool:
    """The frozen NF4 weights of ``layers`` (the adapted ones, which every step runs forward and
    backward) dequantized once, in the model's dtype, where that takes at most half the memory still
    available; otherwise each forward dequantizes again. True if kept."""
    need = sum(m.in_features * m.out_features for m in layers) * model.dtype.itemsize
    if not layers or need > available_memory(model.device) // 2:
        log.info("NF4 base dequantized at every step: %.2f GB would not fit", need / 1e9)
        return False
    for m in layers:
        m.keep_dequantized(model.dtype)
    return True


def train_lora(
    model: AsrModel,
    prompt: PromptBuilder,
    examples: Sequence[Example],
    options: TrainOptions,
    *,
    progress: Callable[[Progress], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    work: str | os.PathLike | None = None,
    resume: bool = False,
) -> TrainResult:
    """Train LoRA matrices on ``model`` (changed in place: its decoder layers are wrapped, and with
    ``bits=4`` quantized to NF4) for ``options.total_steps(len(examples))`` steps.

    ``work``: a folder for resumable checkpoints (every ``options.save_every`` steps, and when
    cancelled); ``resume``: continue from its checkpoint, which gives the very adapter an
    uninterrupted run gives. ``cancel()`` is asked before every step: True saves a checkpoint (with
    ``work``) and raises TrainingCancelled. Running out of memory raises one TrainingError."""
    options.check()
    if not examples:
        raise TrainingError("no training examples")
    work = Path(work) if work is not None else None
    if resume and work is None:
        raise TrainingError("resuming needs the folder of the interrupted run")
    steps = options.total_steps(len(examples))
    torch.manual_seed(options.seed)
    bytes_per_param = None
    start = first_adapted(model, options)
    checkpointing = options.checkpointing if options.checkpointing is not None else model.device.type == "cuda"
    with _memory_errors(lambda: _oom_message(model, "preparing the model and the clips")):
        # The frozen part of every clip first, on the weights as loaded (the ones the adapter meets in
        # use): NF4 below the adapted layers would dequantize every weight again for every clip, the
        # larger part of preparing, and those layers never run again. Only the adapted layers go to NF4.
        mel = LogMel(model.cfg.audio.num_mel_bins, model.device)
        items = [prepare(model, prompt, mel, e, start) for e in examples]
        if options.bits == 4:
            layers = [model.get_submodule(n) for n in nf4_decoder(model, options.double_quant, first=start)]
            bytes_per_param = sum(m.nbytes for m in layers) / sum(m.in_features * m.out_features for m in layers)
            keep_dequantized(model, layers)
        lora = add_lora(model, options)
    params = [p for m in lora.values() for p in (m.lora_A, m.lora_B)]
    optimizer = torch.optim.AdamW(params, lr=options.lr, weight_decay=options.weight_decay)
    fingerprint = _fingerprint(examples, options)
    order: list[int] = []
    rng = random.Random(options.seed)
    losses: list[float] = []
    tokens = target_tokens = 0
    done = 0
    if resume:
        meta = load_checkpoint(work, lora, optimizer, fingerprint)
        done, order, losses = meta["step"], meta["order"], meta["losses"]
        tokens, target_tokens = meta["tokens"], meta["target_tokens"]
        version, internal, gauss = meta["rng"]
        rng.setstate((version, tuple(internal), gauss))
        log.info("resuming at step %d of %d", done, steps)

    def checkpoint_now(step: int) -> None:
        if work is not None:
            state = {"fingerprint": fingerprint, "step": step, "order": order, "losses": losses, "rng": rng.getstate()}
            save_checkpoint(work, lora, optimizer, state | {"tokens": tokens, "target_tokens": target_tokens})

    start, tokens_before = time.perf_counter(), tokens
    for step in range(done + 1, steps + 1):
        if cancel is not None and cancel():
            checkpoint_now(step - 1)
            kept = "; its checkpoint is kept for resuming" if work is not None else "; nothing was written"
            raise TrainingCancelled(f"training cancelled at step {step} of {steps}{kept}")
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        with _memory_errors(lambda step=step: _oom_message(model, f"training step {step}")):
            for _ in range(options.batch_size):
                if not order:
                    order = list(range(len(items)))
                    rng.shuffle(order)
                item = items[order.pop()]
                loss = example_loss(model, item, checkpointing) / options.batch_size
                loss.backward()
                total += float(loss.detach())
                tokens += item.embeds.shape[1]
                target_tokens += item.labels.shape[0]
        if not math.isfinite(total):
            raise TrainingError(f"training diverged at step {step} (loss {total}); try a lower learning rate")
        if options.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, options.max_grad_norm)
        for group in optimizer.param_groups:
            group["lr"] = options.lr_at(step, steps)
        optimizer.step()
        losses.append(total)
        if step % options.save_every == 0 and step < steps:
            checkpoint_now(step)
        if progress is not None:
            elapsed = time.perf_counter() - start
            progress(Progress(step, steps, total, elapsed / (step - done) * (steps - step)))
    seconds = time.perf_counter() - start
    return TrainResult(losses, seconds, tokens - tokens_before, target_tokens, bytes_per_param, lora, resumed_at=done)


def _oom_message(model: AsrModel, what: str) -> str:
    where = "GPU" if model.device.type == "cuda" else "memory"
    hint = "use --bits 4, fewer --targets, or shorter clips" if model.device.type == "cuda" else "close other programs"
    return f"out of {where} while {what} on {model.device}; {hint}, or train on another device (--device)"


# --- the PEFT folder --------------------------------------------------------------------------------


def peft_module(ours: str, layout: str) -> str:
    """The checkpoint's name of our module ``ours`` in ``layout`` (what PEFT calls it)."""
    return checkpoint_name(f"{ours}.weight", layout).removesuffix(".weight")


def target_pattern(targets: Sequence[str], layout: str, layers: Sequence[int] | None = None) -> str:
    """A ``target_modules`` regular expression selecting ``targets`` in the decoder's layers only (the
    encoder has layers named like them too): every one, or those numbered ``layers``."""
    prefix = re.escape(checkpoint_name("decoder.layers.0.weight", layout).removesuffix(".0.weight"))
    if layers is not None:
        prefix += f"\\.(?:{'|'.join(str(i) for i in sorted(layers))})"
    else:
        prefix += "\\.\\d+"
    attn = [t for t in DEFAULT_TARGETS if t in targets and _GROUPS[t] == "self_attn"]
    mlp = [t for t in DEFAULT_TARGETS if t in targets and _GROUPS[t] == "mlp"]
    parts = [f"self_attn\\.(?:{'|'.join(attn)})"] if attn else []
    parts += [f"mlp\\.(?:{'|'.join(mlp)})"] if mlp else []
    pattern = f"{prefix}\\.(?:{'|'.join(parts)})" if parts else ""
    if HEAD in targets:
        head = re.escape(peft_module(HEAD, layout))
        pattern = f"(?:{pattern}|{head})" if pattern else head
    return pattern


def adapted_layers(lora: dict[str, LoraTrainLinear]) -> list[int] | None:
    """The decoder layers ``lora`` adapts, or None when it adapts all from the first (one pattern for all)."""
    found = sorted({_layer_index(name) for name in lora if name.startswith("decoder.layers.")})
    return None if not found or found[0] == 0 else found


def write_adapter(
    out: str | os.PathLike,
    lora: dict[str, LoraTrainLinear],
    options: TrainOptions,
    *,
    layout: str,
    base_model: str | None = None,
) -> Path:
    """Write ``lora`` as a PEFT adapter folder at ``out`` (refused if it exists; see the module docstring)."""
    from safetensors.torch import save_file

    out = Path(out).expanduser().absolute()
    tensors = {}
    for ours, module in lora.items():
        name = f"base_model.model.{peft_module(ours, layout)}"
        tensors[f"{name}.lora_A.weight"] = module.lora_A.detach().float().cpu().contiguous()
        tensors[f"{name}.lora_B.weight"] = module.lora_B.detach().float().cpu().contiguous()
    config = {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": base_model,
        "r": options.rank,
        "lora_alpha": options.alpha,
        "lora_dropout": 0.0,
        "target_modules": target_pattern(options.targets, layout, adapted_layers(lora)),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "inference_mode": True,
    }
    with atomic_outputs([out], folders=True, error=TrainingError) as (tmp,):
        os.chmod(tmp, 0o700)  # trained on the user's dictations
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        for name in (WEIGHTS_FILE, CONFIG_FILE):
            os.chmod(tmp / name, 0o600)
    return out


# --- from files to a folder ---------------------------------------------------------------------------


def work_folder(out: str | os.PathLike) -> Path:
    """Where a run on its way to ``out`` keeps its checkpoint: ``.<name>.training`` beside it (0700)."""
    out = Path(out).expanduser().absolute()
    return out.parent / f".{out.name}.training"


def training_dtype(device: torch.device) -> torch.dtype:
    """The frozen base's dtype for training on ``device``: bfloat16 on a GPU (QLoRA's compute dtype:
    half the memory, tensor cores), float32 on the CPU (bf16 matmuls there are slow and imprecise).
    The LoRA matrices, their gradients and AdamW's moments are float32 on either."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def base_model_folder(model: str | os.PathLike):
    """``(folder, AsrConfig)`` of the model to train on: ModelError naming it unless it is a loadable
    floating-point model (checked without loading its weights)."""
    from dictation.asr.checkpoints.hub import check_model_folder, resolve_model
    from dictation.asr.config import AsrConfig

    problem = check_model_folder(model)
    if problem:
        raise ModelError(problem)
    folder = resolve_model(model)
    if not (folder / "config.json").is_file():
        raise ModelError(f"{model}: not a model folder (no config.json); train on a model folder")
    cfg = AsrConfig.from_file(folder / "config.json")
    if cfg.quantization:
        raise ModelError(f"{folder}: a pre-quantized model; train on the floating-point model it was made from")
    return folder, cfg


def train_adapter(
    model: str | os.PathLike,
    examples: Sequence[Example],
    out: str | os.PathLike,
    options: TrainOptions | None = None,
    *,
    device: str = "cpu",
    resume: bool = False,
    progress: Callable[[Progress], None] | None = None,
    cancel: Callable[[], bool] | None = None,
) -> TrainResult:
    """Load ``model`` (a folder or cached repo id) on ``device`` (float32 on the CPU, bfloat16 on a
    GPU; the LoRA matrices and AdamW's state are float32 everywhere), train on ``examples`` and write
    the adapter to ``out``. TrainingError / ModelError name the problem. The output folder appears
    whole or not at all; meanwhile checkpoints go to :func:`work_folder` (removed after success,
    kept after a cancel or an error for ``resume``)."""
    import shutil

    from dictation.asr.checkpoints.safetensors import load_model
    from dictation.asr.device import resolve_device

    options = options or TrainOptions()
    options.check()
    if os.path.lexists(Path(out).expanduser()):
        raise TrainingError(f"{out}: already exists; choose a new output path (nothing is overwritten)")
    folder, cfg = base_model_folder(model)
    dev = resolve_device(device)
    dtype = training_dtype(dev)
    work = work_folder(out)
    if resume and not (work / CHECKPOINT).is_file():
        raise TrainingError(f"{work}: no checkpoint to resume from; start without --resume")
    if not resume and work.exists():
        shutil.rmtree(work)
    with _memory_errors(lambda: f"out of memory loading {folder} on {dev}; train on another device (--device)"):
        loaded = load_model(folder, cfg, dev, dtype)
    prompt = PromptBuilder.from_folder(
        folder, audio_token_id=cfg.special.audio_token_id, vocab_size=cfg.text.vocab_size
    )
    result = train_lora(loaded, prompt, examples, options, progress=progress, cancel=cancel, work=work, resume=resume)
    write_adapter(out, result.lora, options, layout=cfg.layout, base_model=str(model))
    shutil.rmtree(work, ignore_errors=True)
    return result


__all__ = [
    "DEFAULT_TARGETS",
    "LoraTrainLinear",
    "NF4Linear",
    "Progress",
    "TrainOptions",
    "TrainResult",
    "TrainingCancelled",
    "TrainingError",
    "base_model_folder",
    "decoder_logits",
    "train_adapter",
    "train_lora",
    "training_dtype",
    "work_folder",
    "write_adapter",
]
