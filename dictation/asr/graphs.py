"""CUDA graphs of whole computations with static shapes (issue 16): the audio encoder per bucket of
8-s windows (``AudioEncoder``), after the decode step (``generate.DecodeGraph``, which has its own).

A :class:`StaticCall` holds static input buffers and ``fn`` run on them, captured as one CUDA graph:
a call copies its inputs into the buffers, replays, and returns a copy of the output. The capture
follows ``DecodeGraph``'s: warm-up runs of ``fn`` on the one capture stream per GPU, then the capture;
the first replay must reproduce the last warm-up's output bit for bit, else the graph is dropped
(logged) and ``fn`` runs uncaptured from then on. ``capture=False`` runs ``fn`` on the same buffers
without a graph: the fallback, and how the CPU tests check everything but the capture.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

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
        from dictation.asr.generate import capture_stream

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
