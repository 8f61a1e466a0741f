"""The fused decoder kernels (dictation/asr/nn/kernels/triton_fused.py, fused.py) without a GPU.

- In Triton's interpreter (a child process with ``TRITON_INTERPRET=1``, as test_triton_gemv.py runs
  it): each kernel against the torch code it replaces, in fp32, fp16 and bf16, on odd sizes and
  strided inputs; then the tiny model decoding with them, which must give the plain step's ids in
  float32, and one decode step dispatching at most 8 kernels per layer.
- Compiled ahead of time for sm_80/89/90 by Triton's own compiler (no GPU needed).
- In this process, with the torch references standing in for the kernels behind the same operators
  (fast): the fused layer code (residual carried as (h, delta), the decode attention by device
  position, the prefill's rope + cache write) through int8/int4, adapters, cache growth and drafts;
  and where the kernels cannot run (no Triton, a CPU without the interpreter, wrong answers) the
  torch path with one log line.

On a GPU: test_fused_cuda.py.
"""

from __future__ import annotations

import logging
import re
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import dictation.asr.nn.model as model_mod
from dictation.asr.nn import quantized
from dictation.asr.nn.kernels import fused, triton_fused
from dictation.asr.tune import writers
from dictation.asr.tune.adapters import LoraLinear
from dictation.bench import kernel_count
from tests.asr.interpreter import run_interpreted
from tests.asr.test_fast_paths import CLIPS, FLOAT32, FRESH, decode, fresh, plain_run, prompt_embeds
from tests.asr.test_variants import write_adapter
from tests.oracle import synth_audio

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    import torch.nn.functional as F
    from dictation.asr.nn.kernels import fused
    from dictation.asr.nn.kernels import triton_fused
    from dictation.asr.nn.kernels.fused import OPS, REFERENCES

    DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    gen = torch.Generator().manual_seed(11)
    report = {"ops": [], "probe": {}}

    def rand(*shape, dtype, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    def check(name, dtype_name, got, want):
        exact = got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)
        err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
        same_shape = list(got.shape) == list(want.shape)
        report["ops"].append([name, dtype_name, same_shape, got.dtype == want.dtype, exact, err])

    for dname, dtype in DTYPES.items():
        for rows, n in ((1, 64), (5, 96), (3, 100)):  # non-powers of two, several rows per program
            x, delta = rand(rows, 2 * n, dtype=dtype)[:, ::2].contiguous(), rand(rows, n, dtype=dtype)
            strided = rand(rows, 3 * n, dtype=dtype)[:, n : 2 * n]  # a split view: row stride 3n
            w = rand(n, dtype=dtype, scale=0.1) + 1
            for d in (None, delta, strided):
                got, want = OPS.rms_norm(x, d, w, 1e-6), REFERENCES["rms_norm"](x, d, w, 1e-6)
                check(f"rms_norm {rows}x{n} residual", dname, got[0], want[0])
                check(f"rms_norm {rows}x{n}", dname, got[1], want[1])
            gate, up = rand(rows, 2 * n, dtype=dtype).split(n, dim=-1)
            check(f"silu_mul {rows}x{n}", dname, OPS.silu_mul(gate, up), REFERENCES["silu_mul"](gate, up))
        for heads, kv, hd in ((4, 2, 64), (6, 2, 128), (3, 3, 32)):  # GQA 2, a group of 3, no GQA
            max_len, eps = 80, 1e-6
            angles = torch.rand(max_len, hd, generator=gen) * 6
            cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
            qw, kw = rand(hd, dtype=dtype, scale=0.1) + 1, rand(hd, dtype=dtype, scale=0.1) + 1
            keys, values = rand(1, kv, max_len, hd, dtype=dtype), rand(1, kv, max_len, hd, dtype=dtype)
            for s, start in ((1, 0), (7, 13)):
                q, k, v = rand(1, s, (heads + 2 * kv) * hd, dtype=dtype).split([heads * hd, kv * hd, kv * hd], -1)
                kc, vc, kr, vr = keys.clone(), values.clone(), keys.clone(), values.clone()
                rows_cos, rows_sin = cos[start : start + s], sin[start : start + s]
                got = OPS.rope_qk_cache(q, k, v, qw, kw, rows_cos, rows_sin, kc, vc, start, eps)
                want = REFERENCES["rope_qk_cache"](q, k, v, qw, kw, rows_cos, rows_sin, kr, vr, start, eps)
                tag = f"rope_qk_cache {heads}/{kv}x{hd} {s} rows at {start}"
                check(tag, dname, got, want)
                check(tag + " k cache", dname, kc, kr)
                check(tag + " v cache", dname, vc, vr)
            q, k, v = rand(1, 1, (heads + 2 * kv) * hd, dtype=dtype).split([heads * hd, kv * hd, kv * hd], -1)
            for position in (0, 64, 79):  # block edges (64 positions per block for hd 128, group 2)
                for splits in (1, 3):
                    kc, vc, kr, vr = keys.clone(), values.clone(), keys.clone(), values.clone()
                    pos = torch.tensor([position])
                    got = OPS.decode_attention(q, k, v, qw, kw, cos, sin, kc, vc, pos, eps, splits)
                    want = REFERENCES["decode_attention"](q, k, v, qw, kw, cos, sin, kr, vr, pos, eps)
                    tag = f"decode_attention {heads}/{kv}x{hd} at {position}, {splits} splits"
                    check(tag, dname, got, want)
                    check(tag + " k cache", dname, kc, kr)
                    check(tag + " v cache", dname, vc, vr)
        for k, n, how in ((64, 100, "norm"), (96, 40, "residual"), (80, 70, "silu"), (700, 24, "norm")):
            x = rand(1, 1, 2 * k if how == "silu" else k, dtype=dtype)
            w = rand(n, k, dtype=dtype, scale=0.1)
            nw = rand(k, dtype=dtype, scale=0.1) + 1 if how == "norm" else None
            res = rand(1, 1, n, dtype=dtype) if how != "norm" else None
            args = (x, w, nw, res, 1e-6, how == "silu")
            check(f"gemv {how} {k}->{n}", dname, OPS.gemv(*args), REFERENCES["gemv"](*args))
            if dname == "fp32":  # the GPU's other block sizes (a block changes the tiling, not the roundings)
                for block in triton_fused.GEMV_CONFIGS[1:]:
                    got = triton_fused.gemv(*args, block=block)
                    check(f"gemv {how} {k}->{n} block {block}", dname, got, REFERENCES["gemv"](*args))

    # The probes and the decoding below run the GEMV at 64 outputs a program: the interpreter runs a
    # launch's programs one by one, and the tiny model's q/k/v projection (4096 outputs) is 512 of them
    # at the first of GEMV_CONFIGS (five times the CPU time). The kernel's code is the same at every
    # block; each of GEMV_CONFIGS is checked above, with each prologue and the residual.
    triton_fused.GEMV_CONFIGS = ((64, 128, 4), *triton_fused.GEMV_CONFIGS)
    # fp16 here, fp32: the decoder's own probes below (bf16: see test_the_probe_accepts_the_kernels)
    dims = fused.Dims(hidden=64, intermediate=128, heads=16, kv_heads=8, head_dim=128)  # the tiny model's
    cpu = torch.device("cpu")
    report["probe"]["fp16"] = [fused.probe(cpu, torch.float16, dims), fused.probe(cpu, torch.float16, dims, gemv=True)]

    # The tiny model decoding with the kernels (fp32: the plain step's ids exactly).
    from dictation.bench import kernel_count
    from dataclasses import replace
    from dictation.asr.tune import writers
    from tests.asr.test_fast_paths import FLOAT32, fresh, prompt_embeds, decode, plain_run
    from tests.oracle import synth_audio

    report["e2e"] = {}
    for variant in ("fp32",):  # int8/int4 and adapters: below, with the torch references standing in
        engine = fresh(sys.argv[1], variant=variant, model_options=FLOAT32)
        model = engine.model
        embeds = prompt_embeds(engine, synth_audio(2.5, seed=1))
        model.decoder.kernels = False
        ref = plain_run(engine, embeds, max_new_tokens=6)
        model.decoder.kernels = True
        # the static step; later prefill chunks: the fused rope at start > 0, masked attention
        model.options = replace(model.options, static_step=True, prefill_chunk=16)
        got = decode(engine, embeds, max_new_tokens=6)
        err = (got.first_logits - ref.first_logits).abs().max() / ref.first_logits.abs().max()
        entry = {"plain": ref.token_ids, "fused": got.token_ids, "first_logits_err": float(err),
                 "graph": type(model.decode_graph).__name__}
        if variant == "fp32":
            # the probes fused.usable ran with the model's sizes before the decoding above
            report["probe"]["fp32"] = [fused._USABLE[("cpu", None, torch.float32, False)]]
            count = kernel_count.decode_step(model, embeds.shape[1])
            entry["count"] = {"path": count.path, "per_layer": count.per_layer, "first_layer": count.first_layer}
            model.decoder.gemv = True  # the GEMV option: projections, norms, SiLU and residual adds folded
            # with the long-cache attention (the same operator as the fused step's): three programs
            # per kv head and the combine
            fused.ATTENTION_SPLITS = 3
            entry["gemv_split"] = decode(engine, embeds, max_new_tokens=6).token_ids
            fused.ATTENTION_SPLITS = None
            report["probe"]["fp32"].append(fused._USABLE[("cpu", None, torch.float32, True)])
            count = kernel_count.decode_step(model, embeds.shape[1])
            entry["gemv_count"] = {"path": count.path, "per_layer": count.per_layer, "first_layer": count.first_layer}
            model.decoder.gemv = None
            # Bucketed rows (model.ROW_BUCKETS) after a cached prompt: the fused rope into scratch
            # rows, copied into the cache by index; the tail as one piece, then a draft check.
            model.options = replace(model.options, prefill_chunk=1024, rows_bucketed=True)
            longer = plain_run(engine, embeds, max_new_tokens=12).token_ids  # the plain path's
            draft = longer[:8] + [(t + 1) % 1000 for t in longer[8:]]
            engine.pipeline.cache_owner = None
            model.extend(embeds[:, :-12], 0)
            rows = decode(engine, embeds[:, -12:], max_new_tokens=12, start=embeds.shape[1] - 12, draft=draft)
            entry["rows"] = [longer, rows.token_ids, rows.draft_accepted, sorted(model._rows)]
            model.options = replace(model.options, rows_bucketed=None)
        model.options = replace(model.options, prefill_chunk=1024, static_step=None)
        report["e2e"][variant] = entry
    print(json.dumps(report))
    """
)


# The interpreter runs a launch's programs one by one: the decoding above on one layer of 4 query and
# 2 kv heads (GQA groups of 2 and head_dim 128, as the real models) took 12 s of CPU where the default
# tiny model's 2 layers of 16/8 heads took 22 s. The kernels' cases above cover the other head counts.
INTERPRETED_TEXT = {"num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.fixture(scope="module")
def interpreted(ckpt_root):
    from tests.oracle.checkpoints import cached_checkpoint

    ckpt = cached_checkpoint(ckpt_root, tie_word_embeddings=False, text_dims=INTERPRETED_TEXT)
    return run_interpreted(SCRIPT, str(ckpt), timeout=900)


# Relative to max |reference|. fp32: the order of sums. fp16: the kernels round where torch rounds,
# so they are within one rounding (elementwise work: exact). bf16: the interpreter truncates float32
# to bf16 where a GPU (and torch) rounds to nearest, so each rounding can be a unit off, and a chain
# of them (norm, weight, RoPE) a few (fp16 checks the rounding order instead).
TOLERANCE = {"fp32": 2e-6, "fp16": 2e-3, "bf16": 3e-2}


def test_every_kernel_matches_the_torch_code_it_replaces(interpreted):
    ops = interpreted["ops"]
    assert len(ops) == 3 * (3 * (6 + 1) + 4 + 3 * (2 * 3 + 3 * 2 * 3)) + 4 * (len(triton_fused.GEMV_CONFIGS) - 1)
    for name, dtype, same_shape, same_dtype, exact, err in ops:
        assert same_shape and same_dtype, (name, dtype)
        assert err <= TOLERANCE[dtype], f"{name} ({dtype}): error {err:.2e}"
        # Copies are exact; so is elementwise work in fp16, rounded where torch rounds (norms sum in
        # another order: their rsqrt can differ in the last bit, and so a rounding, as in fp32).
        elementwise = name.startswith("silu_mul") or name.endswith("residual")  # (not "gemv residual")
        if name.endswith("v cache") or (dtype == "fp16" and elementwise):
            assert exact, f"{name} ({dtype}) is not the torch code's result bit for bit (error {err:.2e})"


def test_the_probe_accepts_the_kernels(interpreted):
    # bf16 only on a GPU (test_fused_cuda.py): the interpreter's truncation to bf16 (see TOLERANCE)
    # compounds past the probe's tolerance, which is set for rounding to nearest.
    assert interpreted["probe"] == {"fp32": [True, True], "fp16": [True, True]}


def test_decoding_with_the_kernels_gives_the_plain_ids(interpreted):
    for variant, entry in interpreted["e2e"].items():
        assert len(entry["plain"]) == 6 and entry["fused"] == entry["plain"], variant
        assert entry["first_logits_err"] < 1e-5, variant
        assert entry["graph"] == "DecodeGraph"  # the static step (here run uncaptured)
    fp32 = interpreted["e2e"]["fp32"]
    assert fp32["gemv_split"] == fp32["plain"]
    plain, rows, accepted, buckets = fp32["rows"]
    assert len(plain) == 12 and rows == plain and accepted >= 8 and 16 in buckets


def test_one_fused_decode_step_launches_at_most_8_kernels_per_layer(interpreted):
    count = interpreted["e2e"]["fp32"]["count"]
    assert count["path"] == "fused" and count["per_layer"] <= 8
    # The norm before attention and before the MLP (each with the residual add), q/k/v, o, gate/up
    # and down projections, the attention (q/k norm, RoPE, cache write), SiLU * up.
    assert count["first_layer"] == {"rms_norm.default": 2, "linear.default": 4, "decode_attention.default": 1,
                                    "silu_mul.default": 1}  # fmt: skip


def test_the_gemv_option_launches_5_kernels_per_layer(interpreted):
    count = interpreted["e2e"]["fp32"]["gemv_count"]
    assert count["path"] == "fused+gemv" and count["per_layer"] == 5
    assert count["first_layer"] == {"gemv.default": 4, "decode_attention.default": 1}


# --- ahead of time, for real GPUs ---------------------------------------------------------------------

# (kernel, argument types, constexprs, warps) as the 1.7B model launches them in bf16 (hidden 2048,
# 16 query / 8 kv heads of 128, intermediate 6144), the decode attention in both forms.
KERNEL_CASES = {
    "rms_norm_rows": (
        {"x_ptr": "*bf16", "delta_ptr": "*bf16", "w_ptr": "*bf16", "h_ptr": "*bf16", "y_ptr": "*bf16", "M": "i32",
         "N": "i32", "stride_x": "i32", "stride_d": "i32", "eps": "fp32"},
        {"HAS_DELTA": True, "ROWS": 1, "BLOCK": 2048}, 4,
    ),
    "silu_mul_rows": (
        {"g_ptr": "*bf16", "u_ptr": "*bf16", "o_ptr": "*bf16", "M": "i32", "N": "i32", "stride_g": "i32",
         "stride_u": "i32"},
        {"ROWS": 1, "BLOCK": 4096}, 8,
    ),
    "rope_rows": (
        {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "qw_ptr": "*bf16", "kw_ptr": "*bf16", "cos_ptr": "*bf16",
         "sin_ptr": "*bf16", "q_out_ptr": "*bf16", "kc_ptr": "*bf16", "vc_ptr": "*bf16", "S": "i32", "start": "i32",
         "stride_q": "i32", "stride_k": "i32", "stride_v": "i32", "stride_cache": "i32", "eps": "fp32"},
        {"HEADS": 16, "HEADS_P2": 16, "KV": 8, "KV_P2": 8, "HD": 128}, 4,
    ),
    "decode_attention": (
        {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "qw_ptr": "*bf16", "kw_ptr": "*bf16", "cos_ptr": "*bf16",
         "sin_ptr": "*bf16", "kc_ptr": "*bf16", "vc_ptr": "*bf16", "pos_ptr": "*i64", "o_ptr": "*bf16",
         "acc_ptr": "*fp32", "ml_ptr": "*fp32", "stride_cache": "i32", "eps": "fp32", "scale": "fp32"},
        {"GROUP": 2, "GROUP_P2": 2, "HD": 128, "SPLITS": 1, "BLOCK": 64}, triton_fused.ATTENTION_WARPS,
    ),
    "decode_attention split": None,  # the same with SPLITS 4
    "combine_splits": ({"acc_ptr": "*fp32", "ml_ptr": "*fp32", "o_ptr": "*bf16"},
                       {"SPLITS": 4, "SPLITS_P2": 4, "HD": 128}, 2),
}  # fmt: skip
signature, constexprs, warps = KERNEL_CASES["decode_attention"]
KERNEL_CASES["decode_attention split"] = (signature, {**constexprs, "SPLITS": 4}, warps)
GEMV_SIGNATURE = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "res_ptr": "*bf16", "nw_ptr": "*bf16",
                  "N": "i32", "K": "i32", "eps": "fp32"}  # fmt: skip
for _prologue, _residual in ((1, False), (0, True), (2, True)):  # q/k/v or gate/up, o, down
    _n, _k, _warps = triton_fused.GEMV_CONFIGS[-1]
    KERNEL_CASES[f"gemv_rows {_prologue}"] = (
        GEMV_SIGNATURE,
        {"PROLOGUE": _prologue, "RESIDUAL": _residual, "BLOCK_N": _n, "BLOCK_K": _k},
        _warps,
    )


def compile_kernel(case: str, capability: int):
    """One kernel compiled by Triton's real compiler (to PTX and a cubin, with the ptxas Triton ships),
    every pointer, size and stride marked 16-aligned as the model's are."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name = case.split()[0]
    signature, constexprs, warps = KERNEL_CASES[case]
    kernel = triton_fused.raw_kernels()[name]
    types = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    full = {arg: types[arg] for arg in kernel.arg_names}  # in the kernel's order; every argument named
    aligned = [i for i, (arg, kind) in enumerate(full.items()) if kind.startswith("*") or arg.startswith("stride")]
    aligned += [i for i, arg in enumerate(full) if arg in ("N", "K")]  # row lengths (row counts vary)
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    source = ASTSource(fn=kernel, signature=full, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": warps})


@pytest.mark.parametrize("capability", [80, 89, 90])  # A100 / RTX 30, RTX 40, H100
def test_the_kernels_compile_for_real_gpus_and_read_in_vectors(capability):
    """The interpreter accepts more than the compiler does. Loads of one element at a time would make
    the kernels slow: the activation rows and the KV cache are read in vectors."""
    for case in KERNEL_CASES:
        kernel = compile_kernel(case, capability)
        assert kernel.asm.get("cubin"), f"{case}: no cubin for sm_{capability}"
        loads = re.findall(r"ld\.global(?:\.\w+)*", kernel.asm["ptx"])
        if case.startswith(("rms_norm", "silu_mul", "decode_attention", "gemv")):
            assert any(".v4." in op or ".v2." in op for op in loads), (case, sorted(set(loads)))


# --- in this process: the torch references behind the operators --------------------------------------


@pytest.fixture
def standins(monkeypatch):
    """The kernels' torch references in their place (same operators, same arguments), the fused
    layers switched on for the CPU, the static step, quantized layers computing in float32."""
    for name, reference in fused.REFERENCES.items():
        monkeypatch.setattr(triton_fused, name, reference)
    monkeypatch.setattr(fused, "FUSED_KERNELS", True)
    monkeypatch.setattr(fused, "_USABLE", {})
    monkeypatch.setitem(FRESH, "model_options", replace(FLOAT32, static_step=True, native_cpu_step=False))


def both_ways(engine, embeds, **kw):
    """(plain path, fused path) generations."""
    decoder = engine.model.decoder
    decoder.kernels = False
    try:
        ref = plain_run(engine, embeds, **kw)
    finally:
        decoder.kernels = None
    return ref, decode(engine, embeds, **kw)


@pytest.mark.parametrize(
    ("ckpt", "variant"),
    [("ckpt_untied", "fp32"), ("ckpt_stops", "fp32"), ("ckpt_untied", "int8"), ("ckpt_untied", "int4")],
)  # fmt: skip
def test_the_fused_layers_give_the_plain_ids(request, standins, ckpt, variant):
    engine = fresh(request.getfixturevalue(ckpt), variant=variant)
    for seconds, seed in CLIPS[:2]:
        ref, got = both_ways(engine, prompt_embeds(engine, synth_audio(seconds, seed=seed)))
        assert got.token_ids == ref.token_ids and got.stopped_on_eos == ref.stopped_on_eos
        torch.testing.assert_close(got.first_logits, ref.first_logits, rtol=0, atol=1e-5 * ref.first_logits.abs().max())
    assert engine.model.decoder.uses_kernels(engine.model.decoder.embed_tokens.weight)


def test_the_fused_step_follows_cache_growth_chunked_prefill_and_drafts(standins, ckpt_untied, monkeypatch):
    monkeypatch.setattr(model_mod, "DECODE_RESERVE", 3)
    monkeypatch.setattr(model_mod, "CACHE_ROUND", 4)
    engine = fresh(ckpt_untied, model_options=replace(FLOAT32, prefill_chunk=16))
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=2))
    ref, got = both_ways(engine, embeds, max_new_tokens=30)
    assert got.token_ids == ref.token_ids and len(got.token_ids) == 30
    draft = ref.token_ids[:20] + [(t + 1) % 1000 for t in ref.token_ids[20:]]
    drafted = decode(engine, embeds, max_new_tokens=30, draft=draft)
    assert drafted.token_ids == ref.token_ids and drafted.draft_accepted >= 20


def test_bucketed_rows_with_the_fused_layers_give_the_plain_ids(standins, ckpt_untied, monkeypatch):
    """The prompt tail after a cached prompt and the draft checks as bucketed rows (model.ROW_BUCKETS)
    through the fused norm and SiLU kernels."""
    engine = fresh(ckpt_untied, model_options=replace(FLOAT32, rows_bucketed=True))
    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=2))
    ref = plain_run(engine, embeds, max_new_tokens=30)
    draft = ref.token_ids[:20] + [(t + 1) % 1000 for t in ref.token_ids[20:]]
    cut = embeds.shape[1] - 20
    for guess in (None, draft):
        engine.pipeline.cache_owner = None
        model.extend(embeds[:, :cut], 0)
        got = decode(engine, embeds[:, cut:], max_new_tokens=30, start=cut, draft=guess)
        assert got.token_ids == ref.token_ids
    assert got.draft_accepted >= 20 and got.draft_passes >= 1
    # The prompt's first 41 positions (extended from 0), the 20-row tail and the 20 draft ids fed at once.
    assert sorted(model._rows) == [32, 64]
    assert model.decoder.uses_kernels(embeds)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {"a": write_adapter(root / "a", seed=1), "b": write_adapter(root / "b", seed=2, dora=True)}


@pytest.fixture(scope="module")
def prequantized_int8(ckpt_untied, tmp_path_factory):
    return writers.write_quantized_folder(ckpt_untied, tmp_path_factory.mktemp("q") / "int8", "int8")


def test_unmerged_adapters_decode_with_the_fused_layers(standins, prequantized_int8, adapters):
    engine = fresh(prequantized_int8, adapters=[str(adapters["a"]), str(adapters["b"]) + ":0.5"])
    assert isinstance(engine.model.decoder.layers[0].self_attn.q_proj, LoraLinear)  # q/k/v run one by one
    for seconds, seed in CLIPS[:2]:
        ref, got = both_ways(engine, prompt_embeds(engine, synth_audio(seconds, seed=seed)))
        assert got.token_ids == ref.token_ids


def test_the_kernel_count_sees_each_fused_operator_once(standins, ckpt_untied, monkeypatch):
    engine = fresh(ckpt_untied)
    model = engine.model
    with torch.inference_mode():
        model.prefill(prompt_embeds(engine, synth_audio(2.5, seed=1)), 8)
    count = kernel_count.decode_step(model, 30)
    assert count.path == "fused" and count.per_layer == 8 and count.layers == 2
    assert count.first_layer == {"rms_norm.default": 2, "linear.default": 4, "decode_attention.default": 1,
                                 "silu_mul.default": 1}  # fmt: skip
    model.decoder.kernels = False
    unfused = kernel_count.decode_step(model, 30)
    # The torch ops of today's step: RMSNorm as pow/mean/rsqrt/mul, RoPE as mul/neg/cat/add, ...
    assert unfused.path == "static" and unfused.per_layer >= 40
    assert unfused.first_layer["rsqrt.default"] == 4 and unfused.first_layer["index_copy_.default"] == 2
    model.options = replace(model.options, static_step=None)  # the CPU's own plain step
    plain = kernel_count.decode_step(model, 30)
    assert plain.path == "plain" and plain.per_layer == unfused.per_layer
    assert "per layer" in count.describe() and "fused" in count.describe()


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_the_gemv_option_gives_the_plain_ids(standins, ckpt_untied, monkeypatch, variant):
    monkeypatch.setattr(fused, "FUSED_GEMV", True)
    engine = fresh(ckpt_untied, variant=variant)
    model = engine.model
    for seconds, seed in CLIPS[:2]:
        ref, got = both_ways(engine, prompt_embeds(engine, synth_audio(seconds, seed=seed)))
        assert got.token_ids == ref.token_ids
    count = kernel_count.decode_step(model, 30)
    if variant == "fp32":  # 4 GEMVs (norms, SiLU * up, residual adds inside) and the attention
        assert count.path == "fused+gemv" and count.per_layer == 5
    else:  # quantized projections: the fused step as it is
        assert count.path == "fused" and count.per_layer == 8


def test_the_kernel_count_sees_the_int8_triton_kernel_launched_outside_the_dispatcher(
    standins, ckpt_untied, monkeypatch
):
    from dictation.asr.nn.kernels import triton_gemv

    def int8_matmul(x, weight, scale):  # a stand-in for the Triton kernel: torch ops the dispatcher
        from torch.utils._python_dispatch import _disable_current_modes  # would not see (a launch)

        with _disable_current_modes():
            return (x.float() @ (weight.float() * scale[:, None]).T).to(x.dtype)

    monkeypatch.setattr(triton_gemv, "int8_matmul", int8_matmul)
    monkeypatch.setattr(quantized.Int8Linear, "_kernel", quantized.Int8Linear._triton_kernel)
    engine = fresh(ckpt_untied, variant="int8")
    decode(engine, prompt_embeds(engine, synth_audio(2.5, seed=1)), max_new_tokens=3)  # kernel checks done
    count = kernel_count.decode_step(engine.model, 30)
    assert count.first_layer["int8_matmul (triton)"] == 4, count.first_layer  # q/k/v, o, gate/up, down
    assert count.path == "fused" and count.per_layer == 8, count.first_layer
    assert triton_gemv.int8_matmul is int8_matmul  # put back


def test_the_cpu_decodes_without_the_kernels_and_never_probes(ckpt_untied, monkeypatch):
    monkeypatch.setattr(fused, "_USABLE", {})
    monkeypatch.setattr(fused, "probe", lambda device, dtype: pytest.fail("probed on the CPU"))
    engine = fresh(ckpt_untied)
    assert not engine.model.decoder.uses_kernels(engine.model.decoder.embed_tokens.weight)
    decode(engine, prompt_embeds(engine, synth_audio(2.5, seed=1)), max_new_tokens=4)


@pytest.mark.parametrize("how", ["no triton", "no interpreter", "wrong answers"])
def test_where_the_kernels_cannot_run_the_torch_path_decodes_with_one_log_line(ckpt_untied, monkeypatch, caplog, how):
    caplog.set_level(logging.INFO, logger="dictation.asr.nn.kernels.fused")
    monkeypatch.setattr(fused, "FUSED_KERNELS", True)
    monkeypatch.setattr(fused, "_USABLE", {})
    monkeypatch.setitem(FRESH, "model_options", replace(FRESH["model_options"], static_step=True))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if how == "no triton":

        def missing():
            raise ImportError("No module named 'triton'")

        monkeypatch.setattr(triton_fused, "raw_kernels", missing)
    elif how == "wrong answers":
        for name, reference in fused.REFERENCES.items():
            monkeypatch.setattr(triton_fused, name, reference)
        monkeypatch.setattr(triton_fused, "silu_mul", lambda gate, up: fused.reference_silu_mul(gate, up) * 1.01)
    engine = fresh(ckpt_untied)
    embeds = prompt_embeds(engine, synth_audio(2.5, seed=1))
    ref, got = both_ways(engine, embeds, max_new_tokens=6)
    assert got.token_ids == ref.token_ids
    assert not engine.model.decoder.uses_kernels(embeds)
    lines = [r.getMessage() for r in caplog.records if r.name == "dictation.asr.nn.kernels.fused"]
    assert len(lines) == 1 and "using the torch ops" in lines[0], lines
    if how == "no triton":
        assert "ImportError" in lines[0]
    elif how == "wrong answers":
        assert "wrong results" in lines[0] and "silu_mul" in lines[0]


def test_misfit_inputs_are_refused_with_their_shapes():
    with pytest.raises(ValueError, match=r"rms_norm: x \(2, 8\)"):
        triton_fused.rms_norm(torch.zeros(2, 8), None, torch.ones(4), 1e-6)
    with pytest.raises(ValueError, match=r"gate \(2, 8\) and up \(2, 4\)"):
        triton_fused.silu_mul(torch.zeros(2, 8), torch.zeros(2, 4))
    q, k = torch.zeros(1, 1, 4 * 64), torch.zeros(1, 1, 2 * 64)
    cache = torch.zeros(1, 3, 16, 64)  # 3 kv heads in the cache, 2 in k
    with pytest.raises(ValueError, match=r"cache \(1, 3, 16, 64\) do not fit"):
        triton_fused.decode_attention(q, k, k, torch.ones(64), torch.ones(64), torch.zeros(16, 64),
                                      torch.zeros(16, 64), cache, cache, torch.tensor([0]), 1e-6)  # fmt: skip


def test_the_attention_splits_follow_the_cache_size():
    assert triton_fused.attention_splits(512) == triton_fused.attention_splits(1024) == 1
    assert triton_fused.attention_splits(1536) == 3
    assert triton_fused.attention_splits(16384) == triton_fused.MAX_SPLITS
