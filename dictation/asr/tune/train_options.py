"""What a LoRA training run is asked to do (torch-free): :class:`TrainOptions` (the LoRA's size and
targets, the NF4 base, the run's length and the learning-rate schedule, each option checked) and the
:class:`Progress` a run reports after every step. The recipe: the module docstring of ``train.py``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dictation.asr.tune.data import TrainingError

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# the decoder layer's submodule that holds each target
GROUPS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}
GROUPS |= {"gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
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
