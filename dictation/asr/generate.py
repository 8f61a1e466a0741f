"""Greedy decoding: prefill, then one-token steps until an end-of-sequence id or the budget."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import torch

from dictation.asr.model import AsrModel


@dataclass
class Generation:
    token_ids: list[int]  # generated ids, EOS excluded
    stopped_on_eos: bool
    prefill_s: float
    decode_s: float
    first_logits: torch.Tensor | None = field(default=None, repr=False)


def sync_device(device: torch.device) -> None:
    """Wait for queued GPU work, so host timers measure it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@torch.inference_mode()
def greedy(
    model: AsrModel,
    embeds: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_ids: Collection[int],
    keep_first_logits: bool = False,
    should_stop: Callable[[], bool] | None = None,
    start: int = 0,
) -> Generation:
    """Greedy decode after the prompt ``embeds [1, S, hidden]`` (spec §2.5: no sampling, no penalty).

    ``start > 0``: the prompt's first ``start`` positions are already in the cache (``embeds`` is the rest).
    """
    device = model.device
    t0 = time.perf_counter()
    logits = model.prefill(embeds, max_new_tokens, start=start)
    first = logits.float().clone() if keep_first_logits else None
    token = logits.argmax().view(1)
    sync_device(device)
    t1 = time.perf_counter()
    ids: list[int] = []
    eos = set(eos_ids)
    position = start + embeds.shape[1]
    stopped = False
    while len(ids) < max_new_tokens:
        tid = int(token.item())
        if tid in eos:
            stopped = True
            break
        ids.append(tid)
        if len(ids) == max_new_tokens or (should_stop is not None and should_stop()):
            break
        token = model.step(token, position).argmax().view(1)
        position += 1
    sync_device(device)
    return Generation(ids, stopped, t1 - t0, time.perf_counter() - t1, first)
