"""The decode-step levers (docs/engine.md) give exactly the ids of the plain path (CPU; CUDA: test_fast_paths_cuda.py).

- fused q/k/v and gate/up projections (decoder.py), through adapters, quantization and moves;
- ids kept on the device and read every few steps or a few steps late (decode/greedy.py), cut at the first EOS;
- the static-shape one-token step a CUDA graph captures, here run uncaptured.

The plain path: ``set_fusion(False)``, each id read right after its step, the plain ``AsrModel.step``.
"""

from __future__ import annotations

import math
import weakref
from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dictation.asr.decode.greedy as generate_mod
import dictation.asr.nn.model as model_mod
from dictation.asr import AsrEngine, EngineOptions
from dictation.asr.checkpoints.safetensors import load_model
from dictation.asr.config import AsrConfig
from dictation.asr.decode.greedy import greedy
from dictation.asr.nn import graphs, quant_paths, quant_rows, quant_swap, quantized
from dictation.asr.nn.graphs import DecodeGraph
from dictation.asr.nn.options import DEFAULT_OPTIONS, ModelOptions
from dictation.asr.nn.quantized import Int4Linear, Int8Linear
from dictation.asr.tune import quantize, writers
from dictation.asr.tune.adapters import LoraLinear
from tests.asr.embeds import prompt_embeds
from tests.asr.test_variants import write_adapter
from tests.oracle import synth_audio

MAX_NEW = 24
CLIPS = [(2.5, 1), (4.0, 2), (6.5, 3)]  # (seconds, seed)


FLOAT32 = ModelOptions(cpu_bf16_compute=False)  # quantized layers compute in float32 on any CPU
# The model options fresh() builds with unless told otherwise; fixtures set them for a test
# (static_step: quantized layers in float32).
# The native CPU step of int8 models computes in float32 where torch's int8 layers round to bf16: it is
# checked against torch's step in tests/asr/test_native_step.py, and kept out of these comparisons.
FRESH = {"model_options": replace(DEFAULT_OPTIONS, native_cpu_step=False)}


def fresh(folder, **options) -> AsrEngine:
    options.setdefault("device", "cpu")
    options.setdefault("dtype", "fp32")
    options.setdefault("model_options", FRESH["model_options"])
    engine = AsrEngine(EngineOptions(model=str(folder), **options))
    engine.prepare()
    return engine


def decode(engine: AsrEngine, embeds: torch.Tensor, max_new_tokens: int = MAX_NEW, **kw):
    engine.pipeline.cache_owner = None  # the cache is overwritten
    eos = kw.pop("eos_ids", engine.prompt.special.eos)
    return greedy(engine.model, embeds, max_new_tokens=max_new_tokens, eos_ids=eos, keep_first_logits=True, **kw)


@contextmanager
def plain_path(engine: AsrEngine):
    """Every lever off: separate projections, the plain step, each id read right after its step."""
    model = engine.model
    saved = model.options, dict(generate_mod.READ_EVERY), dict(generate_mod.READ_LAG)
    model.options = replace(model.options, static_step=False, fuse_projections=False)
    generate_mod.READ_EVERY["cpu"], generate_mod.READ_LAG["cpu"] = 1, 0
    try:
        yield
    finally:
        model.options = saved[0]
        for table, before in ((generate_mod.READ_EVERY, saved[1]), (generate_mod.READ_LAG, saved[2])):
            table.clear()
            table.update(before)


def plain_run(engine: AsrEngine, embeds: torch.Tensor, **kw):
    with plain_path(engine):
        assert engine.model.decoder.fused_groups()[0] == 0
        return decode(engine, embeds, **kw)


# How far below the step's best logit (relative to its largest |logit|) an id picked by another way of
# computing the same step may lie in bf16: 8 bf16 rounding steps at the largest logit. A pick that is
# no argmax at all lies far lower (a few percent to tens of percent on the tiny checkpoints).
BF16_PICK_TOLERANCE = 2**-5


def pick_gaps(engine: AsrEngine, embeds: torch.Tensor, ids: list[int]) -> list[float]:
    """Feed ``ids`` after the prompt through the engine's current prefill and plain step (teacher
    forcing) and return, for each, how far its logit lies below the best one at that step, relative to
    that step's largest |logit|: 0 where it is the step's argmax. What shows that two ways of computing
    the same steps in bf16 (static or plain step, fused or not) part only at near ties."""
    model = engine.model
    engine.pipeline.cache_owner = None  # the cache is overwritten
    gaps = []
    with torch.inference_mode():
        logits = model.prefill(embeds, len(ids))
        position = embeds.shape[1]
        for i, tid in enumerate(ids):
            row = logits.float()
            gaps.append(float((row.max() - row[tid]) / row.abs().max()))
            if i + 1 < len(ids):
                logits = model.step(torch.tensor([tid], device=model.device), position)
                position += 1
    return gaps


def assert_same_as_plain(engine: AsrEngine, clips=CLIPS, **kw) -> list[list[int]]:
    """The engine's current levers against the plain path on several prompts; returns the ids."""
    out = []
    for seconds, seed in clips:
        embeds = prompt_embeds(engine, synth_audio(seconds, seed=seed))
        ref = plain_run(engine, embeds, **kw)
        got = decode(engine, embeds, **kw)
        assert got.token_ids == ref.token_ids, (seconds, seed)
        assert got.stopped_on_eos == ref.stopped_on_eos
        scale = float(ref.first_logits.abs().max())
        torch.testing.assert_close(got.first_logits, ref.first_logits, rtol=0, atol=1e-5 * scale)
        out.append(got.token_ids)
    return out


def ids_on_clips(engine: AsrEngine, embeds_from: AsrEngine | None = None) -> list[list[int]]:
    """``engine``'s ids (its current levers) on CLIPS; the prompts from ``embeds_from`` if given."""
    source = embeds_from or engine
    return [decode(engine, prompt_embeds(source, synth_audio(s, seed=r))).token_ids for s, r in CLIPS]


def stop_after(k: int):
    calls = []
    return lambda: calls.append(1) or len(calls) >= k


def groups(model):
    return [g for layer in model.decoder.layers for g in (layer.self_attn, layer.mlp)]


def shares_one_storage(tensors) -> bool:
    """The tensors are consecutive rows of one storage that holds nothing else."""
    storage = tensors[0].untyped_storage()
    offset = 0
    for t in tensors:
        if t.untyped_storage().data_ptr() != storage.data_ptr() or t.storage_offset() != offset:
            return False
        offset += t.numel()
    return offset * tensors[0].element_size() == storage.nbytes()


def owns_its_storage(t: torch.Tensor) -> bool:
    return t.untyped_storage().nbytes() == t.numel() * t.element_size()


def member_tensors(group, name: str) -> list[torch.Tensor]:
    return [getattr(group._modules[m], name) for m in group.GROUP]


# --- fused projections ---------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["fp32", "int8", "int4"])
def test_members_are_views_of_one_fused_weight_and_nothing_is_stored_twice(ckpt_untied, variant):
    engine = fresh(ckpt_untied, variant=variant)
    model = engine.model
    assert model.decoder.fused_groups() == (4, 4)
    names = ["weight"] if variant == "fp32" else list(type(model.decoder.layers[0].mlp.up_proj)._TENSORS)
    for group in groups(model):
        for name in names:
            assert shares_one_storage(member_tensors(group, name)), (group, name)
        fusion = group.fusion
        if variant == "fp32":
            assert fusion.weight.data_ptr() == group._modules[group.GROUP[0]].weight.data_ptr()
        else:
            assert all(getattr(fusion.layer, n).data_ptr() == member_tensors(group, n)[0].data_ptr() for n in names)
    # the checkpoint's names, and the memory of one copy of every weight
    with torch.device("meta"):
        meta = model_mod.AsrModel(model.cfg)
    if variant != "fp32":
        quant_swap.empty_quantized(meta, variant)
    assert set(model.state_dict()) == set(meta.state_dict())
    fused = [g.fusion.weight for g in groups(model) if g.fusion.weight is not None]
    fused += [b for layer in model.decoder.fused_layers() for b in layer.buffers()]
    storages = {}
    for t in [*model.parameters(), *model.buffers(), *fused]:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    non_persistent = sum(
        b.nbytes for m in model.modules() for n, b in m._buffers.items() if n in m._non_persistent_buffers_set
    )
    assert sum(storages.values()) == quantize.weight_bytes(model) + non_persistent


@pytest.mark.parametrize(
    ("ckpt", "variant"),
    [("ckpt_untied", "fp32"), ("ckpt_tied", "fp32"), ("ckpt_stops", "fp32"), ("ckpt_untied", "bf16"),
     ("ckpt_untied", "int8"), ("ckpt_untied", "int4")],
)  # fmt: skip
def test_fused_projections_give_the_plain_ids(request, ckpt, variant):
    engine = fresh(request.getfixturevalue(ckpt), variant=variant, dtype="fp32" if variant != "bf16" else "bf16")
    assert_same_as_plain(engine)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {"a": write_adapter(root / "a", seed=1), "b": write_adapter(root / "b", seed=2, dora=True)}


@pytest.fixture(scope="module")
def prequantized_int8(ckpt_untied, tmp_path_factory):
    return writers.write_quantized_folder(ckpt_untied, tmp_path_factory.mktemp("q") / "int8", "int8")


def test_merged_adapters_change_the_fused_weight_in_place(ckpt_untied, adapters):
    engine = fresh(ckpt_untied)
    model = engine.model
    attn = model.decoder.layers[0].self_attn
    base = assert_same_as_plain(engine)
    fusion, fused = attn.fusion, attn.fusion.weight.clone()
    engine.set_adapters([str(adapters["a"]), str(adapters["b"])])
    assert attn.fusion is fusion and not torch.equal(fusion.weight, fused)  # merged into the same memory
    assert shares_one_storage(member_tensors(attn, "weight"))
    with_adapters = assert_same_as_plain(engine)
    assert with_adapters != base
    engine.set_adapters([])
    assert torch.equal(attn.fusion.weight, fused) and assert_same_as_plain(engine) == base


def test_requantized_adapter_layers_are_fused_again(ckpt_untied, adapters):
    engine = fresh(ckpt_untied, variant="int8", adapters=[str(adapters["a"])])
    model = engine.model
    attn = model.decoder.layers[0].self_attn
    assert model.decoder.fused_groups() == (4, 4)
    with_a = assert_same_as_plain(engine)
    old = weakref.ref(attn.fusion.layer)
    engine.set_adapters([])  # q_proj re-quantized from the kept float weight: a new module
    assert old() is None and model.decoder.fused_groups() == (4, 4)
    assert shares_one_storage(member_tensors(attn, "weight"))
    assert assert_same_as_plain(engine) == ids_on_clips(fresh(ckpt_untied, variant="int8"), engine)
    engine.set_adapters([str(adapters["a"])])
    assert assert_same_as_plain(engine) == with_a


def test_unmerged_adapters_run_member_by_member_and_take_no_graph(prequantized_int8, adapters):
    engine = fresh(prequantized_int8, adapters=[str(adapters["a"]), str(adapters["b"]) + ":0.5"])
    model = engine.model
    attn = model.decoder.layers[0].self_attn
    assert isinstance(attn.q_proj, LoraLinear)
    assert not attn.fusion.fused and model.decoder.layers[0].mlp.fusion.fused  # q/k/v apart, gate/up fused
    assert model.decoder.fused_groups() == (2, 4)
    assert model.step_state()[1]  # CUDA would not capture
    assert_same_as_plain(engine)
    engine.set_adapters([])
    assert model.decoder.fused_groups() == (4, 4) and shares_one_storage(member_tensors(attn, "weight"))
    assert not model.step_state()[1]
    assert assert_same_as_plain(engine) == assert_same_as_plain(fresh(prequantized_int8))


def test_moving_or_casting_the_model_plans_the_fusion_again(ckpt_untied):
    engine = fresh(ckpt_untied)
    model = engine.model
    before = assert_same_as_plain(engine)
    assert model.cache is not None
    model.to("cpu")  # what a GPU failure does, here from the CPU to itself
    assert model.cache is None and model.decoder.layers[0].self_attn.fusion is None
    assert assert_same_as_plain(engine) == before
    model.to(torch.bfloat16)
    assert model.cache is None
    bf16 = fresh(ckpt_untied, dtype="bf16")
    assert assert_same_as_plain(engine) == ids_on_clips(bf16)
    attn = model.decoder.layers[1].self_attn
    assert attn.fusion.weight.dtype == torch.bfloat16 and shares_one_storage(member_tensors(attn, "weight"))


def test_quantizing_a_fused_model_frees_its_float_weights(ckpt_untied):
    model = load_model(
        ckpt_untied, AsrConfig.from_file(ckpt_untied / "config.json"), torch.device("cpu"), torch.float32
    )
    model.sync_weights()
    fused = [weakref.ref(g.fusion.weight) for g in groups(model)]
    quantize.quantize_model(model, "int4")
    assert all(ref() is None for ref in fused)
    assert model.decoder.fused_groups() == (4, 4) and len(model.decoder.fused_layers()) == 4


def test_a_group_that_cannot_fuse_any_more_lets_go_of_the_replaced_rows(ckpt_untied):
    engine = fresh(ckpt_untied, variant="int8")
    model = engine.model
    attn = model.decoder.layers[1].self_attn
    old = weakref.ref(attn.fusion.layer.weight)
    w = torch.randn(attn.q_proj.out_features, attn.q_proj.in_features) * 0.1
    quantize.replace_linear(model, "decoder.layers.1.self_attn.q_proj", "int4", w)  # int4 beside int8: no fusion
    assert_same_as_plain(engine)
    assert not attn.fusion.fused and old() is None
    assert owns_its_storage(attn.k_proj.weight) and owns_its_storage(attn.v_proj.weight)


def test_a_model_folder_can_be_written_from_fused_weights(ckpt_untied, tmp_path):
    import json

    from dictation.asr.checkpoints.locate import checkpoint_name
    from dictation.asr.checkpoints.safetensors import write_model_folder

    model = fresh(ckpt_untied).model
    cfg = model.cfg
    tensors = {checkpoint_name(n, cfg.layout): t for n, t in model.state_dict().items()}
    raw = json.loads((ckpt_untied / "config.json").read_text())
    out = write_model_folder(ckpt_untied, tmp_path / "copy", raw, tensors, {"format": "pt"})
    copy = load_model(out, cfg, torch.device("cpu"), torch.float32)
    for name, value in copy.state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), name


# the real models' fused shapes: (in, [q, k, v]) and (in, [gate, up])
FUSED_SHAPES = {
    "0.6B-qkv": (1024, [2048, 1024, 1024]),
    "0.6B-mlp": (1024, [3072, 3072]),
    "1.7B-qkv": (2048, [2048, 1024, 1024]),
    "1.7B-mlp": (2048, [6144, 6144]),
}


def fused_layers_for(kind: str, in_f: int, outs: list[int], device="cpu"):
    g = torch.Generator().manual_seed(in_f + len(outs))
    weights = [torch.randn(o, in_f, generator=g) / in_f**0.5 for o in outs]
    members = [Int8Linear.from_weight(w) if kind == "int8" else Int4Linear.from_weight(w) for w in weights]
    members = [m.to(device) for m in members]
    separate = [m.dequantize() for m in members]
    return quant_rows.fuse_rows(members), members, torch.cat(separate)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", list(FUSED_SHAPES))
def test_packed_kernels_hold_for_the_fused_shapes(monkeypatch, kind, dtype, shape):
    monkeypatch.setattr(quant_paths, "_KERNEL_OK", {})
    in_f, outs = FUSED_SHAPES[shape]
    fused, members, reference = fused_layers_for(kind, in_f, outs)
    assert torch.equal(fused.dequantize(), reference)
    cpu = torch.device("cpu")
    assert fused._kernel_fits(cpu, dtype) and quantized._kernel_available(kind, cpu, dtype)
    for rows in (1, 5):
        x = torch.randn(rows, in_f, generator=torch.Generator().manual_seed(rows)).to(dtype)
        got = fused._kernel(x, dtype).float()
        expected = x.float() @ reference.T
        bound = quantized._PROBE_TOLERANCE[dtype] * float(expected.abs().max())  # the probe's own check
        assert float((got - expected).abs().max()) <= bound
        apart = torch.cat([m._kernel(x, dtype).float() for m in members], dim=-1)
        torch.testing.assert_close(got, apart, rtol=0, atol=bound)


# --- ids on the device, read every few steps or a few steps late -----------------------------------


def reading(monkeypatch, every: int, lag: int = 0) -> None:
    """The CPU reads the ids ``every`` steps, ``lag`` steps after their step (CUDA's way: lag 1)."""
    monkeypatch.setitem(generate_mod.READ_EVERY, "cpu", every)
    monkeypatch.setitem(generate_mod.READ_LAG, "cpu", lag)


@pytest.mark.parametrize(("every", "lag"), [(2, 0), (3, 0), (8, 0), (1, 1), (1, 2), (3, 2)])
def test_reading_ids_late_or_every_few_steps_gives_the_same_ids_and_stop(
    ckpt_untied, ckpt_stops, monkeypatch, every, lag
):
    for folder in (ckpt_untied, ckpt_stops):
        engine = fresh(folder)
        embeds = prompt_embeds(engine, synth_audio(4.0, seed=6))
        ref = plain_run(engine, embeds, max_new_tokens=30)
        cases = [dict(max_new_tokens=b) for b in (0, 1, 2, 3, 5, 8, 9, 30)]
        if ref.token_ids[3:]:  # an "EOS" inside a check interval
            cases.append(dict(max_new_tokens=30, eos_ids={ref.token_ids[3]}))
            cases.append(dict(max_new_tokens=30, eos_ids={ref.token_ids[0]}))  # the first id
        for case in cases:
            want = plain_run(engine, embeds, **case)
            reading(monkeypatch, every, lag)
            got = decode(engine, embeds, **case)
            reading(monkeypatch, 1, 0)
            assert (got.token_ids, got.stopped_on_eos) == (want.token_ids, want.stopped_on_eos), case


@pytest.mark.parametrize(("every", "lag"), [(1, 0), (8, 0), (1, 1), (2, 3)])
def test_should_stop_keeps_its_meaning(ckpt_stops, monkeypatch, every, lag):
    engine = fresh(ckpt_stops)
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=6))
    ref = plain_run(engine, embeds)
    reading(monkeypatch, every, lag)
    for k in (1, 2, 3, 50):
        got = decode(engine, embeds, should_stop=stop_after(k))
        assert got.token_ids == ref.token_ids[:k] and got.stopped_on_eos == (
            ref.stopped_on_eos and k > len(ref.token_ids)
        )


@pytest.mark.parametrize(("every", "lag", "expected"), [(8, 0, math.ceil(30 / 8)), (1, 0, 30), (1, 1, 29), (4, 1, 8)])
def test_the_host_reads_the_ids_once_per_check_not_per_token(ckpt_untied, monkeypatch, every, lag, expected):
    engine = fresh(ckpt_untied)
    embeds = prompt_embeds(engine, synth_audio(3.0, seed=4))
    reads, items = [], []
    real_read, real_item = generate_mod._Reader.read, torch.Tensor.item
    monkeypatch.setattr(generate_mod._Reader, "read", lambda self, *a: reads.append(a[:2]) or real_read(self, *a))
    reading(monkeypatch, every, lag)
    monkeypatch.setattr(torch.Tensor, "item", lambda self: items.append(1) or real_item(self))
    got = decode(engine, embeds, max_new_tokens=30)
    monkeypatch.setattr(torch.Tensor, "item", real_item)
    assert len(got.token_ids) == 30 and len(reads) == expected and not items
    # Each read starts where the last one ended; all but the last (the budget) trail by ``lag`` steps.
    assert [start for start, _ in reads] == [0] + [stop for _, stop in reads[:-1]] and reads[-1][1] == 30


def test_drafts_still_verify_with_delayed_reads(ckpt_stops, monkeypatch):
    engine = fresh(ckpt_stops)
    embeds = prompt_embeds(engine, synth_audio(6.0, seed=3))
    ref = plain_run(engine, embeds)
    for every, lag in ((4, 0), (1, 1)):
        reading(monkeypatch, every, lag)
        for draft in (ref.token_ids, ref.token_ids[:2], ref.token_ids[:1] + [5, 6, 7], [9] * 5, []):
            got = decode(engine, embeds, draft=draft)
            assert (got.token_ids, got.stopped_on_eos) == (ref.token_ids, ref.stopped_on_eos)


# --- the static-shape step (what the CUDA graph captures), uncaptured ---------------------------------


@pytest.fixture
def static_step(monkeypatch):
    """Decode with the static-shape step. Its attention spans the whole cache under a mask: the same
    maths as the plain step's over the filled part, summed in another order, so the ids are identical
    where logits are exact to float32 rounding; quantized layers then compute in float32 too (in bf16
    the rounding of their inputs magnifies that difference into near-tie flips)."""
    monkeypatch.setitem(FRESH, "model_options", replace(FLOAT32, static_step=True, native_cpu_step=False))


@pytest.mark.parametrize(
    ("ckpt", "variant"),
    [("ckpt_untied", "fp32"), ("ckpt_tied", "fp32"), ("ckpt_stops", "fp32"), ("ckpt_untied", "int8"),
     ("ckpt_untied", "int4")],
)  # fmt: skip
def test_the_static_step_gives_the_plain_ids(request, static_step, ckpt, variant):
    engine = fresh(request.getfixturevalue(ckpt), variant=variant)
    assert_same_as_plain(engine)
    graph = engine.model.decode_graph
    assert isinstance(graph, DecodeGraph) and not graph.captured and graph.cache is engine.model.cache


def test_static_step_logits_and_cache_writes_equal_the_plain_step(ckpt_untied):
    engine = fresh(ckpt_untied)
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=2))
    ref = plain_run(engine, embeds).token_ids[:10]
    p = embeds.shape[1]
    with torch.inference_mode():
        model.prefill(embeds, MAX_NEW)
        plain = [model.step(torch.tensor([t]), p + i) for i, t in enumerate(ref)]
        keys = model.cache.keys[..., p : p + len(ref), :].clone()
        model.prefill(embeds, MAX_NEW)
        static = [model.static_step(torch.tensor([t]), torch.tensor([p + i])) for i, t in enumerate(ref)]
        written = model.cache.keys[..., p : p + len(ref), :]
        assert torch.equal(written[0, ..., 0, :], keys[0, ..., 0, :])  # layer 0's first: the same maths
        torch.testing.assert_close(written, keys, rtol=0, atol=1e-5 * float(keys.abs().max()))
    for got, want in zip(static, plain, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))
        assert got.argmax() == want.argmax()


def test_in_bf16_the_static_steps_picks_are_the_plain_steps_argmaxes_up_to_rounding(ckpt_untied, static_step):
    """In bf16 the static and the plain step round differently (attention over the whole masked cache
    or over the filled part), so their ids may part at a near tie (on an H100 the captured
    step's ids left the plain step's at the second id). What holds: each id the static step picks is,
    fed back through the plain step, that step's argmax up to bf16 rounding."""
    engine = fresh(ckpt_untied, dtype="bf16")
    for seconds, seed in CLIPS:
        embeds = prompt_embeds(engine, synth_audio(seconds, seed=seed))
        ids = decode(engine, embeds).token_ids
        with plain_path(engine):
            gaps = pick_gaps(engine, embeds, ids)
        assert len(gaps) == len(ids) == MAX_NEW and max(gaps) <= BF16_PICK_TOLERANCE, gaps
    # The check tells a near tie from a wrong pick: the ids' neighbours in the vocabulary are no argmaxes.
    neighbours = [(t + 1) % engine.model.cfg.text.vocab_size for t in ids]
    with plain_path(engine):
        assert min(pick_gaps(engine, embeds, neighbours)) > BF16_PICK_TOLERANCE


def test_the_static_step_follows_the_cache_as_it_grows(ckpt_untied, static_step, monkeypatch):
    monkeypatch.setattr(model_mod, "DECODE_RESERVE", 3)
    monkeypatch.setattr(model_mod, "CACHE_ROUND", 4)
    engine = fresh(ckpt_untied)
    model = engine.model
    built = []
    real_init = DecodeGraph.__init__
    monkeypatch.setattr(DecodeGraph, "__init__", lambda self, *a, **k: built.append(1) or real_init(self, *a, **k))
    for seconds, seed in CLIPS[:2]:
        embeds = prompt_embeds(engine, synth_audio(seconds, seed=seed))
        ref = plain_run(engine, embeds, max_new_tokens=30)
        model.release_cache()  # start small again: the plain run grew it
        built.clear()
        got = decode(engine, embeds, max_new_tokens=30)
        assert got.token_ids == ref.token_ids and len(got.token_ids) == 30
        assert len(built) >= 7  # a new step for every growth (3 positions at a time)
        assert model.decode_graph.cache is model.cache and model.cache.max_len < embeds.shape[1] + 30 + 8


def test_the_static_step_is_rebuilt_when_weights_change(ckpt_untied, adapters, static_step):
    engine = fresh(ckpt_untied, variant="int8", adapters=[str(adapters["a"])])
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=2))
    ref = plain_run(engine, embeds).token_ids
    assert decode(engine, embeds).token_ids == ref
    first = model.decode_graph
    assert decode(engine, embeds).token_ids == ref and model.decode_graph is first  # reused
    engine.set_adapters([])  # re-quantized q_proj layers
    got = decode(engine, embeds).token_ids
    assert model.decode_graph is not first and first.cache is None  # the old one was released
    assert got == plain_run(engine, embeds).token_ids != ref
    second = model.decode_graph
    model.to("cpu")
    assert model.decode_graph is None and second.cache is None
    assert decode(engine, embeds).token_ids == got


def test_a_float_model_keeps_its_static_step_through_merged_adapters(ckpt_untied, adapters, static_step):
    engine = fresh(ckpt_untied)
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=2))
    base = decode(engine, embeds).token_ids
    graph = model.decode_graph
    engine.set_adapters([str(adapters["b"])])  # merged in place: same addresses, new values
    got = decode(engine, embeds).token_ids
    assert model.decode_graph is graph
    assert got == plain_run(engine, embeds).token_ids != base


def test_weights_key_sees_module_swaps_and_kernel_layouts(ckpt_untied):
    model = fresh(ckpt_untied, variant="int4").model
    key = model.weights_key()
    assert model.weights_key() == key
    o_proj = model.decoder.layers[0].self_attn.o_proj
    o_proj.clear_cache()
    assert model.weights_key() != key
    key = model.weights_key()
    model.decoder.layers[0].mlp.down_proj = nn.Linear(128, 64, bias=False).requires_grad_(False)
    assert model.weights_key() != key
    assert model.step_state() == (model.weights_key(), False)
    # A quantized layer's version alone (its layouts rebuilt in place) changes the key and re-plans
    # the fused group it belongs to.
    model.sync_weights()
    key = model.weights_key()
    model.decoder.layers[1].self_attn.q_proj.version += 1
    assert model.weights_key() != key
    assert model.sync_weights() and not model.sync_weights()


def test_weights_key_sees_which_code_the_step_runs(ckpt_untied, monkeypatch):
    """A graph captured with the fused kernels (or the GEMV, or the compiled step) must not be
    replayed once they are turned off, nor the reverse: on an H100 the unfused run replayed the fused
    graph and the "captured = uncaptured" tests compared two different paths."""
    from dictation.asr.nn.kernels import fused

    model = fresh(ckpt_untied).model
    keys = {model.weights_key()}
    for name, value in (("kernels", False), ("kernels", True), ("gemv", True)):
        setattr(model.decoder, name, value)
        keys.add(model.weights_key())
    model.compile_step = True
    keys.add(model.weights_key())
    model.compiled_step = False  # its compile failed: the default step runs, so the key is the default's
    assert model.weights_key() in keys
    monkeypatch.setattr(fused, "ATTENTION_SPLITS", 4)
    keys.add(model.weights_key())
    assert len(keys) == 6


def test_a_failed_capture_is_logged_and_the_same_step_runs_uncaptured(ckpt_untied, monkeypatch, caplog):
    engine = fresh(ckpt_untied)
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=2))
    ref = plain_run(engine, embeds).token_ids
    tries = []

    def broken_capture(self, model):
        tries.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(DecodeGraph, "_capture", broken_capture)
    monkeypatch.setattr(generate_mod, "_graph_mode", lambda m: ("capture", m.weights_key()))  # what CUDA asks for
    assert decode(engine, embeds).token_ids == ref
    assert decode(engine, embeds).token_ids == ref
    assert tries == [1] and model.graph_failed
    assert isinstance(model.decode_graph, DecodeGraph) and not model.decode_graph.captured
    assert "capturing the decode step as a CUDA graph failed" in caplog.text


class FakeGraph:
    """Stands in for a captured ``torch.cuda.CUDAGraph`` on the CPU: a replay runs the step eagerly,
    or (``wrong``) with the token off by one, as a capture that recorded a stale input would."""

    def __init__(self, owner: DecodeGraph, model, wrong: bool) -> None:
        self.owner, self.model, self.wrong, self.replays, self.was_reset = owner, model, wrong, 0, False

    def replay(self) -> None:
        self.replays += 1
        if self.wrong:
            self.owner.token.add_(1)
        self.owner._step(self.model)

    def reset(self) -> None:
        self.was_reset = True


def fake_capture(monkeypatch, wrong: bool) -> list[FakeGraph]:
    made = []

    def capture(self, model):  # the real one's contract: the warm-up's logits, then the graph
        self.expected = model.static_step(self.token, self.position)
        self.graph = FakeGraph(self, model, wrong)
        made.append(self.graph)

    monkeypatch.setattr(DecodeGraph, "_capture", capture)
    monkeypatch.setattr(
        generate_mod, "_graph_mode", lambda m: (None, None) if m.graph_failed else ("capture", m.weights_key())
    )
    return made


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_a_graph_whose_first_replay_agrees_with_the_warm_up_is_kept(ckpt_untied, monkeypatch, variant):
    engine = fresh(ckpt_untied, variant=variant, model_options=FLOAT32)  # see the static_step fixture
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=2))
    ref = plain_run(engine, embeds)
    made = fake_capture(monkeypatch, wrong=False)
    assert decode(engine, embeds).token_ids == ref.token_ids
    steps = len(ref.token_ids) - 1 + ref.stopped_on_eos  # the prefill gives the first id
    assert len(made) == 1 and made[0].replays == steps and not made[0].was_reset
    assert engine.model.decode_graph.graph is made[0] and not engine.model.graph_failed


def test_a_graph_whose_first_replay_disagrees_is_dropped_and_the_step_redone(ckpt_untied, monkeypatch, caplog):
    engine = fresh(ckpt_untied)
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=2))
    ref = plain_run(engine, embeds).token_ids
    made = fake_capture(monkeypatch, wrong=True)
    # The wrong replay wrote a wrong id and wrong k/v: both are redone, so every later id is right.
    assert decode(engine, embeds).token_ids == ref
    assert len(made) == 1 and made[0].replays == 1 and made[0].was_reset
    assert model.graph_failed and model.decode_graph.graph is None and not model.decode_graph.captured
    assert "disagreed with the same step run eagerly" in caplog.text
    assert decode(engine, embeds).token_ids == ref and len(made) == 1  # no second capture


class _Model:
    def __init__(self, device: str, failed=False, unmerged=False, compiled=False, **options) -> None:
        self.device, self.unmerged = torch.device(device), unmerged
        self.decode_slot = graphs.DecodeSlot()
        self.decode_slot.failed = failed
        self.compile_step = compiled
        self.options = ModelOptions(**options)

    def step_state(self) -> tuple[tuple, bool]:
        return ("key",), self.unmerged


def test_cuda_always_decodes_with_the_static_step_captured_or_not():
    """So that a graph and its fallbacks are the same kernels: the same ids in bf16 too."""

    def mode(model):
        return generate_mod._graph_mode(model)[0]

    assert generate_mod._graph_mode(_Model("cuda")) == ("capture", ("key",))
    assert mode(_Model("cuda", failed=True)) == "eager"
    assert mode(_Model("cuda", unmerged=True)) == "eager"
    assert generate_mod._graph_mode(_Model("cpu")) == (None, None) and mode(_Model("mps")) is None
    assert mode(_Model("cpu", compiled=True)) == "eager"  # the compiled step is a static step (compiled.py)
    assert mode(_Model("cuda", capture_step=False)) == "eager"
    assert mode(_Model("cpu", static_step=True)) == "eager"
    assert mode(_Model("cpu", unmerged=True, static_step=True)) == "eager"
    assert mode(_Model("cuda", static_step=False)) is None


def test_without_pinned_memory_cuda_reads_each_id_in_place(monkeypatch, caplog):
    """Pinning can fail (no allocator, a sandbox): decoding then reads in place rather than failing."""
    from types import SimpleNamespace

    monkeypatch.setattr(generate_mod, "_PIN_WARNED", False)
    real_empty = torch.empty

    def no_pinning(*args, pin_memory=False, **kwargs):
        if pin_memory:
            raise RuntimeError("pin_memory=True requires a CUDA or other accelerator backend")
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", no_pinning)
    out = SimpleNamespace(device=torch.device("cuda"), shape=(4,), dtype=torch.long)
    for _ in range(2):
        reader = generate_mod._Reader(out)
        assert reader.lag == 0 and reader.every == 1 and reader.host is None
    assert caplog.text.count("no pinned host memory") == 1


class _OnSecondGpu:
    """A CPU tensor that says it lives on cuda:1 (what _Reader reads of its buffer)."""

    def __init__(self, values: torch.Tensor) -> None:
        self.values, self.shape, self.dtype = values, values.shape, values.dtype
        self.device = torch.device("cuda", 1)

    def __getitem__(self, index):
        return self.values[index]


class _FakeCuda:
    """The few torch.cuda calls of the reader and the capture, recorded on the CPU."""

    def __init__(self, monkeypatch, fail_capture: bool = False) -> None:
        self.recorded_on: list = []
        self.streams_set: list = []
        self.fail_capture = fail_capture
        self.current_streams: dict = {}
        cuda = self

        class Event:
            def record(self, stream=None):
                cuda.recorded_on.append(stream)

            def synchronize(self):
                pass

        @contextmanager
        def graph(cuda_graph, stream=None, capture_error_mode="global"):
            yield
            if cuda.fail_capture:  # capture_end raising, as an invalidated capture does
                raise RuntimeError("operation not permitted when stream is capturing")

        @contextmanager
        def nothing(*args, **kwargs):
            yield

        class Stream:
            def __init__(self, device=None):
                self.device = device

            def wait_stream(self, other):
                pass

        real_empty = torch.empty
        monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: real_empty(*a, **k))
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "Stream", Stream)

        def current_stream(device=None):
            return cuda.current_streams.setdefault(device, Stream(device))

        monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "device", nothing)
        monkeypatch.setattr(torch.cuda, "stream", nothing)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
        monkeypatch.setattr(torch.cuda, "set_stream", self.streams_set.append)
        monkeypatch.setattr(graphs, "_CAPTURE_STREAMS", {})


def test_read_events_are_recorded_on_the_stream_of_the_buffers_gpu(monkeypatch):
    """Event.record() with no stream records on the current device's stream: for a model on cuda:1 the
    events would not follow its copies, and the host would read ids before they arrive."""
    fake = _FakeCuda(monkeypatch)
    out = _OnSecondGpu(torch.tensor([5, 6, 7, 8]))
    reader = generate_mod._Reader(out)
    assert reader.host is not None and reader.lag == 1
    for i in range(4):
        reader.queued(i)
    assert fake.recorded_on == [torch.cuda.current_stream(torch.device("cuda", 1))] * 4
    assert fake.recorded_on[0].device == torch.device("cuda", 1)
    ids: list[int] = []
    assert not reader.read(0, 4, ids, eos={99}) and ids == [5, 6, 7, 8]


def test_every_capture_on_a_gpu_uses_that_gpus_one_capture_stream(monkeypatch):
    """A new stream per capture would leave a cuBLAS workspace behind for each."""
    _FakeCuda(monkeypatch)
    first = graphs.capture_stream(torch.device("cuda"))
    assert graphs.capture_stream(torch.device("cuda", 0)) is first
    second = graphs.capture_stream(torch.device("cuda", 1))
    assert second is not first and graphs.capture_stream(torch.device("cuda", 1)) is second


@pytest.mark.parametrize("fails", [False, True])
def test_the_capture_warms_up_the_whole_step_and_a_failure_restores_the_stream(ckpt_untied, monkeypatch, caplog, fails):
    engine = fresh(ckpt_untied)
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=2))
    ref = plain_run(engine, embeds).token_ids
    fake = _FakeCuda(monkeypatch, fail_capture=fails)
    argmaxes, captured = [], []
    real_argmax, real_step = torch.Tensor.argmax, DecodeGraph._step
    monkeypatch.setattr(torch.Tensor, "argmax", lambda t, *a, **k: argmaxes.append(1) or real_argmax(t, *a, **k))

    def step(self, m):  # what the capture records: its inputs must still be the step that is due
        captured.append((len(argmaxes), self.token.tolist(), self.position.tolist()))
        real_step(self, m)

    monkeypatch.setattr(DecodeGraph, "_step", step)
    decode(engine, embeds, max_new_tokens=1)  # fills the cache up to the prompt
    position = embeds.shape[1]
    argmaxes.clear()
    try:
        DecodeGraph(model, torch.tensor([ref[0]]), position, capture=True)
    except RuntimeError:
        assert fails
        assert fake.streams_set == [torch.cuda.current_stream(model.device)]  # back where it was
    else:
        assert not fails and fake.streams_set == []
    # The warm-ups ran the argmax too, on copies of the inputs.
    assert captured == [(graphs.GRAPH_WARMUP, [ref[0]], [position])]
    if fails:  # the same step uncaptured: the plain ids
        monkeypatch.setattr(DecodeGraph, "_step", real_step)
        monkeypatch.setattr(generate_mod, "_graph_mode", lambda m: ("capture", m.weights_key()))
        assert decode(engine, embeds).token_ids == ref and model.graph_failed
        assert "capturing the decode step as a CUDA graph failed" in caplog.text


def cuda_layout_sdpa(monkeypatch) -> None:
    """Attention outputs laid out as CUDA's flash and memory-efficient kernels return them: logically
    ``[b, heads, rows, hd]``, in memory ``[b, rows, heads, hd]`` (not contiguous)."""
    real = F.scaled_dot_product_attention

    def sdpa(*args, **kwargs):
        o = real(*args, **kwargs)
        return o.transpose(1, 2).contiguous().transpose(1, 2)

    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)


@pytest.mark.parametrize("layout", ["contiguous", "cuda"])
def test_masked_attention_with_gqa_folded_into_rows_equals_enable_gqa(ckpt_stops, monkeypatch, layout):
    """What CUDA runs for later prefill chunks, extend and draft checks (ModelOptions.fold_masked_gqa)."""
    import dictation.asr.nn.decoder as decoder_mod

    if layout == "cuda":
        cuda_layout_sdpa(monkeypatch)
        assert not F.scaled_dot_product_attention(*[torch.ones(1, 2, 3, 4)] * 3).is_contiguous()
    engine = fresh(ckpt_stops)
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(6.0, seed=3))
    ref = plain_run(engine, embeds)
    outputs, used = {}, []
    real = decoder_mod.Attention._folded_attention
    monkeypatch.setattr(decoder_mod.Attention, "_folded_attention", lambda self, *a: used.append(1) or real(self, *a))
    for fold in (False, True):
        # every prefill chunk after the first is masked
        model.options = replace(model.options, prefill_chunk=7, fold_masked_gqa=fold)
        used.clear()
        engine.pipeline.cache_owner = None
        logits = model.prefill(embeds, MAX_NEW)
        drafted = decode(engine, embeds, draft=ref.token_ids[:3] + [5, 6, 7])
        checked = model.forward_tokens(torch.tensor(ref.token_ids[:6]), embeds.shape[1])
        assert bool(used) == fold
        outputs[fold] = logits, checked, (drafted.token_ids, drafted.stopped_on_eos)
    for plain, folded in zip(outputs[False][:2], outputs[True][:2], strict=True):
        torch.testing.assert_close(folded, plain, atol=1e-5 * float(plain.abs().max()), rtol=0)
    assert outputs[True][2] == outputs[False][2] == (ref.token_ids, ref.stopped_on_eos)
