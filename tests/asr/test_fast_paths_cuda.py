"""The captured CUDA-graph decode step on a GPU (CI has none; the CPU side: test_fast_paths.py).

Three ways to decode: ``graph`` (the default on CUDA), ``static`` (the same static-shape step run
eagerly: CUDA's path wherever no graph is captured) and ``plain`` (the plain step, projections apart,
which CUDA no longer uses). ``graph`` must give exactly the ids of ``static`` in every dtype: the same
kernels on the same shapes, replayed. Against ``plain`` the ids are identical in fp32; in bf16 the
static step's attention over the whole masked cache sums in another order than the plain step's over
the filled part (other kernels), so the ids may part at a near tie: each id ``graph`` picks must be the
plain step's argmax up to bf16 rounding (``pick_gaps``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch

import dictation.asr.decode.greedy as generate_mod
import dictation.asr.nn.model as model_mod
from dictation.asr import AsrEngine, EngineOptions
from dictation.asr.nn import graphs, quant_paths, quant_rows, quantized
from dictation.asr.nn.features import LogMel
from dictation.asr.nn.graphs import DecodeGraph
from dictation.asr.nn.options import ModelOptions
from dictation.asr.tune import writers
from tests.asr.test_cuda import (
    exact_fp32,  # noqa: F401 (autouse: TF32 off, as fp32 identity needs)
    gpu_memory_in_use,
)
from tests.asr.test_fast_paths import (
    BF16_PICK_TOLERANCE,
    CLIPS,
    FUSED_SHAPES,
    decode,
    fused_layers_for,
    pick_gaps,
    prompt_embeds,
    stop_after,
)
from tests.asr.test_variants import write_adapter
from tests.oracle import synth_audio

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def cuda_engine(folder, **options) -> AsrEngine:
    options.setdefault("dtype", "bf16")
    engine = AsrEngine(EngineOptions(model=str(folder), device="cuda", **options))
    engine.prepare()
    return engine


@contextmanager
def mode(engine: AsrEngine, how: str):
    model = engine.model
    saved = model.options
    static = False if how == "plain" else None
    model.options = replace(saved, capture_step=how == "graph", static_step=static, fuse_projections=how != "plain")
    try:
        yield
    finally:
        model.options = saved


def run(engine: AsrEngine, embeds: torch.Tensor, how: str, **kw):
    with mode(engine, how):
        return decode(engine, embeds, **kw)


def check_clips(engine: AsrEngine, exact_plain: bool, clips=CLIPS, **kw) -> list[list[int]]:
    out = []
    for seconds, seed in clips:
        embeds = prompt_embeds(engine, synth_audio(seconds, seed=seed))
        graph = run(engine, embeds, "graph", **kw)
        captured = engine.model.decode_graph
        # Really captured, and its first replay reproduced the warm-up's logits bit for bit.
        assert isinstance(captured, DecodeGraph) and captured.graph is not None and not engine.model.graph_failed
        static = run(engine, embeds, "static", **kw)
        plain = run(engine, embeds, "plain", **kw)
        assert (graph.token_ids, graph.stopped_on_eos) == (static.token_ids, static.stopped_on_eos)
        if exact_plain:
            assert (graph.token_ids, graph.stopped_on_eos) == (plain.token_ids, plain.stopped_on_eos)
        else:
            # Other kernels (attention over the masked whole cache, fused projections), other rounding:
            # the ids may part at a near tie (the first H100 run: from the second id on one clip). Each
            # id the graph picks is the plain step's argmax up to bf16 rounding.
            with mode(engine, "plain"):
                gaps = pick_gaps(engine, embeds, graph.token_ids)
            assert max(gaps) <= BF16_PICK_TOLERANCE, gaps
        out.append(graph.token_ids)
    return out


@pytest.mark.parametrize(
    ("variant", "dtype"), [("fp32", "fp32"), ("bf16", "bf16"), ("int8", "bf16"), ("int4", "bf16"), ("int8", "fp32")]
)
def test_the_captured_step_gives_the_ids_of_the_uncaptured_one(ckpt_untied, variant, dtype):
    engine = cuda_engine(ckpt_untied, variant=variant, dtype=dtype)
    check_clips(engine, exact_plain=dtype == "fp32")


def test_reading_ids_a_step_late_on_cuda_keeps_ids_and_stop(ckpt_stops, monkeypatch):
    engine = cuda_engine(ckpt_stops, dtype="fp32")
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=6))
    ref = run(engine, embeds, "plain", max_new_tokens=30)
    monkeypatch.setitem(generate_mod.READ_LAG, "cuda", 0)
    per_token = run(engine, embeds, "graph", max_new_tokens=30)
    assert per_token.token_ids == ref.token_ids and per_token.stopped_on_eos == ref.stopped_on_eos
    for every, lag in ((1, 1), (8, 0), (3, 2)):
        monkeypatch.setitem(generate_mod.READ_EVERY, "cuda", every)
        monkeypatch.setitem(generate_mod.READ_LAG, "cuda", lag)
        for budget in (1, 2, 5, 9, 30):
            got = run(engine, embeds, "graph", max_new_tokens=budget)
            want = per_token.token_ids[:budget]
            assert got.token_ids == want and got.stopped_on_eos == (per_token.stopped_on_eos and budget > len(want))
        got = run(engine, embeds, "graph", should_stop=stop_after(2))
        assert got.token_ids == ref.token_ids[:2]


def test_cuda_reads_through_pinned_memory_and_events():
    out = torch.arange(6, device="cuda")
    reader = generate_mod._Reader(out)
    assert reader.lag == 1 and reader.host is not None and reader.host.is_pinned()
    for i in range(6):
        reader.queued(i)
    ids = []
    assert not reader.read(0, 4, ids, eos={9}) and ids == [0, 1, 2, 3]
    assert reader.read(4, 6, ids, eos={5}) and ids == [0, 1, 2, 3, 4]


def test_the_graph_is_captured_again_when_the_cache_grows(ckpt_untied, monkeypatch):
    monkeypatch.setattr(model_mod, "DECODE_RESERVE", 3)
    monkeypatch.setattr(model_mod, "CACHE_ROUND", 4)
    # A bucketed prefill makes the cache at least its bucket (64 positions here): room for all 30 tokens
    engine = cuda_engine(ckpt_untied, model_options=ModelOptions(prefill_bucketed=False))
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=2))
    static = run(engine, embeds, "static", max_new_tokens=30)
    model.release_cache()
    captures = []
    real = DecodeGraph._capture
    monkeypatch.setattr(DecodeGraph, "_capture", lambda self, m: captures.append(1) or real(self, m))
    graph = run(engine, embeds, "graph", max_new_tokens=30)
    assert graph.token_ids == static.token_ids and len(graph.token_ids) == 30
    assert len(captures) >= 7 and model.decode_graph.cache is model.cache


def test_the_graph_follows_adapter_changes(ckpt_untied, tmp_path):
    a = write_adapter(tmp_path / "a", seed=1)
    engine = cuda_engine(ckpt_untied, variant="int8", adapters=[str(a)])
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=2))
    with_a = run(engine, embeds, "graph").token_ids
    first = model.decode_graph
    assert run(engine, embeds, "graph").token_ids == with_a and model.decode_graph is first  # reused
    engine.set_adapters([])  # re-quantized layers: new addresses
    without = run(engine, embeds, "graph").token_ids
    assert model.decode_graph is not first and first.graph is None  # captured again, the old one released
    assert without == run(engine, embeds, "static").token_ids != with_a
    engine.set_adapters([str(a)])
    assert run(engine, embeds, "graph").token_ids == with_a == run(engine, embeds, "static").token_ids


def test_unmerged_adapters_decode_with_the_same_step_uncaptured(ckpt_untied, tmp_path):
    a = write_adapter(tmp_path / "a", seed=1)
    folder = writers.write_quantized_folder(ckpt_untied, tmp_path / "int8", "int8")
    engine = cuda_engine(folder, adapters=[str(a)])
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=2))
    got = run(engine, embeds, "graph")
    graph = engine.model.decode_graph
    assert isinstance(graph, DecodeGraph) and not graph.captured and graph.graph is None
    assert got.token_ids == run(engine, embeds, "static").token_ids
    with mode(engine, "plain"):
        assert max(pick_gaps(engine, embeds, got.token_ids)) <= BF16_PICK_TOLERANCE


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_failed_capture_decodes_the_same_ids_uncaptured(ckpt_untied, monkeypatch, dtype):
    engine = cuda_engine(ckpt_untied, dtype=dtype)
    embeds = prompt_embeds(engine, synth_audio(6.5, seed=3))
    want = run(engine, embeds, "graph")
    engine.model.release_cache()

    def broken(self, model):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(DecodeGraph, "_capture", broken)
    got = run(engine, embeds, "graph")
    assert engine.model.graph_failed and not engine.model.decode_graph.captured
    assert (got.token_ids, got.stopped_on_eos) == (want.token_ids, want.stopped_on_eos)


def test_moving_the_model_to_the_cpu_drops_the_graph_and_its_memory(ckpt_untied):
    before = gpu_memory_in_use()
    engine = cuda_engine(ckpt_untied, dtype="fp32")
    model = engine.model
    audio = synth_audio(4.0, seed=2)
    on_gpu = run(engine, prompt_embeds(engine, audio), "graph").token_ids
    graph = model.decode_graph
    model.to("cpu")  # what a GPU failure does
    assert model.decode_graph is None and model.cache is None and graph.graph is None
    engine.pipeline.mel = LogMel(model.cfg.audio.num_mel_bins, torch.device("cpu"))
    on_cpu = run(engine, prompt_embeds(engine, audio), "graph")  # no graph on the CPU: the plain step
    assert on_cpu.token_ids == on_gpu and model.decode_graph is None
    del graph
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() - before < 1 << 20


def test_releasing_the_cache_releases_the_graph(ckpt_untied):
    engine = cuda_engine(ckpt_untied)
    model = engine.model
    run(engine, prompt_embeds(engine, synth_audio(3.0, seed=1)), "graph")
    graph = model.decode_graph
    model.release_cache()
    assert model.decode_graph is None and graph.graph is None and graph.cache is None


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("shape", list(FUSED_SHAPES))
def test_packed_kernels_hold_for_the_fused_shapes_on_cuda(monkeypatch, kind, shape):
    monkeypatch.setattr(quant_paths, "_KERNEL_OK", {})
    in_f, outs = FUSED_SHAPES[shape]
    fused, members, reference = fused_layers_for(kind, in_f, outs, device="cuda")
    cuda, dtype = torch.device("cuda"), torch.bfloat16
    # torch has a CUDA int8 kernel from 2.9 on; before, it must be reported missing and the layer's
    # dequantize + matmul path must be right.
    available = quantized._kernel_available(kind, cuda, dtype)
    assert available == (kind == "int4" or torch_version() >= (2, 9))
    assert fused._kernel_fits(cuda, dtype)
    for rows in (1, 5):
        x = torch.randn(rows, in_f, generator=torch.Generator().manual_seed(rows)).to("cuda", dtype)
        got = (fused._torch_kernel(x, dtype) if available else fused._dequantize_matmul(x)).float()
        expected = x.float() @ reference.T
        bound = quantized._PROBE_TOLERANCE[dtype] * float(expected.abs().max())
        assert float((got - expected).abs().max()) <= bound


def test_the_warm_up_captures_the_step_the_first_dictation_replays(ckpt_untied, monkeypatch):
    engine = cuda_engine(ckpt_untied)
    engine.warm_up()
    graph = engine.model.decode_graph
    assert isinstance(graph, DecodeGraph) and graph.graph is not None
    captures = []
    real = DecodeGraph._capture
    monkeypatch.setattr(DecodeGraph, "_capture", lambda self, m: captures.append(1) or real(self, m))
    engine.transcribe(synth_audio(10.0, seed=4), max_new_tokens=16)
    assert captures == [] and engine.model.decode_graph is graph


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", list(FUSED_SHAPES))
def test_the_triton_int8_kernel_holds_for_the_fused_shapes_on_cuda(monkeypatch, shape, dtype):
    from dictation.asr.nn.kernels import triton_gemv
    from dictation.asr.nn.kernels.triton_gemv import CONFIGS, MAX_ROWS, int8_matmul

    if not triton_gemv.available():  # torch's CUDA wheels bring triton on Linux only
        monkeypatch.setattr(quant_paths, "_CUDA_INT8", {})
        assert quantized.cuda_int8_path(torch.device("cuda"), dtype) != "triton"
        return

    in_f, outs = FUSED_SHAPES[shape]
    fused, _, reference = fused_layers_for("int8", in_f, outs, device="cuda")
    for rows in (1, MAX_ROWS):
        x = torch.randn(rows, in_f, generator=torch.Generator().manual_seed(rows)).to("cuda", dtype)
        expected = x.float() @ reference.T
        bound = quantized._PROBE_TOLERANCE[dtype] * float(expected.abs().max())
        for block in (None, *CONFIGS):  # autotuned, then each candidate
            got = int8_matmul(x, fused.weight, fused.weight_scale, block=block)
            assert got.dtype == dtype and float((got.float() - expected).abs().max()) <= bound


@pytest.mark.parametrize("path", ["triton", "torch", "dequantize"])
def test_every_cuda_int8_path_gives_the_graph_the_ids_of_the_uncaptured_step(ckpt_untied, monkeypatch, path):
    from dictation.asr.nn.kernels import triton_gemv

    options = ModelOptions(cuda_int8_path=path)
    chosen = quantized.cuda_int8_path(torch.device("cuda"), torch.bfloat16, options)
    # A forced path that cannot run here falls back to dequantize + matmul, which is then what's checked.
    usable = {"triton": triton_gemv.available(), "torch": torch_version() >= (2, 9), "dequantize": True}[path]
    assert chosen == (path if usable else "dequantize")
    engine = cuda_engine(ckpt_untied, variant="int8", model_options=options)
    check_clips(engine, exact_plain=False)


def test_the_int8_path_is_timed_once_and_logged(monkeypatch, caplog):
    caplog.set_level("INFO", logger="dictation.asr.nn.quant_paths")
    monkeypatch.setattr(quant_paths, "_CUDA_INT8", {})
    chosen = quantized.cuda_int8_path(torch.device("cuda"), torch.bfloat16)
    assert chosen in quantized.CUDA_INT8_PATHS
    assert quantized.cuda_int8_path(torch.device("cuda"), torch.bfloat16) == chosen
    if "one row through 4096x2048" in caplog.text:  # more than one path was usable: all were timed
        assert f"using {chosen}" in caplog.text


def test_folded_masked_attention_on_cuda_equals_enable_gqa(ckpt_untied, monkeypatch):

    engine = cuda_engine(ckpt_untied, dtype="fp32")
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(6.0, seed=3))
    got = {}
    for fold in (False, True):  # every prefill chunk after the first is masked
        model.options = replace(model.options, prefill_chunk=7, fold_masked_gqa=fold)
        engine.pipeline.cache_owner = None
        got[fold] = model.prefill(embeds, 8).float().cpu(), run(engine, embeds, "static").token_ids
    torch.testing.assert_close(got[True][0], got[False][0], atol=1e-4 * float(got[False][0].abs().max()), rtol=0)
    assert got[True][1] == got[False][1]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_encoder_is_captured_per_bucket_and_gives_the_uncaptured_rows(ckpt_untied, monkeypatch, dtype):
    from dictation.asr.nn.graphs import StaticCall

    engine = cuda_engine(ckpt_untied, dtype=dtype)
    encoder = engine.model.audio_tower
    clips = [(2.5, 1), (4.3, 2), (9.7, 3), (30.0, 4), (40.0, 5)]  # buckets 1, 1, 2, 4; 5 windows uncaptured
    with torch.inference_mode():
        features = [engine.pipeline.mel(synth_audio(seconds, seed=seed)) for seconds, seed in clips]
        model = engine.model
        model.options = replace(model.options, encoder_graph=False)  # drops the captured buckets
        uncaptured = [encoder(f) for f in features]
        model.options = replace(model.options, encoder_bucketed=False)
        unpadded = [encoder(f) for f in features]
        model.options = replace(model.options, encoder_bucketed=None, encoder_graph=True)
        captured = [encoder(f) for f in features]
        again = encoder(features[0])
    assert sorted(encoder._graphs) == [1, 2, 4]
    calls = list(encoder._graphs.values())
    assert all(isinstance(c, StaticCall) and c.captured and not c.failed for c in calls)
    for got, want, plain in zip(captured, uncaptured, unpadded, strict=True):
        assert torch.equal(got, want)  # the same kernels, replayed
        scale = float(plain.abs().max())
        torch.testing.assert_close(got.float(), plain.float(), rtol=0, atol=(1e-5 if dtype == "fp32" else 3e-2) * scale)
    assert torch.equal(again, captured[0])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_prefill_is_captured_per_bucket_and_gives_the_uncaptured_logits_and_cache(ckpt_untied, monkeypatch, dtype):
    engine = cuda_engine(ckpt_untied, dtype=dtype)
    model = engine.model
    embeds = [prompt_embeds(engine, synth_audio(s, seed=r)) for s, r in ((2.5, 1), (3.0, 2), (6.5, 3), (19.5, 13))]
    runs = {}
    with torch.inference_mode():
        for capture in (False, True):
            model.options = replace(model.options, prefill_graph=capture)
            model._drop_prefills()
            runs[capture] = []
            for e in embeds:
                logits = model.prefill(e, 8).clone()
                runs[capture].append((logits, model.cache.keys[..., : e.shape[1], :].clone()))
    assert sorted(model._prefills) == [64, 128, 320]  # 48, 54, 100 and 269 positions
    assert all(call.captured and not call.failed for call in model._prefills.values())
    for (got, got_keys), (want, want_keys) in zip(runs[True], runs[False], strict=True):
        assert torch.equal(got, want) and torch.equal(got_keys, want_keys)  # the same kernels, replayed


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_bucketed_rows_are_captured_and_give_the_uncaptured_logits_and_cache(ckpt_untied, monkeypatch, dtype):
    """The prompt tail after a cached prompt and a draft check, captured per row bucket."""
    engine = cuda_engine(ckpt_untied, dtype=dtype)
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(6.5, seed=3))
    total = embeds.shape[1]
    tokens = torch.tensor([11, 402, 7, 93, 1500, 8], device="cuda")
    runs = {}
    with torch.inference_mode():
        for capture in (False, True):
            model.options = replace(model.options, prefill_graph=capture)
            model._drop_prefills()
            model.prefill(embeds[:, : total - 30], 8)
            tail = model.prefill(embeds[:, total - 30 :], 8, start=total - 30).clone()
            checked = model.forward_tokens(tokens, total).clone()
            runs[capture] = (tail, checked, model.cache.keys[..., : total + 6, :].clone())
    assert sorted(model._rows) == [16, 32]
    assert all(call.captured and not call.failed for call in model._rows.values())
    for got, want in zip(runs[True], runs[False], strict=True):
        assert torch.equal(got, want)  # the same kernels, replayed


def test_the_warm_up_captures_every_bucket_the_first_dictations_use(ckpt_untied, monkeypatch):
    from dictation.asr.nn.graphs import StaticCall

    engine = cuda_engine(ckpt_untied)
    engine.warm_up()
    model = engine.model
    calls = [*model.audio_tower._graphs.values(), *model._prefills.values(), *model._rows.values()]
    assert all(call.captured for call in calls)
    assert len(model.audio_tower._graphs) == 4 and len(model._prefills) == 14
    assert sorted(model._rows) == list(model_mod.ROW_BUCKETS)
    made = []
    real = StaticCall.__init__
    monkeypatch.setattr(StaticCall, "__init__", lambda self, *a, **k: made.append(1) or real(self, *a, **k))
    for seconds in (1.5, 10.0, 25.0):
        audio = synth_audio(seconds, seed=8)
        ids = engine.transcribe(audio, max_new_tokens=4).token_ids
        stream = engine.stream(max_new_tokens=4)
        stream.feed(audio)  # the windows extended, then the tail and a draft check at the finish
        assert len(stream.finish(draft_ids=ids[:2]).token_ids) == 4
    assert made == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", list(FUSED_SHAPES))
@pytest.mark.parametrize("group", [128, 32])
def test_the_triton_int4_kernel_holds_for_the_fused_shapes_on_cuda(monkeypatch, shape, dtype, group):
    from dictation.asr.nn.kernels import triton_gemv
    from dictation.asr.nn.kernels.triton_gemv import INT4_CONFIGS, MAX_ROWS, int4_matmul

    if not triton_gemv.available():
        monkeypatch.setattr(quant_paths, "_CUDA_INT4", {})
        assert quantized.cuda_int4_path(torch.device("cuda"), dtype) != "triton"
        return

    in_f, outs = FUSED_SHAPES[shape]
    gen = torch.Generator().manual_seed(group)
    layers = [
        quantized.Int4Linear.from_weight(torch.randn(n, in_f, generator=gen) / 32, group_size=group) for n in outs
    ]
    fused = quant_rows.fuse_rows(layers).to("cuda")
    reference = fused.dequantize()
    for rows in (1, MAX_ROWS):
        x = torch.randn(rows, in_f, generator=torch.Generator().manual_seed(rows)).to("cuda", dtype)
        expected = x.float() @ reference.T
        bound = quantized._PROBE_TOLERANCE[dtype] * float(expected.abs().max())
        for block in (None, *INT4_CONFIGS):  # autotuned, then each candidate
            got = int4_matmul(x, fused.qweight, fused.scales, fused.zeros, block=block)
            assert got.dtype == dtype and float((got.float() - expected).abs().max()) <= bound, block


@pytest.mark.parametrize("path", ["triton", "torch", "dequantize"])
def test_every_cuda_int4_path_gives_the_graph_the_ids_of_the_uncaptured_step(ckpt_untied, monkeypatch, path):
    from dictation.asr.nn.kernels import triton_gemv

    options = ModelOptions(cuda_int4_path=path)
    chosen = quantized.cuda_int4_path(torch.device("cuda"), torch.bfloat16, options)
    usable = {"triton": triton_gemv.available(), "torch": True, "dequantize": True}[path]
    assert chosen == (path if usable else "dequantize")
    engine = cuda_engine(ckpt_untied, variant="int4", model_options=options)
    check_clips(engine, exact_plain=False)
    if chosen == "triton":  # decoding never needed tinygemm's packed copy of the weights
        layers = [m for m in engine.model.modules() if isinstance(m, quantized.Int4Linear)]
        layers += engine.model.decoder.fused_layers()
        cached = [t for layer in layers for tensors in layer._cache.values() for t in tensors]
        assert cached and not [t for t in cached if t.dtype == torch.int32]


def test_the_int4_path_is_timed_once_and_logged(monkeypatch, caplog):
    caplog.set_level("INFO", logger="dictation.asr.nn.quant_paths")
    monkeypatch.setattr(quant_paths, "_CUDA_INT4", {})
    chosen = quantized.cuda_int4_path(torch.device("cuda"), torch.bfloat16)
    assert chosen in quantized.CUDA_PATHS
    assert quantized.cuda_int4_path(torch.device("cuda"), torch.bfloat16) == chosen
    assert "int4 on cuda" in caplog.text and f"using {chosen}" in caplog.text  # tinygemm runs: always timed


def test_gpu_timing_spills_l2_and_sees_the_cost_of_the_bytes():
    """A layer twice as large takes longer per call: the copies make the weights come from memory."""
    device = torch.device("cuda")
    times = {}
    for rows in (4096, 8192):
        weight = torch.randn(rows, 4096, device=device, dtype=torch.bfloat16)
        x = torch.randn(1, 4096, device=device, dtype=torch.bfloat16)
        copies = [weight] + [weight.clone() for _ in range(7)]
        times[rows] = graphs.gpu_time_ms([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in copies], device)
    assert times[8192] > 1.3 * times[4096]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_one_pass_int4_dequantize_gives_torchs_bits_on_the_gpu(dtype):
    from dictation.asr.nn.kernels import triton_dequant

    assert quantized.one_pass_dequantize_usable(torch.device("cuda"), dtype)
    gen = torch.Generator().manual_seed(5)
    for out_f, in_f, group in [(4096, 2048, 128), (2048, 6144, 128), (12288, 2048, 64), (24, 2304, 32)]:
        layer = quantized.Int4Linear.from_weight(torch.randn(out_f, in_f, generator=gen) / 16, group_size=group)
        layer = layer.to("cuda")
        scale, mid = layer._half_scales(dtype)
        got = triton_dequant.int4_dequantize(layer.qweight, scale, mid, layer.group_size)
        assert torch.equal(got, layer.torch_dequantized(dtype)), (out_f, in_f, group)


def test_an_int4_prefill_gives_the_same_logits_with_the_one_pass_dequantize(ckpt_untied, monkeypatch):
    engine = cuda_engine(ckpt_untied, variant="int4")
    embeds = prompt_embeds(engine, synth_audio(6.5, seed=3))  # 100 positions: past the int4 kernels' rows
    runs = []
    with torch.inference_mode():
        for devices in ((), ("cuda",)):
            engine.model.options = replace(engine.model.options, one_pass_dequantize=devices)
            engine.model._drop_prefills()
            runs.append(engine.model.prefill(embeds, 8).clone())
    assert torch.equal(runs[0], runs[1])
