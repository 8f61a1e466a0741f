"""Greedy decoding: prefill, then one-token steps until an end-of-sequence id or the budget.

Draft verification (issue 6): a *draft* is a guess at the output, e.g. the ids of a partial
transcript of the audio so far. After the prefill picks the first token, the draft tokens are
checked in one forward pass per up to ``VERIFY_CHUNK`` tokens instead of one pass per token; the
longest prefix the model would have produced itself is kept, plus the model's own next token, and
decoding goes on from there. Greedy verification is lossless: the ids are those of plain greedy
decoding whatever the draft (up to float rounding of the batched pass, as with chunked prefill).

No host sync per token (issue 6): the ids stay on the device, each step's argmax feeding the next,
and the host reads them every ``EOS_CHECK_EVERY`` steps (every step on the CPU, where reading costs
nothing) and cuts the output at the first EOS: the same ids and ``stopped_on_eos`` as checking each
token, at the price of at most ``EOS_CHECK_EVERY - 1`` wasted steps after an EOS (they write cache
positions past the output, which nothing reads).

CUDA graph (issue 6): on CUDA the one-token step (``AsrModel.static_step``: device position, k/v
written by index, attention over the whole static cache under a mask) is captured once per cache
and replayed per token (:class:`DecodeGraph`); captured again when the cache grows or the weights
change (``AsrModel.weights_key``), dropped with the cache. Not on the CPU or MPS, and
not while unmerged adapters (``LoraLinear``) run.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch

from dictation.asr.model import AsrModel

log = logging.getLogger(__name__)

# Draft tokens checked per forward pass: bounds the attention memory of a long draft on a long
# prompt, and the compute wasted when the draft goes wrong early.
VERIFY_CHUNK = 256
# Steps between host reads of the generated ids on an accelerator (the CPU reads every step).
EOS_CHECK_EVERY = 8
# False: never capture the decode step (the eager step runs instead).
USE_CUDA_GRAPH = True
# True: where no graph is captured, decode with the same static-shape step run eagerly instead of
# the plain step (tests exercise the graph's step and bookkeeping on the CPU this way).
STATIC_STEP_UNCAPTURED = False
# Steps between host reads of the generated ids on the CPU (tests raise it to exercise the cut at EOS).
CPU_EOS_CHECK_EVERY = 1
# Eager runs of the step on the capture stream before capturing (lazy kernel set-up, workspaces).
GRAPH_WARMUP = 2


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

    ``should_stop``: polled after each generated token; True ends the output after that token.
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

    The outputs collect in a device buffer; the host reads them every ``check_every`` steps. Where
    the per-token check would have stopped at an EOS, the steps run after it are discarded: the ids,
    ``stopped_on_eos`` and every ``should_stop`` answer that counts are those of a per-token loop."""
    remaining = max_new_tokens - len(ids)
    if remaining <= 0:
        return False
    device = model.device
    check_every = CPU_EOS_CHECK_EVERY if device.type == "cpu" else EOS_CHECK_EVERY
    out = torch.empty(remaining, dtype=torch.long, device=device)
    out[:1].copy_(token.view(1))
    use_graph, graph = _graph_mode(model), None
    n, checked = 1, 0  # out[:n] are outputs; out[:checked] have been read into ids
    while True:
        if n == remaining or n - checked >= check_every:
            if _read(out, checked, n, ids, eos):
                return True
            checked = n
            if n == remaining:
                return False
        if should_stop is not None and should_stop():
            break
        if model.make_room(position):
            graph = None  # the grown cache gets its own capture
        if graph is None and use_graph:
            graph = _graph_for(model, out[n - 1 : n], position, capture=use_graph == "capture")
            use_graph = use_graph if graph is not None else None
        if graph is not None:
            graph.replay(out[n : n + 1])
        else:
            torch.argmax(model.step(out[n - 1 : n], position), dim=-1, keepdim=True, out=out[n : n + 1])
        position += 1
        n += 1
    return _read(out, checked, n, ids, eos)


def _read(out: torch.Tensor, checked: int, n: int, ids: list[int], eos: Collection[int]) -> bool:
    """Append ``out[checked:n]`` to ``ids`` up to its first EOS; True if there was one (one host sync)."""
    for tid in out[checked:n].tolist():
        if tid in eos:
            return True
        ids.append(tid)
    return False


def _graph_mode(model: AsrModel) -> str | None:
    """ "capture" (a CUDA graph), "eager" (the static step uncaptured) or None (the plain step)."""
    if USE_CUDA_GRAPH and model.device.type == "cuda":
        mode = "capture"
    elif STATIC_STEP_UNCAPTURED:
        mode = "eager"
    else:
        return None  # before the scan for adapters: it costs about a millisecond
    if model.graph_failed or model.decoder.has_unmerged_adapters():
        return None
    return mode


def _graph_for(model: AsrModel, token: torch.Tensor, position: int, *, capture: bool) -> DecodeGraph | None:
    """The model's captured step for its current cache and weights, captured now if there is none.
    None if capturing failed: the model then decodes with the plain step (logged once)."""
    graph = model.decode_graph
    if (
        graph is None
        or graph.captured != capture
        or graph.cache is not model.cache
        or graph.weights != model.weights_key()
    ):
        model.decode_graph = None
        if graph is not None:
            graph.close()
        try:
            graph = model.decode_graph = DecodeGraph(model, token, position, capture=capture)
        except RuntimeError as exc:
            # The warm-up computed this very step, so the cache holds nothing wrong; the plain step
            # takes over for this model (a fresh load tries again).
            log.warning("capturing the decode step as a CUDA graph failed (%s); decoding without it", exc)
            model.graph_failed = True
            return None
    else:
        graph.load(token, position)
    return graph


class DecodeGraph:
    """``AsrModel.static_step`` + argmax captured as one CUDA graph for one KV cache.

    Static buffers: ``token [1]`` and ``position [1]`` (int64). One replay feeds ``token`` at
    ``position``, writes the next id into ``token`` and advances ``position``, so replays chain
    without the host; the caller copies ``token`` out after each. Captured after ``GRAPH_WARMUP``
    eager runs on the capture stream (they compute the very step that is due, so the k/v they write
    are the right ones). The graph holds the addresses of the cache, the RoPE tables, the (fused)
    weights and the quantized layers' kernel layouts: it is valid for ``cache`` and while
    ``AsrModel.weights_key()`` is what it was at capture.

    ``capture=False``: the same buffers and bookkeeping, the step run eagerly at each replay (any
    device; how the CPU tests check everything but the capture itself)."""

    def __init__(self, model: AsrModel, token: torch.Tensor, position: int, *, capture: bool = True) -> None:
        device = model.device
        self.cache = model.cache
        self.captured = capture
        self.token = token.detach().clone().view(1)
        self.position = torch.full((1,), position, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self._model = weakref.ref(model)
        self.weights: tuple | None = None  # AsrModel.weights_key() once the kernel layouts exist
        if capture:
            self._capture(model)
            self.weights = model.weights_key()  # the warm-up built them

    def _step(self, model: AsrModel) -> None:
        nxt = model.static_step(self.token, self.position).argmax(-1, keepdim=True)
        self.token.copy_(nxt)
        self.position.add_(1)

    def _capture(self, model: AsrModel) -> None:
        device = model.device
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(GRAPH_WARMUP):
                model.static_step(self.token, self.position)
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the app's other threads may touch CUDA (memory queries) while this captures.
        with torch.cuda.graph(self.graph, stream=stream, capture_error_mode="thread_local"):
            self._step(model)

    def load(self, token: torch.Tensor, position: int) -> None:
        """Set the next replay's input: ``token [1]`` (device) fed at ``position``."""
        self.token.copy_(token.view(1))
        self.position.fill_(position)

    def replay(self, out: torch.Tensor) -> None:
        """One step; the next id lands in ``out [1]`` (and stays in ``token`` for the next replay)."""
        if self.graph is not None:
            self.graph.replay()
        else:
            model = self._model()
            self._step(model)
            if self.weights is None:
                self.weights = model.weights_key()
        out.copy_(self.token)

    def close(self) -> None:
        if self.graph is not None:
            self.graph.reset()
            self.graph = None
        self.cache = None
