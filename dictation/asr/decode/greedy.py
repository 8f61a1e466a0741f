"""Greedy decoding: prefill, then one-token steps until an end-of-sequence id or the budget.

Draft verification: a *draft* is a guess at the output, e.g. the ids of a partial
transcript of the audio so far. After the prefill picks the first token, the draft tokens are
checked in one forward pass per up to ``VERIFY_CHUNK`` tokens instead of one pass per token; the
longest prefix the model would have produced itself is kept, plus the model's own next token, and
decoding goes on from there. Greedy verification is lossless: the ids are those of plain greedy
decoding whatever the draft (up to float rounding of the batched pass, as with chunked prefill). On
CUDA each check (at most ``VERIFY_CHUNK`` ids) replays the captured graph of its row bucket
(``AsrModel.forward_rows``).

No host sync per token: the ids stay on the device, each step's argmax feeding the next.
On CUDA each id is copied to pinned host memory as soon as its step is queued, and the host checks
it for EOS one step later (``READ_LAG``), while the next step already runs: the GPU never waits for
the host, and one step is wasted after an EOS (it writes a cache position past the output, which
nothing reads). The CPU reads every id at once (it costs nothing there); other accelerators read
every ``READ_EVERY`` steps. Either way the ids, ``stopped_on_eos`` and ``should_stop`` behave as if
each token were checked before the next step.

The decode step on CUDA: always ``AsrModel.static_step`` (device position, k/v written by
index, attention over the whole static cache under a mask), captured once per cache as a CUDA graph
and replayed per token (:class:`DecodeGraph`); captured again when the cache grows or the weights
change (``AsrModel.weights_key``), dropped with the cache. Where it cannot be captured (unmerged
adapters, a failed capture, a first replay that disagrees with the same step run eagerly) the same
step runs eagerly, so a captured and an uncaptured decode are the same kernels and give the same ids
in every dtype. The CPU and MPS use the plain step (faster there; on the CPU an int8 decoder's plain
step is one native call, nn/native_step.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch

from dictation.asr.nn.model import AsrModel

log = logging.getLogger(__name__)

# Draft tokens checked per forward pass: bounds the attention memory of a long draft on a long
# prompt, and the compute wasted when the draft goes wrong early.
VERIFY_CHUNK = 256
# Steps between host reads of the generated ids, by device type (others: the default).
READ_EVERY = {"cpu": 1, "cuda": 1}
READ_EVERY_DEFAULT = 8
# Steps the device runs ahead of the host's read of an id, by device type (others: 0). CUDA reads
# through pinned memory and events; elsewhere a lag only delays the reads (how the CPU tests check it).
READ_LAG = {"cuda": 1}
# Which one-token step decodes and whether it is captured: the model's options (nn/options.py:
# static_step, None = the static-shape step on CUDA and where the model compiles its step,
# AsrModel.compile_step, the plain step elsewhere; capture_step).
# Set once the warning that pinned memory is unavailable has been logged.
_PIN_WARNED = False


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
    """Greedy decode after the prompt ``embeds [1, S, hidden]`` (docs/model.md §3: no sampling, no penalty).

    ``start > 0``: the prompt's first ``start`` positions are already in the cache (``embeds`` is the rest).

    ``draft``: a guess at the whole output (generated ids from the first one on, EOS excluded), e.g.
    a partial transcript's ``token_ids``. It changes only the speed, never the ids: while the output
    so far equals the draft's start, the next draft tokens are fed in one pass and every one whose
    preceding logits' argmax is that token is taken as is (``Generation.draft_accepted`` counts them).

    ``should_stop``: polled after each generated token; True ends the output after that token.

    The output never runs past the model's last position (``max_position_embeddings``): the
    budget is lowered to the positions left after the prompt.
    """
    room = model.cfg.text.max_position_embeddings - start - embeds.shape[1]
    max_new_tokens = max(0, min(max_new_tokens, room))
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
    accepted = passes = 0
    # Invariant: ``token`` (on the device) is the next output id, not yet checked; the cache holds
    # every position before ``position`` (prompt and ``ids``), which is where ``token`` goes when fed.
    position = start + embeds.shape[1]
    stopped = done = False
    while guess and len(ids) < max_new_tokens:  # draft verification, reading each id on the host
        tid = int(token.item())
        if tid in eos:
            stopped = done = True
            break
        if not (len(ids) < len(guess) and guess[len(ids)] == tid):
            break  # the output left the draft: plain decoding from ``token`` on
        accepted += 1
        ids.append(tid)
        if len(ids) == max_new_tokens or (should_stop is not None and should_stop()):
            done = True
            break
        # Feed [tid, d_1 .. d_m]; row i of the logits picks output number len(ids) + i, so at most
        # max_new_tokens - 1 - len(ids) draft tokens are worth feeding.
        chunk = guess[len(ids) : len(ids) + min(VERIFY_CHUNK - 1, max_new_tokens - 1 - len(ids))]
        if not chunk:
            # No draft left, or one id of budget left: a plain step (the next id may still match).
            token = model.step(token, position).argmax().view(1)
            position += 1
            continue
        fed = torch.tensor([tid, *chunk], device=device)
        picks = model.forward_tokens(fed, position).argmax(-1).tolist()
        passes += 1
        n = 0
        while n < len(chunk) and picks[n] == chunk[n]:
            n += 1
        # chunk[:n] were fed after a matching prefix: their cache entries are right. The entries of
        # the rejected chunk[n:] (positions position+n+1 ..) are stale; each is overwritten by the
        # next step before any query can see it (a call at p attends to positions <= p only, and
        # writes p first).
        ids.extend(chunk[:n])
        accepted += n
        position += n + 1
        token = torch.tensor([picks[n]], device=device)  # the model's own next token
    if not done:
        stopped = _decode(model, token, position, ids, max_new_tokens, eos, should_stop)
    sync_device(device)
    return Generation(ids, stopped, t1 - t0, time.perf_counter() - t1, first, accepted, passes)


def _decode(
    model: AsrModel,
    token: torch.Tensor,
    position: int,
    ids: list[int],
    max_new_tokens: int,
    eos: Collection[int],
    should_stop: Callable[[], bool] | None,
) -> bool:
    """Plain greedy decoding from ``token`` (the next output id, unchecked, at ``position``): appends
    to ``ids`` up to the first EOS or the budget; True if it stopped on an EOS.

    The outputs collect in a device buffer; the host reads them ``lag`` steps late, ``every`` at a
    time (:class:`_Reader`). Where the per-token check would have stopped at an EOS, the steps run
    after it are discarded: the ids, ``stopped_on_eos`` and every ``should_stop`` answer that counts
    are those of a per-token loop."""
    remaining = max_new_tokens - len(ids)
    if remaining <= 0:
        return False
    out = torch.empty(remaining, dtype=torch.long, device=model.device)
    out[:1].copy_(token.view(1))
    reader = _Reader(out)
    reader.queued(0)
    (use_graph, key), graph = _graph_mode(model), None
    n, checked = 1, 0  # out[:n] are outputs; out[:checked] have been read into ids
    while True:
        ready = n if n == remaining else n - reader.lag
        if n == remaining or ready - checked >= reader.every:
            if reader.read(checked, ready, ids, eos):
                return True
            checked = ready
            if n == remaining:
                return False
        if should_stop is not None and should_stop():
            break
        if model.make_room(position):
            graph = None  # the grown cache gets its own capture
        if graph is None and use_graph:
            graph = model.decode_slot.graph_for(model, out[n - 1 : n], position, key, capture=use_graph == "capture")
        if graph is not None:
            graph.replay(out[n : n + 1])
        else:
            torch.argmax(model.step(out[n - 1 : n], position), dim=-1, keepdim=True, out=out[n : n + 1])
        reader.queued(n)
        position += 1
        n += 1
    return reader.read(checked, n, ids, eos)


class _Reader:
    """Hands the generated ids in the device buffer ``out`` to the host, ``every`` at a time and ``lag``
    steps after they were queued (``READ_EVERY``, ``READ_LAG``). On CUDA with a lag, each id is copied
    to pinned memory right after its step, and a read waits only for the events of the steps it
    reads, not for the step queued after them."""

    def __init__(self, out: torch.Tensor) -> None:
        kind = out.device.type
        self.out = out
        self.every = READ_EVERY.get(kind, READ_EVERY_DEFAULT)
        self.lag = READ_LAG.get(kind, 0)
        self.host: torch.Tensor | None = None
        self.events: list = []
        self.stream = None  # where the steps and the copies run: out's device's current stream
        if kind == "cuda" and self.lag:
            try:
                self.host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            except RuntimeError as exc:  # no pinned memory (some sandboxes): read in place, each step
                global _PIN_WARNED
                if not _PIN_WARNED:
                    _PIN_WARNED = True
                    log.warning("no pinned host memory (%s); reading each generated id with a sync", exc)
                self.lag = 0
            else:
                self.events = [None] * out.shape[0]
                # Named, not implied: Event.record() alone records on the *current device's* stream,
                # which is not out's for a model on cuda:1, and its events would not wait for the copies.
                self.stream = torch.cuda.current_stream(out.device)

    def queued(self, i: int) -> None:
        """``out[i]`` is written by the work queued last: start its copy to the host."""
        if self.host is not None:
            self.host[i : i + 1].copy_(self.out[i : i + 1], non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
            self.events[i] = event

    def read(self, start: int, stop: int, ids: list[int], eos: Collection[int]) -> bool:
        """Append ``out[start:stop]`` to ``ids`` up to its first EOS; True if there was one."""
        if stop <= start:
            return False
        if self.host is not None:
            self.events[stop - 1].synchronize()  # the steps before it ran on the same stream
            values = self.host[start:stop].tolist()
        else:
            values = self.out[start:stop].tolist()
        for tid in values:
            if tid in eos:
                return True
            ids.append(tid)
        return False


def _graph_mode(model: AsrModel) -> tuple[str | None, tuple | None]:
    """How this decode steps: "capture" (a CUDA graph), "eager" (the static step uncaptured) or None
    (the plain step); with the static step, also ``AsrModel.weights_key()`` (one scan gives both)."""
    cuda = model.device.type == "cuda"
    options = model.options
    static = options.static_step
    if not (cuda or model.compile_step if static is None else static):
        return None, None  # before the scan: it costs about half a millisecond
    key, unmerged = model.step_state()
    if options.capture_step and cuda and not model.decode_slot.failed and not unmerged:
        return "capture", key
    return "eager", key
