"""Float weights held in float16 on the CPU (nn/compact.py): the same results as the float32 model,
for a checkpoint stored in bf16 (the real models' dtype; the other tests' tiny checkpoints are float32
and are never compacted)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from dictation.asr import AsrEngine, EngineOptions
from dictation.asr.checkpoints import safetensors as st_loader
from dictation.asr.checkpoints.safetensors import TensorReader, load_model
from dictation.asr.config import AsrConfig
from dictation.asr.nn import compact
from dictation.asr.nn.compact import HalfLinear, HalfTable
from dictation.asr.nn.options import ModelOptions
from dictation.asr.nn.quantized import QUANT_MODULES
from tests.oracle import synth_audio
from tests.oracle.checkpoints import cached_checkpoint, load_tensors

AUDIO = synth_audio(2.5, seed=41)
CPU = torch.device("cpu")


def bf16_copy(folder, out):
    """``folder`` with every float tensor stored in bf16 (one file)."""
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    tensors = {n: t.bfloat16() if t.is_floating_point() else t for n, t in load_tensors(folder).items()}
    save_file(tensors, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="module", params=["untied", "tied"])
def ckpt_bf16(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16")
    src = cached_checkpoint(root / "src", tie_word_embeddings=request.param == "tied")
    return bf16_copy(src, root / request.param)


def engine(folder, **options):
    e = AsrEngine(EngineOptions(model=str(folder), device="cpu", dtype="fp32", **options))
    e.prepare()
    return e


def load(folder, *, compact_it):
    return load_model(folder, AsrConfig.from_file(folder / "config.json"), CPU, torch.float32, compact=compact_it)


def run(e):
    result = e.pipeline.run(AUDIO, None, "", 12, keep_first_logits=True)
    return result.first_logits, result.ids


# --- the modules -----------------------------------------------------------------------------------------


def test_a_half_linear_computes_the_float32_layer_of_its_weight():
    gen = torch.Generator().manual_seed(0)
    linear = nn.Linear(96, 40).requires_grad_(False)
    linear.weight.copy_(torch.randn(40, 96, generator=gen).bfloat16().float() / 8)
    x = torch.randn(3, 7, 96, generator=gen)
    half = HalfLinear(linear)
    torch.testing.assert_close(half(x), linear(x), rtol=1e-5, atol=1e-5)
    state = half.state_dict()
    assert torch.equal(state["weight"], linear.weight) and torch.equal(state["bias"], linear.bias)
    back = half.to_linear()
    assert torch.equal(back.weight, linear.weight) and torch.equal(back(x), linear(x))


def test_a_half_table_looks_up_exact_rows_and_gives_the_float32_heads_argmax_on_near_ties():
    gen = torch.Generator().manual_seed(1)
    table = (torch.randn(5000, 64, generator=gen) / 8).bfloat16().float()
    h = torch.randn(6, 64, generator=gen) * 3
    # Rows 10 and 11 give logits 2**-20 apart for every h: float16 alone cannot order them.
    table[11] = table[10]
    table[10, 0] += 2.0**-12
    h[:, 0] = h[:, 0].abs() + 1
    h @= torch.eye(64)
    half = HalfTable(table)
    assert torch.equal(half(torch.tensor([3, 10, 4999])), table[[3, 10, 4999]])
    exact = h @ table.T
    got = half.project(h)
    assert torch.equal(got.argmax(-1), exact.argmax(-1))
    bound = HalfTable.error_bound(h, half.row_norm, got)
    assert ((got - exact).abs() <= bound[:, None]).all()
    # h pointing at row 10: rows 10 and 11 are the top two, 2**-12 * h[0] apart, and 10 wins
    favour = table[10:11] * 50
    assert int(half.project(favour).argmax()) == int((favour @ table.T).argmax()) == 10


def test_a_half_table_computes_in_float32_where_float16_cannot_bound_the_error():
    gen = torch.Generator().manual_seed(3)
    table = (torch.randn(3000, 32, generator=gen) / 8).bfloat16().float()
    half = HalfTable(table)
    flat = torch.zeros(1, 32)  # every logit ties: too many candidates to re-score one by one
    huge = torch.randn(1, 32, generator=gen) * 1e5  # past float16's range
    for h in (flat, huge):
        torch.testing.assert_close(half.project(h), h @ table.T, rtol=1e-6, atol=1e-6)


def test_float16_holds_bf16_values_and_refuses_float32_ones():
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(64, 64, generator=gen)
    assert not compact.holds_in_half(w)
    assert compact.holds_in_half(w.bfloat16().float())
    past_range = w.bfloat16().float()
    past_range[3, 5] = 70144.0  # a bf16 value past float16's largest, 65504
    assert not compact.holds_in_half(past_range)


# --- loading ---------------------------------------------------------------------------------------------


def test_a_bf16_checkpoint_computed_in_float32_holds_its_encoder_and_table_in_float16(ckpt_bf16):
    model = load(ckpt_bf16, compact_it=True)
    encoder_linears = [m for n, m in model.audio_tower.named_modules() if n and isinstance(m, HalfLinear | nn.Linear)]
    assert encoder_linears and all(isinstance(m, HalfLinear) for m in encoder_linears)
    assert isinstance(model.decoder.embed_tokens, HalfTable)
    assert model.lm_head is None or isinstance(model.lm_head, HalfTable)
    assert model.dtype == torch.float32
    plain = load(ckpt_bf16, compact_it=False)
    assert not compact.is_compact(plain)
    for (name, a), (_, b) in zip(model.state_dict().items(), plain.state_dict().items(), strict=True):
        # equal, but for values under float16's normal range (2**-14), rounded by at most 2**-25
        torch.testing.assert_close(a.float(), b, rtol=0, atol=compact.SUBNORMAL_ERROR, msg=name)
        assert torch.equal(a.float()[b.abs() >= 2.0**-14], b[b.abs() >= 2.0**-14]), name


def test_a_float32_checkpoint_is_never_compacted(ckpt_untied):
    assert not compact.is_compact(load(ckpt_untied, compact_it=True))


@pytest.mark.parametrize("variant", ["", "int8"])
def test_the_compact_engine_transcribes_as_the_float32_one(ckpt_bf16, variant):
    """The float16-held encoder and table give the float32 model's transcript and, within the float16
    head's bound, its logits. The integer layers compute in float32 here: on a CPU with bf16
    instructions they would round their activations to bf16, which turns the encoder's float16-held
    differences (a few 1e-6) into a rounding step now and then, beyond this test's bounds."""
    float32 = ModelOptions(cpu_bf16_compute=False)
    e = engine(ckpt_bf16, variant=variant, model_options=float32)
    assert compact.is_compact(e.model)
    assert (variant == "int8") == any(isinstance(m, QUANT_MODULES) for m in e.model.modules())
    model = load(ckpt_bf16, compact_it=False)
    if variant:
        from dictation.asr.tune.quantize import quantize_model

        quantize_model(model, variant)
    model.options = float32
    twin = engine(ckpt_bf16, variant=variant, model_options=float32)
    twin._model = model
    twin._renew_pipeline()
    logits, ids = run(e)
    want_logits, want_ids = run(twin)
    assert ids == want_ids
    # the largest logit as computed in float32; the others within the float16 head's bound
    top = int(want_logits.argmax())
    assert int(logits.argmax()) == top and abs(float(logits[top] - want_logits[top])) < 1e-4
    assert float((logits - want_logits).abs().max()) < 2.0**-9 * float(want_logits.abs().max()) + 1e-4
    assert e.weight_bytes < twin.weight_bytes


def test_adapters_on_a_compact_engine_expand_it_first(ckpt_bf16, tmp_path):
    from tests.asr.test_variants import write_adapter

    adapter = write_adapter(tmp_path / "a", seed=1)
    e = engine(ckpt_bf16)
    assert compact.is_compact(e.model)
    e.set_adapters([str(adapter)])
    assert not compact.is_compact(e.model)
    fresh = engine(ckpt_bf16, adapters=[str(adapter)])
    assert not compact.is_compact(fresh.model)
    logits, ids = run(e)
    want_logits, want_ids = run(fresh)
    assert ids == want_ids  # weights equal but for values under 2**-14 (rounded by at most 2**-25)
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)


def test_without_fbgemm_the_encoder_stays_float32(ckpt_bf16, monkeypatch):
    monkeypatch.setattr(compact, "fbgemm_half_usable", lambda: False)
    model = load(ckpt_bf16, compact_it=True)
    assert not any(isinstance(m, HalfLinear) for m in model.modules())
    assert isinstance(model.decoder.embed_tokens, HalfTable)


def test_the_probe_finds_the_float16_product_within_its_bound():
    assert compact.half_matmul_usable() and compact.fbgemm_half_usable()
    x = torch.randn(2, 96)
    assert F.linear(x, torch.zeros(3, 96)).shape == (2, 3)


def test_the_table_is_read_in_pieces_straight_into_float16(ckpt_bf16, monkeypatch):
    """The loader's peak: the table goes from the file's bf16 to float16 a piece of rows at a time, so
    neither a float32 copy nor the whole stored bf16 copy ever exists beside it."""
    given, whole = [], []
    init = HalfTable.__init__
    get_tensor = TensorReader.get_tensor

    def spy(self, table, *args, **kwargs):
        given.append((table.dtype, kwargs.get("max_abs")))
        init(self, table, *args, **kwargs)

    def spy_get(self, name):
        whole.append(name)
        return get_tensor(self, name)

    monkeypatch.setattr(HalfTable, "__init__", spy)
    monkeypatch.setattr(TensorReader, "get_tensor", spy_get)
    model = load(ckpt_bf16, compact_it=True)
    tables = 1 if model.lm_head is None else 2
    assert len(given) == tables and all(dtype == torch.float16 and m is not None for dtype, m in given)
    assert not [n for n in whole if n.endswith(("embed_tokens.weight", "lm_head.weight"))], whole
    stored = load_tensors(ckpt_bf16)
    table = next(t for n, t in stored.items() if n.endswith("embed_tokens.weight"))
    assert torch.equal(model.decoder.embed_tokens.weight, table.half())


def test_reading_a_table_in_pieces_gives_its_float16_values_its_range_and_nan(tmp_path):
    gen = torch.Generator().manual_seed(3)
    table = (torch.randn(37, 24, generator=gen) * 3).bfloat16()
    bad = table.clone()
    bad[30, 5] = float("nan")
    huge = table.clone()
    huge[2, 1] = 1e6
    save_file({"t": table, "bad": bad, "huge": huge, "vec": table[0].clone()}, str(tmp_path / "x.safetensors"))
    with TensorReader(tmp_path / "x.safetensors") as f:
        half, finite, largest = f.read_as_half("t", piece_bytes=5 * 24 * 2)  # 5 rows a piece, 8 pieces
        assert half.dtype == torch.float16 and torch.equal(half, table.half())
        assert bool(finite) and largest == float(table.float().abs().max())
        _, finite, _ = f.read_as_half("bad", piece_bytes=5 * 24 * 2)
        assert not bool(finite)
        assert f.read_as_half("huge") is None  # beyond float16: read as stored instead
        assert f.read_as_half("vec") is None  # not a table
        assert torch.equal(f.get_tensor("t"), table)  # the file is still readable after a piece read


def test_compacting_at_load_hands_each_freed_float32_copy_back(ckpt_bf16, monkeypatch):
    calls = []
    monkeypatch.setattr(st_loader, "release_freed_memory", lambda: calls.append(1))
    model = load(ckpt_bf16, compact_it=True)
    compacted = sum(isinstance(m, HalfLinear | HalfTable) for m in model.modules())
    assert compacted and len(calls) == compacted


@pytest.mark.parametrize("changed", [False, True])
def test_a_tied_models_stored_head_is_compared_with_the_table(tmp_path, caplog, changed):
    src = cached_checkpoint(tmp_path / "src", tie_word_embeddings=True)
    folder = bf16_copy(src, tmp_path / "tied")
    tensors = load_tensors(folder)
    tensors["thinker.lm_head.weight"] = tensors["thinker.model.embed_tokens.weight"].clone()
    if changed:
        tensors["thinker.lm_head.weight"][-1, -1] += 1.0
    save_file(tensors, str(folder / "model.safetensors"))
    with caplog.at_level("INFO", logger=st_loader.__name__):
        load(folder, compact_it=True)
    said = [r.getMessage() for r in caplog.records if "tie_word_embeddings" in r.getMessage()]
    assert said and said[-1].endswith("differs from it" if changed else "equals it")
