"""The native CPU decode step of an int8 decoder (dictation/asr/nn/native_step.py): built with the
machine's C compiler, it must compute what torch's plain step computes, share torch's threads, and
step aside wherever it does not apply."""

from __future__ import annotations

import ctypes
import os
from dataclasses import replace

import pytest
import torch

from dictation.asr import AsrEngine, EngineOptions
from dictation.asr.heap import Arena
from dictation.asr.nn import native_step
from dictation.asr.nn.options import DEFAULT_OPTIONS, ModelOptions
from dictation.asr.nn.quantized import Int8Linear
from dictation.asr.tune import writers
from dictation.asr.tune.quantize import quantize_model
from tests.asr.test_quant import FLOAT32, load
from tests.oracle.checkpoints import cached_checkpoint

TORCH_STEP = replace(FLOAT32, native_cpu_step=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return cached_checkpoint(tmp_path_factory.getbasetemp() / "ckpt")


@pytest.fixture(scope="module")
def lib():
    built = native_step.library()
    assert built is not None, f"the native step must build where the tests run: {native_step.unavailable()}"
    return built


def int8_model(folder, dtype=torch.float32, options: ModelOptions = FLOAT32):
    model = load(folder, dtype, options)
    quantize_model(model, "int8")
    return model.eval()


def teacher_forced(model, embeds, tokens, start) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of each step fed ``tokens`` from ``start`` after prefilling ``embeds``, and the cache."""
    model.release_cache()
    rows = [model.prefill(embeds, len(tokens) + 4)]
    for i, token in enumerate(tokens):
        rows.append(model.step(torch.tensor([token]), start + i))
    cache = model.cache
    stop = start + len(tokens)
    return torch.stack(rows).float(), torch.stack([cache.keys[..., :stop, :], cache.values[..., :stop, :]]).float()


@pytest.mark.parametrize(("n", "k"), [(64, 64), (4096, 64), (6, 130), (1, 7), (13, 1024)])
def test_the_int8_product_is_dequantize_then_matmul(lib, n, k):
    g = torch.Generator().manual_seed(n * 1000 + k)
    weight = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    scale = torch.rand(n, generator=g) / 100
    x = torch.randn(k, generator=g)
    expected = (weight.double() * scale.double()[:, None]) @ x.double()
    got = native_step.int8_gemv(weight, scale, x)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


def test_the_library_runs_on_torchs_threads(lib):
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert lib.omp_threads() == threads
    finally:
        torch.set_num_threads(before)


def test_float32_steps_equal_torchs_plain_step(folder, lib):
    """Same int8 weights, float32 everywhere: every step's logits and every cache entry agree with
    torch's step to float32 rounding, so greedy decoding picks the same ids."""
    model = int8_model(folder)
    embeds = torch.randn(1, 12, model.cfg.text.hidden_size, generator=torch.Generator().manual_seed(1))
    tokens = [5, 900, 77, 1234, 8, 42, 4000, 3]
    native, native_cache = teacher_forced(model, embeds, tokens, 12)
    assert isinstance(model._native, native_step.NativeStep)  # the steps above ran natively
    model.options = TORCH_STEP
    plain, plain_cache = teacher_forced(model, embeds, tokens, 12)
    assert model._native is None
    scale = float(plain.abs().max())
    torch.testing.assert_close(native, plain, rtol=0, atol=2e-5 * scale)
    torch.testing.assert_close(native_cache, plain_cache, rtol=0, atol=2e-5 * float(plain_cache.abs().max()))
    assert torch.equal(native.argmax(-1), plain.argmax(-1))


def test_bf16_steps_are_as_close_to_float32_as_torchs_bf16_step(folder, lib):
    """A bf16 model: the native step keeps the residual stream and its sums in float32 and stores k/v
    in the bf16 cache. Fed the same tokens, its logits and the k/v its steps wrote are as close to a
    float32 model with the same int8 weights as torch's bf16 step is (on this tiny random model the
    bf16 prompt in the cache and the bf16 head dominate both errors; a wrong conversion of the cache
    or a wrong layer would be far off)."""
    bf16 = int8_model(folder, torch.bfloat16, DEFAULT_OPTIONS)
    f32 = int8_model(folder, torch.float32, FLOAT32)
    f32.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in bf16.state_dict().items()})
    f32.sync_weights()
    embeds = torch.randn(1, 12, bf16.cfg.text.hidden_size, generator=torch.Generator().manual_seed(2))
    tokens = [5, 900, 77, 1234, 8, 42]
    native = teacher_forced(bf16, embeds.bfloat16(), tokens, 12)
    assert isinstance(bf16._native, native_step.NativeStep) and bf16.cache.keys.dtype == torch.bfloat16
    reference = teacher_forced(f32, embeds.bfloat16().float(), tokens, 12)
    bf16.options = replace(bf16.options, native_cpu_step=False)
    plain = teacher_forced(bf16, embeds.bfloat16(), tokens, 12)
    steps = slice(12, 18)  # the positions the steps wrote
    for part, pick in (("logits", lambda t: t[0][1:]), ("k/v", lambda t: t[1][..., steps, :])):
        native_error = (pick(native) - pick(reference)).abs()
        plain_error = (pick(plain) - pick(reference)).abs()
        assert native_error.max() <= 1.5 * plain_error.max(), part
        assert native_error.mean() <= 1.2 * plain_error.mean(), part
        assert plain_error.max() < 0.15 * pick(reference).abs().max(), part


def test_a_grown_cache_gets_new_pointers(folder, lib):
    """Decoding past the cache's end grows it (a new buffer): the step follows the new cache."""
    model = int8_model(folder)
    embeds = torch.randn(1, 4, model.cfg.text.hidden_size, generator=torch.Generator().manual_seed(3))
    model.release_cache()
    model.prefill(embeds, 1)
    end = model.cache.max_len
    tokens = torch.randint(0, 1000, (3,), generator=torch.Generator().manual_seed(4)).tolist()
    for i in range(4, end):  # fill the cache with the same token, up to its end
        model.step(torch.tensor([tokens[0]]), i)
    before = model._native
    grown = [model.step(torch.tensor([t]), end + i) for i, t in enumerate(tokens)]
    assert model.cache.max_len > end and model._native is not before
    keys = model.cache.keys[..., : end + len(tokens), :].clone()
    model.options = TORCH_STEP
    model.release_cache()
    model.prefill(embeds, 1)
    for i in range(4, end):
        model.step(torch.tensor([tokens[0]]), i)
    plain = [model.step(torch.tensor([t]), end + i) for i, t in enumerate(tokens)]
    torch.testing.assert_close(
        torch.stack(grown), torch.stack(plain), rtol=0, atol=2e-5 * float(torch.stack(plain).abs().max())
    )
    plain_keys = model.cache.keys[..., : end + len(tokens), :]
    torch.testing.assert_close(keys, plain_keys, rtol=0, atol=2e-5 * float(plain_keys.abs().max()))


def test_models_it_does_not_fit_take_torchs_step(folder, lib):
    float_model = load(folder, torch.float32, FLOAT32).eval()
    int4 = load(folder, torch.float32, FLOAT32).eval()
    quantize_model(int4, "int4")
    unfused = int8_model(folder, options=replace(FLOAT32, fuse_projections=False))
    switched_off = int8_model(folder, options=TORCH_STEP)
    embeds = torch.randn(1, 4, float_model.cfg.text.hidden_size)
    for model in (float_model, int4, unfused, switched_off):
        model.prefill(embeds, 2)
        model.step(torch.tensor([3]), 4)
        assert model.native_step() is None
    assert not native_step.eligible(float_model) and not native_step.eligible(int4)
    assert not native_step.eligible(unfused) and native_step.eligible(switched_off)


def test_without_a_compiler_the_torch_step_runs(folder, monkeypatch, caplog):
    monkeypatch.setattr(native_step, "_library", None)
    monkeypatch.setattr(native_step, "_failed", None)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    model = int8_model(folder)
    model.prefill(torch.randn(1, 4, model.cfg.text.hidden_size), 2)
    with caplog.at_level("INFO", logger=native_step.__name__):
        logits = model.step(torch.tensor([3]), 4)
    assert logits.shape == (model.cfg.text.vocab_size,) and model._native is False
    assert "/nonexistent/cc" in native_step.unavailable()
    assert "the torch step runs instead" in caplog.text


def test_the_library_is_cached_per_source_compiler_and_cpu(tmp_path, monkeypatch):
    """Built once into the user's cache folder (0700, the file 0600), named by what it was built from."""
    cc = native_step.compiler()
    path = native_step.library_path(cc)
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert path.parent.parent.stat().st_mode & 0o777 == 0o700  # ~/.cache/dictation, made here first
    native_step.build(cc, path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert native_step.library_path(cc) == path
    monkeypatch.setattr(native_step, "_cpu_key", lambda: "another CPU")
    assert native_step.library_path(cc) != path
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C")
    monkeypatch.setattr(native_step, "SOURCE", broken)
    with pytest.raises(RuntimeError, match="broken.c"):
        native_step.build(cc, tmp_path / "out.so")
    assert not list(tmp_path.glob("*.so"))


# --- where the integer weights live: one fresh mapping (heap.Arena) ----------------------------------------


def test_arena_tensors_have_storages_of_their_own_back_to_back():
    arena = Arena(Arena.bytes_for((3, 5), torch.int8) + Arena.bytes_for((4,), torch.float32))
    a = arena.take((3, 5), torch.int8)
    b = arena.take((4,), torch.float32)
    assert a.untyped_storage().nbytes() == 15 and b.untyped_storage().nbytes() == 16  # no padding in them
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert b.data_ptr() - a.data_ptr() == Arena.ALIGN and a.data_ptr() % 4096 == 0
    a.fill_(7)
    b.fill_(1.5)
    assert int(a.sum()) == 105 and float(b.sum()) == 6.0
    with pytest.raises(ValueError, match="bytes left"):
        arena.take((1,), torch.int8)


def _anon_huge_kb(address: int) -> int:
    """AnonHugePages of the mapping of this process that holds ``address``."""
    inside = False
    with open("/proc/self/smaps", encoding="ascii") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(x, 16) for x in head.split("-"))
                inside = low <= address < high
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    raise AssertionError("no mapping holds the address")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
def test_an_arena_collapses_into_huge_pages_with_its_bytes_kept():
    """What the warm-up does to the int8 weights: every byte stays, and where the kernel says it
    collapsed (Linux 6.1+, huge pages not switched off, a free huge page to be had) the mapping holds
    huge pages. A refusal is no error: the weights then stay in small pages."""
    arena = Arena(8 << 20)  # holds at least one whole aligned 2 MiB page
    t = arena.take((8 << 20,), torch.int8)
    t.copy_(torch.randint(-128, 128, t.shape, dtype=torch.int8, generator=torch.Generator().manual_seed(5)))
    before = t.clone()
    collapsed = arena.collapse()
    assert torch.equal(t, before)
    if collapsed:
        assert _anon_huge_kb(t.data_ptr()) >= 2048


def test_a_prepared_int8_folder_loads_its_integer_weights_into_one_mapping(folder, tmp_path, monkeypatch):
    """Every int8 tensor of the decoder in the decoder's arena, the fused q/k/v and gate/up adopting their
    members' rows as loaded (no copy); the warm-up collapses it and the head's."""
    out = writers.write_quantized_folder(folder, tmp_path / "int8", "int8")
    engine = AsrEngine(EngineOptions(model=str(out), device="cpu", model_options=ModelOptions(cpu_bf16_compute=True)))
    engine.prepare()
    model = engine.model
    arena = model.decoder.arena
    mapping = arena._map
    base = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    layers = [m for m in model.decoder.modules() if isinstance(m, Int8Linear)]
    assert layers and all(base <= m.weight.data_ptr() < base + len(mapping) for m in layers)
    for layer in model.decoder.layers:
        attn = layer.self_attn
        assert attn.fusion.layer.weight.data_ptr() == attn.q_proj.weight.data_ptr()  # adopted, not copied
        assert (
            attn.v_proj.weight.data_ptr()
            == attn.q_proj.weight.data_ptr()
            + (attn.q_proj.out_features + attn.k_proj.out_features) * attn.q_proj.in_features
        )
    collapsed = []
    monkeypatch.setattr(Arena, "collapse", lambda self: collapsed.append(self) or True)
    engine.warm_up()
    head = model.decoder.embed_tokens if model.lm_head is None else model.lm_head
    assert arena in collapsed and head.arena in collapsed


@pytest.mark.parametrize("extra", [("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2")], ids=["avx2", "plain-c"])
def test_the_loops_for_cpus_without_avx512_compute_the_same(folder, lib, tmp_path, extra):
    """The source has three forms of its inner loop, chosen by what the compiler may use: AVX-512, AVX2
    with FMA, plain C. Built for the two this machine would not pick, each computes what the default
    build computes: the int8 product with ragged tails, and whole steps of a model."""
    other = tmp_path / "other.so"
    native_step.build(native_step.compiler(), other, extra)
    variant = native_step.load(other)
    g = torch.Generator().manual_seed(9)
    for n, k in ((13, 1000), (64, 64), (4096, 70)):
        weight = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
        scale, x = torch.rand(n, generator=g), torch.randn(k, generator=g)
        want = native_step.int8_gemv(weight, scale, x)
        torch.testing.assert_close(native_step.int8_gemv(weight, scale, x, lib=variant), want, rtol=1e-5, atol=1e-4)
    model = int8_model(folder)
    embeds = torch.randn(1, 6, model.cfg.text.hidden_size, generator=g)
    default, _ = teacher_forced(model, embeds, [5, 900, 77], 6)
    model.release_cache()
    model.prefill(embeds, 4)
    native = native_step.NativeStep(model, variant)
    model._native = native  # the step of this pass: the other build
    rows = [model.step(torch.tensor([t]), 6 + i) for i, t in enumerate([5, 900, 77])]
    assert model._native is native
    torch.testing.assert_close(torch.stack(rows).float(), default[1:], rtol=0, atol=2e-5 * float(default.abs().max()))
