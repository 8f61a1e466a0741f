"""Greedy decoding: prefill, then one-token steps until an end-of-sequence id or the budget.

Draft verification (issue 6): a *draft* is a guess at the output, e.g. the ids of a partial
transcript of the audio so far. After the prefill picks the first token, the draft tokens are
checked in one forward pass per up to ``VERIFY_CHUNK`` tokens instead of one pass per token; the
longest prefix the model would have produced itself is kept, plus the model's own next token, and
decoding goes on from there. Greedy verification is lossless: the ids are those of plain greedy
decoding whatever the draft (up to float rounding of the batched pass, as with chunked prefill).

No host sync per token (issue 6): the ids stay on the device, each step's argmax feeding the next.
On CUDA each id is copied to pinned host memory as soon as its step is queued, and the host checks
it for EOS one step later (``READ_LAG``), while the next step already runs: the GPU never waits for
the host, and one step is wasted after an EOS (it writes a cache position past the output, which
nothing reads). The CPU reads every id at once (it costs nothing there); other accelerators read
every ``READ_EVERY`` steps. Either way the ids, ``stopped_on_eos`` and ``should_stop`` behave as if
each token were checked before the next step.

The decode step on CUDA (issue 6): always ``AsrModel.static_step`` (device position, k/v written by
index, attention over the whole static cache under a mask), captured once per cache as a CUDA graph
and replayed per token (:class:`DecodeGraph`); captured again when the cache grows or the weights
change (``AsrModel.weights_key``), dropped with the cache. Where it cannot be captured (unmerged
adapters, a failed capture, a first replay that disagrees with the same step run eagerly) the same
step runs eagerly, so a captured and an uncaptured decode are the same kernels and give the same ids
in every dtype. The CPU and MPS use the plain step (faster there).
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
# Steps between host reads of the generated ids, by device type (others: the default).
READ_EVERY = {"cpu": 1, "cuda": 1}
READ_EVERY_DEFAULT = 8
# Steps the device runs ahead of the host's read of an id, by device type (others: 0). CUDA reads
# through pinned memory and events; elsewhere a lag only delays the reads (how the CPU tests check it).
READ_LAG = {"cuda": 1}
# False: never capture the decode step (the static step then runs eagerly on CUDA).
USE_CUDA_GRAPH = True
# Which one-token step decodes. None: the static-shape step on CUDA (and where the model compiles its
# step, AsrModel.compile_step), the plain step elsewhere. True: the static step everywhere (the CPU
# tests); False: the plain step everywhere.
STATIC_STEP: bool | None = None
# Set once the warning that pinned memory is unavailable has been logged.
_PIN_WARNED = False
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
            graph = _graph_for(model, out[n - 1 : n], position, key, capture=use_graph == "capture")
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
    if not (cuda or model.compile_step if STATIC_STEP is None else STATIC_STEP):
        return None, None  # before the scan: it costs about half a millisecond
    key, unmerged = model.step_state()
    if USE_CUDA_GRAPH and cuda and not model.graph_failed and not unmerged:
        return "capture", key
    return "eager", key


def _graph_for(model: AsrModel, token: torch.Tensor, position: int, key: tuple, *, capture: bool) -> DecodeGraph:
    """The model's static step for its current cache and weights (``key``: ``model.weights_key()``),
    captured now if ``capture`` and there is none. If capturing fails (logged once), the same step
    runs uncaptured from then on."""
    capture = capture and not model.graph_failed
    graph = model.decode_graph
    if graph is None or graph.captured != capture or graph.cache is not model.cache or graph.weights != key:
        model.decode_graph = None
        if graph is not None:
            graph.close()
        try:
            graph = DecodeGraph(model, token, position, capture=capture)
        except RuntimeError as exc:
            if not capture:
                raise
            # The warm-up computed this very step, so the cache holds nothing wrong.
            log.warning("capturing the decode step as a CUDA graph failed (%s); decoding without it", exc)
            model.graph_failed = True
            graph = DecodeGraph(model, token, position, capture=False)
        model.decode_graph = graph
    else:
        graph.load(token, position)
    return graph


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream per GPU that every capture warms up and captures on. One, not one per
    capture: cuBLAS keeps a workspace (8-32 MiB) per handle and stream until the process ends, so a
    new stream for each capture (a cache grown, adapters switched) would pile them up."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[index] = torch.cuda.Stream(torch.device("cuda", index))
    return _CAPTURE_STREAMS[index]


class DecodeGraph:
    """``AsrModel.static_step`` + argmax captured as one CUDA graph for one KV cache.

    Static buffers: ``token [1]`` and ``position [1]`` (int64). One replay feeds ``token`` at
    ``position``, writes the next id into ``token`` and advances ``position``, so replays chain
    without the host; the caller copies ``token`` out after each. Captured after ``GRAPH_WARMUP``
    eager runs on the capture stream (they compute the very step that is due, so the k/v they write
    are the right ones). The graph holds the addresses of the cache, the RoPE tables, the (fused)
    weights and the quantized layers' kernel layouts: it is valid for ``cache`` and while
    ``AsrModel.weights_key()`` is what it was at capture.

    The first replay computes the warm-up's step again; its logits must equal the warm-up's bit for
    bit. If they do not, the graph is dropped (logged; ``AsrModel.graph_failed``), the step is run
    again eagerly (rewriting its k/v) and every later one runs eagerly too.

    ``capture=False``: the same buffers and bookkeeping, the step run eagerly at each replay (any
    device; the fallback on CUDA, and how the CPU tests check everything but the capture itself)."""

    def __init__(self, model: AsrModel, token: torch.Tensor, position: int, *, capture: bool = True) -> None:
        device = model.device
        self.cache = model.cache
        self.captured = capture
        self.token = token.detach().clone().view(1)
        self.position = torch.full((1,), position, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None  # the last step's (the graph's output buffer)
        self.expected: torch.Tensor | None = None  # the warm-up's logits, until the first replay
        self._model = weakref.ref(model)
        self.weights: tuple | None = None  # AsrModel.weights_key() once the kernel layouts exist
        if capture:
            self._capture(model)
            self.weights = model.weights_key()  # the warm-up built them

    def _step(self, model: AsrModel) -> None:
        self.logits = model.static_step(self.token, self.position)
        self.token.copy_(self.logits.argmax(-1, keepdim=True))
        self.position.add_(1)

    def _capture(self, model: AsrModel) -> None:
        device = model.device
        # torch.cuda.graph syncs and empties the cache of the current device: make it the model's.
        with torch.cuda.device(device):
            stream = capture_stream(device)
            previous = torch.cuda.current_stream(device)
            stream.wait_stream(previous)
            with torch.cuda.stream(stream):
                # The whole step on copies of the inputs (the argmax and the in-place updates too):
                # nothing runs for the first time, lazily set up, inside the capture.
                token, position = self.token.clone(), self.position.clone()
                for _ in range(GRAPH_WARMUP):
                    self.expected = model.static_step(self.token, self.position)
                    token.copy_(self.expected.argmax(-1, keepdim=True))
                    position.add_(1)
            previous.wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            try:
                # thread_local: the app's other threads may touch CUDA (memory queries) meanwhile.
                with torch.cuda.graph(self.graph, stream=stream, capture_error_mode="thread_local"):
                    self._step(model)
            except BaseException:
                # A capture that fails at its end leaves this thread on the capture stream: the
                # uncaptured fallback must run where everything else does.
                torch.cuda.set_stream(previous)
                self.graph = None
                raise

    def load(self, token: torch.Tensor, position: int) -> None:
        """Set the next replay's input: ``token [1]`` (device) fed at ``position``."""
        self.token.copy_(token.view(1))
        self.position.fill_(position)

    def replay(self, out: torch.Tensor) -> None:
        """One step; the next id lands in ``out [1]`` (and stays in ``token`` for the next replay)."""
        if self.graph is not None:
            fed = self.token.clone() if self.expected is not None else None
            self.graph.replay()
            if fed is not None:
                self._check_first_replay(self._model(), fed)
        else:
            model = self._model()
            self._step(model)
            if self.weights is None:
                self.weights = model.weights_key()
        out.copy_(self.token)

    def _check_first_replay(self, model: AsrModel, fed: torch.Tensor) -> None:
        expected, self.expected = self.expected, None
        if torch.equal(self.logits, expected):  # one host sync per capture
            return
        log.warning("the captured decode step disagreed with the same step run eagerly; decoding without it")
        model.graph_failed = True
        self.graph.reset()
        self.graph, self.captured = None, False
        self.token.copy_(fed)
        self.position.sub_(1)
        self._step(model)  # the same step again, eagerly: the right id, and the right k/v in the cache

    def close(self) -> None:
        if self.graph is not None:
            self.graph.reset()
            self.graph = None
        self.cache = None
        self.logits = self.expected = None
