"""Greedy decoding: prefill, then one-token steps until an end-of-sequence id or the budget.

Draft verification (issue 6): a *draft* is a guess at the output, e.g. the ids of a partial
transcript of the audio so far. After the prefill picks the first token, the draft tokens are
checked in one forward pass per up to ``VERIFY_CHUNK`` tokens instead of one pass per token; the
longest prefix the model would have produced itself is kept, plus the model's own next token, and
decoding goes on from there. Greedy verification is lossless: the ids are those of plain greedy
decoding whatever the draft (up to float rounding of the batched pass, as with chunked prefill).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch

from dictation.asr.model import AsrModel

# Draft tokens checked per forward pass: bounds the attention memory of a long draft on a long
# prompt, and the compute wasted when the draft goes wrong early.
VERIFY_CHUNK = 256


@dataclass
class Generation:
    token_ids: list[int]  # generated ids, EOS excluded
    stopped_on_eos: bool
    prefill_s: float
    decode_s: float
    first_logits: torch.Tensor | None = field(default=None, repr=False)
    draft_accepted: int = 0  # leading draft ids the output reproduced (their common prefix)
    draft_passes: int = 0  # verification forward passes run


def sync_device(device: torch.device) -> None:
    """Wait for queued GPU work, so host timers measure it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def usable_draft(draft: Sequence[int] | None, eos_ids: Collection[int], vocab_size: int) -> list[int]:
    """The part of ``draft`` that could match an output: up to its first EOS or out-of-vocabulary id
    (outputs never contain EOS, so nothing after one can be accepted)."""
    out: list[int] = []
    for t in draft or ():
        t = int(t)
        if t in eos_ids or not 0 <= t < vocab_size:
            break
        out.append(t)
    return out


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
    draft: Sequence[int] | None = None,
) -> Generation:
    """Greedy decode after the prompt ``embeds [1, S, hidden]`` (spec §2.5: no sampling, no penalty).

    ``start > 0``: the prompt's first ``start`` positions are already in the cache (``embeds`` is the rest).

    ``draft``: a guess at the whole output (generated ids from the first one on, EOS excluded), e.g.
    a partial transcript's ``token_ids``. It changes only the speed, never the ids: while the output
    so far equals the draft's start, the next draft tokens are fed in one pass and every one whose
    preceding logits' argmax is that token is taken as is (``Generation.draft_accepted`` counts them).
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
    guess = usable_draft(draft, eos, model.cfg.text.vocab_size)
    verifying = bool(guess)  # the output so far equals guess[: len(ids)]
    accepted = passes = 0
    # Invariant at the loop top: ``token`` is the next output id; the cache holds every position
    # before ``position`` (prompt and ``ids``), which is where ``token`` goes when fed.
    position = start + embeds.shape[1]
    stopped = False
    while len(ids) < max_new_tokens:
        tid = int(token.item())
        if tid in eos:
            stopped = True
            break
        if verifying:
            if len(ids) < len(guess) and guess[len(ids)] == tid:
                accepted += 1
            else:
                verifying = False
        ids.append(tid)
        if len(ids) == max_new_tokens or (should_stop is not None and should_stop()):
            break
        if verifying:
            # Feed [tid, d_1 .. d_m]; row i of the logits picks output number len(ids) + i, so at most
            # max_new_tokens - 1 - len(ids) draft tokens are worth feeding.
            chunk = guess[len(ids) : len(ids) + min(VERIFY_CHUNK - 1, max_new_tokens - 1 - len(ids))]
            if chunk:
                fed = torch.tensor([tid, *chunk], device=device)
                picks = model.forward_tokens(fed, position).argmax(-1).tolist()
                passes += 1
                n = 0
                while n < len(chunk) and picks[n] == chunk[n]:
                    n += 1
                # chunk[:n] were fed after a matching prefix: their cache entries are right. The
                # entries of the rejected chunk[n:] (positions position+n+1 ..) are stale; each is
                # overwritten by the next step before any query can see it (a call at p attends
                # to positions <= p only, and writes p first).
                ids.extend(chunk[:n])
                accepted += n
                position += n + 1
                token = torch.tensor([picks[n]], device=device)  # the model's own next token
                continue
            # No draft left (the next check ends verifying) or one id of budget left: a plain step.
        token = model.step(token, position).argmax().view(1)
        position += 1
    sync_device(device)
    return Generation(ids, stopped, t1 - t0, time.perf_counter() - t1, first, accepted, passes)
