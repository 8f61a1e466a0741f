"""What the CPU engine keeps resident between dictations (docs/engine.md, "CPU memory"): a KV cache
sized for long utterances takes memory only for the positions written, and the heap's free pages
are handed back after a pass."""

from __future__ import annotations

import os

import numpy as np
import torch

from dictation.asr import AsrEngine, EngineOptions
from dictation.asr import engine as engine_module
from dictation.asr.nn.kv_cache import StaticKVCache

PAGE = os.sysconf("SC_PAGE_SIZE")


def resident() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * PAGE


def test_a_cpu_cache_takes_memory_only_for_the_positions_written():
    layers, heads, dim, positions = 8, 8, 128, 4096  # keys and values: 256 MiB in fp32
    before = resident()
    cache = StaticKVCache(layers, heads, dim, positions, torch.float32, torch.device("cpu"))
    k = torch.full((1, heads, 16, dim), 0.5)
    for layer in range(layers):
        cache.write(layer, 0, k, -k)
    grown = resident() - before
    assert cache.nbytes() >= 256 * 2**20
    # 16 of 4096 positions written: a 4 KiB page holds 8 positions of 128 floats, so 2 pages per layer,
    # head, keys and values (1 MiB), nothing like the whole buffer
    assert grown < 32 * 2**20, f"the cache took {grown / 2**20:.0f} MiB for 16 positions"
    keys, values = cache.layer(layers - 1)
    assert torch.equal(keys[..., :16, :], k) and torch.equal(values[..., :16, :], -k)
    assert torch.count_nonzero(keys[..., 16:, :]) == 0 and torch.isfinite(values).all()  # the rest reads as zero
    grown_after_reading = resident() - before
    assert grown_after_reading < 64 * 2**20, "reading the unwritten positions brought them in"


def test_a_cpu_cache_that_grows_keeps_what_it_held():
    small = StaticKVCache(2, 2, 8, 4, torch.float32, torch.device("cpu"))
    small.write(1, 0, torch.ones(1, 2, 3, 8), torch.full((1, 2, 3, 8), 2.0))
    big = StaticKVCache(2, 2, 8, 64, torch.float32, torch.device("cpu"))
    big.copy_from(small)
    keys, values = big.upto(1, 4)
    assert torch.equal(keys[..., :3, :], torch.ones(1, 2, 3, 8)) and torch.count_nonzero(keys[..., 3:, :]) == 0
    assert torch.equal(values[..., :3, :], torch.full((1, 2, 3, 8), 2.0))


def test_the_heap_is_handed_back_after_a_cpu_pass_and_the_warm_up(ckpt_untied, monkeypatch):
    calls = []
    monkeypatch.setattr(engine_module, "release_freed_memory", lambda: calls.append(1))
    engine = AsrEngine(EngineOptions(model=str(ckpt_untied), device="cpu", dtype="fp32"))
    engine.prepare()
    calls.clear()  # the load's own release
    engine.warm_up()
    assert calls == [1]
    rng = np.random.default_rng(0)
    engine.transcribe((0.01 * rng.standard_normal(16000)).astype(np.float32), language="English", max_new_tokens=4)
    assert calls == [1, 1]
