"""The fused decoder kernels and the compiled step on a GPU (the CPU side:
test_triton_fused.py, test_compiled_step.py).

``fused``: CUDA's default, our Triton kernels in prefill and decode; ``unfused``: the torch ops (the
path before the fused kernels, ``TextDecoder.kernels = False``). In fp32 both give the plain step's ids; in
bf16 the attention sums (and rsqrt/exp approximations) differ, so only the first ids are compared,
as test_fast_paths_cuda.py does for the static step. Captured or not, each path gives its own ids.
"""

from __future__ import annotations

import pytest
import torch

from dictation.asr.nn import compiled
from dictation.asr.nn.graphs import DecodeGraph
from dictation.asr.nn.kernels import fused, triton_fused
from dictation.bench import kernel_count
from tests.asr.test_cuda import exact_fp32  # noqa: F401 (autouse: TF32 off, as fp32 identity needs)
from tests.asr.test_fast_paths import CLIPS, prompt_embeds
from tests.asr.test_fast_paths_cuda import cuda_engine, run
from tests.oracle import synth_audio

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def both(engine, embeds, how: str = "graph", **kw):
    """(unfused, fused) generations with the same decode mode."""
    decoder = engine.model.decoder
    decoder.kernels = False
    try:
        unfused = run(engine, embeds, how, **kw)
    finally:
        decoder.kernels = None
    return unfused, run(engine, embeds, how, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_kernels_pass_their_probe_on_this_gpu(dtype):
    device = torch.device("cuda", torch.cuda.current_device())
    for dims in (fused.SMALL, fused.Dims(2048, 6144, 16, 8, 128), fused.Dims(1024, 3072, 16, 8, 128)):  # 1.7B, 0.6B
        assert fused._probe_error(device, dtype, dims) is None, dims
        assert fused._probe_error(device, dtype, dims, gemv=True) is None, dims
    assert fused.usable(device, dtype)


def test_cuda_decodes_with_the_fused_kernels_by_default(ckpt_untied):
    engine = cuda_engine(ckpt_untied)
    model = engine.model
    assert model.decoder.uses_kernels(model.decoder.embed_tokens.weight)
    run(engine, prompt_embeds(engine, synth_audio(2.5, seed=1)), "graph")
    count = kernel_count.decode_step(model, 60)
    assert count.path == "fused" and count.per_layer <= 8, count.describe()


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_fp32_fused_gives_the_unfused_ids_captured_and_not(ckpt_untied, variant):
    engine = cuda_engine(ckpt_untied, variant=variant, dtype="fp32")
    for seconds, seed in CLIPS:
        embeds = prompt_embeds(engine, synth_audio(seconds, seed=seed))
        unfused, graph = both(engine, embeds, "graph")
        captured = engine.model.decode_graph
        assert isinstance(captured, DecodeGraph) and captured.graph is not None and not engine.model.graph_failed
        static = run(engine, embeds, "static")
        plain = run(engine, embeds, "plain")  # the fused prefill kernels one token at a time
        assert graph.token_ids == unfused.token_ids == static.token_ids == plain.token_ids
        scale = float(unfused.first_logits.abs().max())
        torch.testing.assert_close(graph.first_logits, unfused.first_logits, rtol=0, atol=1e-4 * scale)


@pytest.mark.parametrize("variant", ["bf16", "int8", "int4"])
def test_the_captured_fused_step_gives_the_uncaptured_ids(ckpt_untied, variant):
    engine = cuda_engine(ckpt_untied, variant=variant)
    for seconds, seed in CLIPS:
        embeds = prompt_embeds(engine, synth_audio(seconds, seed=seed))
        graph = run(engine, embeds, "graph")
        assert engine.model.decode_graph.graph is not None and not engine.model.graph_failed
        assert graph.token_ids == run(engine, embeds, "static").token_ids  # the same kernels, replayed
        unfused, _ = both(engine, embeds, "graph")
        assert graph.token_ids[:2] == unfused.token_ids[:2]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_gemv_option_on_cuda(ckpt_untied, dtype):
    engine = cuda_engine(ckpt_untied, dtype=dtype)
    model = engine.model
    model.decoder.gemv = True
    for seconds, seed in CLIPS:
        embeds = prompt_embeds(engine, synth_audio(seconds, seed=seed))
        unfused, graph = both(engine, embeds, "graph")
        assert model.decode_graph.graph is not None and not model.graph_failed
        assert graph.token_ids == run(engine, embeds, "static").token_ids  # captured = uncaptured
        if dtype == "fp32":
            assert graph.token_ids == unfused.token_ids
        else:
            assert graph.token_ids[:2] == unfused.token_ids[:2]
    count = kernel_count.decode_step(model, 60)
    assert count.path == "fused+gemv" and count.per_layer == 5, count.describe()


def test_a_long_cache_splits_the_attention_and_keeps_the_ids(ckpt_untied):
    engine = cuda_engine(ckpt_untied, dtype="fp32")
    engine.model.ensure_capacity(3000)
    assert triton_fused.attention_splits(engine.model.cache.max_len) > 1
    for seconds, seed in CLIPS[:2]:
        embeds = prompt_embeds(engine, synth_audio(seconds, seed=seed))
        unfused, graph = both(engine, embeds, "graph")
        assert graph.token_ids == unfused.token_ids


def test_the_compiled_step_on_cuda_gives_the_unfused_ids(ckpt_untied):
    engine = cuda_engine(ckpt_untied, dtype="fp32")
    model = engine.model
    for seconds, seed in CLIPS[:2]:
        embeds = prompt_embeds(engine, synth_audio(seconds, seed=seed))
        unfused, _ = both(engine, embeds, "graph")
        model.compile_step = True
        try:
            got = run(engine, embeds, "graph")
            assert model.decode_graph.graph is not None and not model.graph_failed
            assert isinstance(model.compiled_step, compiled.CompiledStep)
        finally:
            model.compile_step = False
        assert got.token_ids == unfused.token_ids
    model.compile_step = True
    count = kernel_count.decode_step(model, 60)
    assert count.path == "compiled" and count.generated > 0, count.describe()


def test_bf16_fused_prefill_is_close_to_the_unfused_one(ckpt_untied):
    engine = cuda_engine(ckpt_untied)
    for seconds, seed in CLIPS:
        embeds = prompt_embeds(engine, synth_audio(seconds, seed=seed))
        unfused, got = both(engine, embeds, "graph", max_new_tokens=1)
        cosine = torch.nn.functional.cosine_similarity(got.first_logits, unfused.first_logits, dim=0)
        assert float(cosine) > 0.999 and got.token_ids == unfused.token_ids
