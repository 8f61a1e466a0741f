"""Every CUDA graph of the engine: whole computations with static shapes captured once and
replayed, and the GPU timing the kernel choices use.

- :class:`StaticCall`: static input buffers and ``fn`` run on them, captured as one CUDA graph: the
  audio encoder per bucket of 8-s windows (``encoder.py``), the bucketed prefill and the bucketed rows
  after a cached prompt (``model.py``: a streaming finish's tail, extended windows, draft checks). A
  call copies its inputs into the buffers, replays, and returns a copy of the output. Warm-up runs of
  ``fn`` on the one capture stream per GPU (:func:`capture_stream`), then the capture; the first
  replay must reproduce the last warm-up's output bit for bit, else the graph is dropped (logged) and
  ``fn`` runs uncaptured from then on. ``capture=False`` runs ``fn`` on the same buffers without a
  graph: the fallback, and how the CPU tests check everything but the capture.
- :class:`DecodeGraph`: the one-token decode step plus argmax for one KV cache, replayed per token by
  greedy decoding (``decode/greedy.py``).
- :func:`gpu_time_ms`: GPU time per call of a few calls captured in one graph, what a decode step
  sees; the int8/int4 kernel choice (``quantized.py``) and the benchmarks time with it.
"""

from __future__ import annotations

import copy
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import nn

from dictation.asr.nn.kv_cache import StaticKVCache

log = logging.getLogger(__name__)

# Eager runs on the capture stream before capturing (lazy kernel set-up, cuDNN/cuBLAS workspaces).
WARMUP = 2


class StaticCall:
    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        example: Sequence[torch.Tensor],
        *,
        capture: bool,
        name: str,
        pool: tuple | None = None,
    ) -> None:
        """``example``: the first call's inputs (the first replay is checked against them); ``pool``: a
        ``torch.cuda.graph_pool_handle()`` shared with other graphs that never run at the same time
        (each call's output is copied before another replays)."""
        self.fn = fn
        self.pool = pool
        self.name = name
        with torch.inference_mode(False):  # ordinary tensors: loadable in and out of inference mode
            self.inputs = [t.detach().clone() for t in example]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: torch.Tensor | None = None
        self.expected: torch.Tensor | None = None  # the warm-up's output, until the first replay
        self.failed = False
        if capture:
            try:
                self._capture()
            except RuntimeError as exc:
                log.warning("capturing the %s as a CUDA graph failed (%s); running it without", name, exc)
                self.graph, self.failed = None, True

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def _capture(self) -> None:
        device = self.inputs[0].device
        with torch.cuda.device(device):
            stream = capture_stream(device)
            previous = torch.cuda.current_stream(device)
            stream.wait_stream(previous)
            with torch.cuda.stream(stream):
                for _ in range(WARMUP):
                    self.expected = self.fn(*self.inputs)
            previous.wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(self.graph, pool=self.pool, stream=stream, capture_error_mode="thread_local"):
                    self.output = self.fn(*self.inputs)
            except BaseException:
                torch.cuda.set_stream(previous)  # a capture failing at its end leaves us on its stream
                self.graph = None
                raise

    def load(self, inputs: Sequence[torch.Tensor]) -> None:
        """Copy ``inputs`` into the static buffers (same shapes)."""
        for buffer, value in zip(self.inputs, inputs, strict=True):
            buffer.copy_(value)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """``fn(*inputs)``, replayed where captured; the result is the caller's (a copy)."""
        self.load(inputs)
        if self.graph is None:
            return self.fn(*self.inputs)
        self.graph.replay()
        if self.expected is not None:
            expected, self.expected = self.expected, None
            if not torch.equal(self.output, expected):  # one host sync per capture
                log.warning(
                    "the captured %s disagreed with the same computation run eagerly; running it without", self.name
                )
                self.close()
                self.failed = True
                return self.fn(*self.inputs)
        return self.output.clone()

    def close(self) -> None:
        if self.graph is not None:
            self.graph.reset()
            self.graph = None
        self.output = self.expected = None


# Eager runs of the step on the capture stream before capturing (lazy kernel set-up, workspaces).
GRAPH_WARMUP = 2


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream per GPU that every capture warms up and captures on. One, not one per
    capture: cuBLAS keeps a workspace (8-32 MiB) per handle and stream until the process ends, so a
    new stream for each capture (a cache grown, adapters switched) would pile them up."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[index] = torch.cuda.Stream(torch.device("cuda", index))
    return _CAPTURE_STREAMS[index]


class SteppedModel(Protocol):
    """What a :class:`DecodeGraph` needs of the model whose step it captures (``model.AsrModel``)."""

    cache: StaticKVCache | None

    @property
    def device(self) -> torch.device: ...

    def static_step(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor: ...

    def weights_key(self) -> tuple: ...


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
    bit. If they do not, the graph is dropped (logged; ``DecodeSlot.failed``), the step is run
    again eagerly (rewriting its k/v) and every later one runs eagerly too.

    ``capture=False``: the same buffers and bookkeeping, the step run eagerly at each replay (any
    device; the fallback on CUDA, and how the CPU tests check everything but the capture itself)."""

    def __init__(
        self,
        model: SteppedModel,
        token: torch.Tensor,
        position: int,
        *,
        capture: bool = True,
        slot: DecodeSlot | None = None,
    ) -> None:
        self.slot = slot  # told when the first replay disagrees (DecodeSlot.failed)
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

    def _step(self, model: SteppedModel) -> None:
        self.logits = model.static_step(self.token, self.position)
        self.token.copy_(self.logits.argmax(-1, keepdim=True))
        self.position.add_(1)

    def _capture(self, model: SteppedModel) -> None:
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

    def _check_first_replay(self, model: SteppedModel, fed: torch.Tensor) -> None:
        expected, self.expected = self.expected, None
        if torch.equal(self.logits, expected):  # one host sync per capture
            return
        log.warning("the captured decode step disagreed with the same step run eagerly; decoding without it")
        if self.slot is not None:
            self.slot.failed = True
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


def l2_copies(layer: nn.Module, device: torch.device, factor: float = 2.0, most: int = 64) -> list[nn.Module]:
    """``layer`` and copies of it holding together at least ``factor`` times the GPU's L2 cache, for
    timing: calling them in turn reads the weights from memory, as a decode step through all the
    layers does, rather than from L2 (50 MB on an H100, more than one decoder layer)."""
    size = sum(t.numel() * t.element_size() for t in (*layer.parameters(), *layer.buffers()))
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
    count = min(most, max(1, -(-int(factor * l2) // max(size, 1))))
    return [layer] + [copy.deepcopy(layer) for _ in range(count - 1)]


def gpu_time_ms(calls: Sequence[Callable[[], object]], device: torch.device, repeats: int = 50) -> float:
    """Milliseconds of GPU time per call: ``repeats`` calls, taking ``calls`` in turn, captured in one
    CUDA graph and replayed (the decode step runs in a graph, so host-side launch costs, which differ
    between torch's ops and Triton's launcher, must not decide), the best of 3 replays. Warm-up
    calls come first (they also let triton.autotune pick its blocks). Where capture fails, the calls
    are timed back to back instead."""
    sequence = [calls[i % len(calls)] for i in range(max(repeats, len(calls)))]
    with torch.inference_mode(), torch.cuda.device(device):
        stream, previous = capture_stream(device), torch.cuda.current_stream(device)
        stream.wait_stream(previous)
        with torch.cuda.stream(stream):  # warm up where the capture runs, as DecodeGraph does
            for call in calls:
                call()
        previous.wait_stream(stream)
        torch.cuda.synchronize(device)
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                for call in sequence:
                    call()
            replay = graph.replay
        except RuntimeError as exc:  # something in the call cannot be captured
            torch.cuda.set_stream(previous)  # a failed capture can leave this thread on its stream
            log.debug("timing without a CUDA graph (%s)", exc)
            torch.cuda.synchronize(device)

            def replay() -> None:
                for call in sequence:
                    call()

        replay()
        best = float("inf")
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            replay()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / len(sequence))
    return best


class DecodeSlot:
    """Where one model's decode step graph lives: the :class:`DecodeGraph` for its current cache and
    weights (or none), and whether capturing failed once (then the model decodes with the same step
    uncaptured from then on). The model owns one and closes its graph with the cache
    (``AsrModel.release_cache``); decoding (decode/greedy.py) asks it for the graph of each decode."""

    def __init__(self) -> None:
        self.graph: DecodeGraph | None = None
        self.failed = False

    def close(self) -> None:
        if self.graph is not None:
            self.graph.close()
            self.graph = None

    def graph_for(
        self, model: SteppedModel, token: torch.Tensor, position: int, key: tuple, *, capture: bool
    ) -> DecodeGraph:
        """The model's static step for its current cache and weights (``key``: ``model.weights_key()``),
        captured now if ``capture`` and there is none. If capturing fails (logged once), the same step
        runs uncaptured from then on."""
        capture = capture and not self.failed
        graph = self.graph
        if graph is None or graph.captured != capture or graph.cache is not model.cache or graph.weights != key:
            self.close()
            try:
                graph = DecodeGraph(model, token, position, capture=capture, slot=self)
            except RuntimeError as exc:
                if not capture:
                    raise
                # The warm-up computed this very step, so the cache holds nothing wrong.
                log.warning("capturing the decode step as a CUDA graph failed (%s); decoding without it", exc)
                self.failed = True
                graph = DecodeGraph(model, token, position, capture=False, slot=self)
            self.graph = graph
        else:
            graph.load(token, position)
        return graph
