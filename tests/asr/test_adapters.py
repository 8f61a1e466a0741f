"""Applying LoRA adapters, against the real ``peft`` library on the official model.

Each adapter is made by peft itself: ``get_peft_model`` on the official reference model (tiny random
checkpoint), random non-zero B matrices (and DoRA magnitudes, and saved modules), ``save_pretrained``.
The peft-wrapped official model is then the oracle for our engine with that adapter folder.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dictation.asr import AdapterError, AsrEngine, EngineOptions
from dictation.asr.tune.adapters import AdapterState, LoraLinear, load_adapters
from tests.oracle import strip_eos, synth_audio

MAX_NEW = 16
AUDIO = synth_audio(2.5, seed=21)

CONFIGS = {
    "plain": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "rslora-patterns": dict(
        r=4,
        lora_alpha=8,
        use_rslora=True,
        target_modules=["q_proj", "k_proj", "o_proj", "gate_proj", "down_proj"],
        rank_pattern={"o_proj": 2},
        alpha_pattern={"down_proj": 3},
    ),
    "dora": dict(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"], use_dora=True),
    "modules-to-save": dict(r=2, lora_alpha=4, target_modules=["v_proj"], modules_to_save=["lm_head"]),
    "encoder": dict(
        r=4, lora_alpha=8, target_modules=r".*audio_tower\.(layers\.\d+\.(fc1|fc2|self_attn\.out_proj)|proj1)"
    ),
}


def make_peft_adapter(checkpoint, out, config: dict, seed: int = 0):
    """(peft-wrapped official oracle, adapter folder) for ``config``."""
    from peft import LoraConfig, get_peft_model

    from tests.oracle.official import OfficialOracle

    oracle = OfficialOracle(checkpoint)  # a fresh one: peft changes the model in place
    peft_model = get_peft_model(oracle.model, LoraConfig(**config))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, module in peft_model.named_modules():
            if hasattr(module, "lora_B") and "default" in module.lora_B:
                b = module.lora_B["default"].weight
                b.copy_(torch.randn(b.shape, generator=generator) * 0.05)
            if hasattr(module, "lora_magnitude_vector") and "default" in module.lora_magnitude_vector:
                m = module.lora_magnitude_vector["default"].weight
                m.mul_(1 + 0.2 * torch.randn(m.shape, generator=generator))
            if name.endswith("modules_to_save.default"):
                w = module.weight
                w.add_(torch.randn(w.shape, generator=generator) * 0.05 * float(w.std()))
    peft_model.save_pretrained(str(out))
    return oracle, out


def engine_with(checkpoint, adapters, **options):
    engine = AsrEngine(EngineOptions(model=str(checkpoint), device="cpu", dtype="fp32", adapters=adapters, **options))
    engine.prepare()
    return engine


def first_logits_and_ids(engine):
    result = engine.pipeline.run(AUDIO, None, "", MAX_NEW, keep_first_logits=True)
    return result.first_logits, result.ids


@pytest.fixture(scope="module")
def peft_adapters(ckpt_untied, tmp_path_factory):
    """name -> (peft oracle first-step logits, peft greedy ids, adapter folder), built once per module."""
    root = tmp_path_factory.mktemp("peft")
    made = {}
    for i, (name, config) in enumerate(CONFIGS.items()):
        oracle, folder = make_peft_adapter(ckpt_untied, root / name, config, seed=i)
        made[name] = (oracle.first_step_logits(AUDIO), oracle.greedy_ids(AUDIO, max_new_tokens=MAX_NEW), folder)
    return made


@pytest.mark.parametrize("name", list(CONFIGS))
def test_our_engine_matches_peft_on_the_official_model(ckpt_untied, engine_factory, peft_adapters, name):
    ref_logits, ref_ids, folder = peft_adapters[name]
    logits, ids = first_logits_and_ids(engine_with(ckpt_untied, [str(folder)]))
    scale = float(ref_logits.abs().max())
    torch.testing.assert_close(logits.float(), ref_logits.float(), atol=1e-4 * max(scale, 1.0), rtol=0)
    assert strip_eos(ids) == strip_eos(ref_ids)
    # and the adapter really changed the model
    base_logits, _ = first_logits_and_ids(engine_factory(ckpt_untied))
    assert float((base_logits - logits).abs().max()) > 1e-3 * scale


def test_an_hf_layout_model_takes_the_same_adapter(ckpt_root, ckpt_untied, peft_adapters):
    from tests.oracle.checkpoints import cached_checkpoint

    hf = cached_checkpoint(ckpt_root, layout="hf")
    folder = peft_adapters["dora"][2]
    ours_hf, _ = first_logits_and_ids(engine_with(hf, [str(folder)]))
    ours, _ = first_logits_and_ids(engine_with(ckpt_untied, [str(folder)]))
    torch.testing.assert_close(ours_hf, ours, atol=1e-5, rtol=0)


def test_changing_and_removing_adapters_restores_the_base_exactly(ckpt_untied, engine_factory, peft_adapters):
    engine = engine_with(ckpt_untied, [])
    base_state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    base_logits, base_ids = first_logits_and_ids(engine)

    engine.set_adapters([str(peft_adapters["dora"][2]), str(peft_adapters["modules-to-save"][2]) + ":0.5"])
    assert "dora" in engine.model_label and "modules-to-save:0.5" in engine.model_label
    engine.set_adapters([str(peft_adapters["plain"][2])])
    logits, ids = first_logits_and_ids(engine)
    ref_logits, ref_ids, _ = peft_adapters["plain"]
    torch.testing.assert_close(logits, ref_logits, atol=1e-4 * float(ref_logits.abs().max()), rtol=0)

    engine.set_adapters([])
    for key, value in engine.model.state_dict().items():
        assert torch.equal(value, base_state[key]), key
    logits, ids = first_logits_and_ids(engine)
    assert torch.equal(logits, base_logits) and ids == base_ids


def test_weights_scale_an_adapter_and_zero_is_no_adapter(ckpt_untied, engine_factory, peft_adapters):
    folder = str(peft_adapters["plain"][2])
    base, _ = first_logits_and_ids(engine_factory(ckpt_untied))
    zero, _ = first_logits_and_ids(engine_with(ckpt_untied, [f"{folder}:0"]))
    torch.testing.assert_close(zero, base, atol=1e-5, rtol=0)
    # LoRA is linear in its weight: W + 2 * delta is the same as the adapter twice at 1
    double, _ = first_logits_and_ids(engine_with(ckpt_untied, [f"{folder}:2"]))
    twice, _ = first_logits_and_ids(engine_with(ckpt_untied, [folder, folder]))
    torch.testing.assert_close(double, twice, atol=1e-4 * float(double.abs().max()), rtol=0)
    assert float((double - base).abs().max()) > 1e-3


def test_a_bad_adapter_leaves_the_model_in_use_untouched(ckpt_untied, peft_adapters, tmp_path):
    good = str(peft_adapters["plain"][2])
    engine = engine_with(ckpt_untied, [good])
    before, _ = first_logits_and_ids(engine)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "adapter_config.json").write_bytes((peft_adapters["plain"][2] / "adapter_config.json").read_bytes())
    data = bytearray((peft_adapters["plain"][2] / "adapter_model.safetensors").read_bytes())
    data[-64:] = b"\xff" * 64  # NaN bit patterns in the last tensor's data
    (corrupt / "adapter_model.safetensors").write_bytes(bytes(data))
    with pytest.raises(AdapterError, match=r"adapter_model\.safetensors: tensor .* holds NaN or infinite values"):
        engine.set_adapters([str(corrupt)])
    after, _ = first_logits_and_ids(engine)
    assert torch.equal(before, after)
    assert tuple(engine.options.adapters) == (good,)


class _Adapter:
    """A loaded adapter with one layer, for unit checks of the merged and unmerged paths."""


def _one_layer_adapter(tmp_path, out_f, in_f, *, dora: bool, seed: int, weight: float = 1.0):
    import json

    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    folder = tmp_path / f"a{seed}"
    folder.mkdir()
    module = "base_model.model.thinker.model.layers.0.self_attn.q_proj"
    tensors = {
        f"{module}.lora_A.weight": torch.randn(4, in_f, generator=g) * 0.3,
        f"{module}.lora_B.weight": torch.randn(out_f, 4, generator=g) * 0.3,
    }
    if dora:
        tensors[f"{module}.lora_magnitude_vector"] = 1 + torch.rand(out_f, generator=g)
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_dora": dora, "target_modules": ["q_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return f"{folder}:{weight}"


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
def test_unmerged_layers_equal_merged_weights_stacked_and_weighted(ckpt_untied, engine_factory, tmp_path, dora):
    model = engine_factory(ckpt_untied).model
    layer = model.decoder.layers[0].self_attn.q_proj
    specs = [
        _one_layer_adapter(tmp_path, layer.out_features, layer.in_features, dora=dora, seed=1, weight=0.7),
        _one_layer_adapter(tmp_path, layer.out_features, layer.in_features, dora=dora, seed=2),
    ]
    adapters = load_adapters(specs, model)
    base = nn.Linear(layer.in_features, layer.out_features, bias=False)
    with torch.no_grad():
        base.weight.copy_(layer.weight)
    stacked = LoraLinear(
        LoraLinear(base, adapters[0], "decoder.layers.0.self_attn.q_proj", torch.float32),
        adapters[1],
        "decoder.layers.0.self_attn.q_proj",
        torch.float32,
    )
    from dictation.asr.tune.adapters import merged_weights

    merged = merged_weights(adapters, {"decoder.layers.0.self_attn.q_proj.weight": layer.weight})
    x = torch.randn(5, layer.in_features)
    with torch.no_grad():
        torch.testing.assert_close(
            stacked(x), F.linear(x, merged["decoder.layers.0.self_attn.q_proj.weight"]), atol=1e-4, rtol=1e-4
        )
        torch.testing.assert_close(
            stacked.dense(), merged["decoder.layers.0.self_attn.q_proj.weight"], atol=1e-5, rtol=1e-5
        )
    assert not torch.equal(merged["decoder.layers.0.self_attn.q_proj.weight"], layer.weight.float())


def test_state_apply_and_clear_round_trip_on_a_tied_head(ckpt_root, tmp_path):
    """A head adapter on a tied model unties the head (peft adapts the head alone) and ties it again."""
    import json

    from safetensors.torch import save_file

    from dictation.asr.checkpoints.safetensors import load_model
    from dictation.asr.config import AsrConfig
    from tests.oracle.checkpoints import cached_checkpoint

    tied = cached_checkpoint(ckpt_root, tie_word_embeddings=True)
    model = load_model(tied, AsrConfig.from_file(tied / "config.json"), torch.device("cpu"), torch.float32)
    assert model.lm_head is None
    embed = model.decoder.embed_tokens.weight.clone()
    folder = tmp_path / "head"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 2, "target_modules": ["lm_head"]})
    )
    g = torch.Generator().manual_seed(3)
    save_file(
        {
            "base_model.model.thinker.lm_head.lora_A.weight": torch.randn(2, embed.shape[1], generator=g),
            "base_model.model.thinker.lm_head.lora_B.weight": torch.randn(embed.shape[0], 2, generator=g),
        },
        str(folder / "adapter_model.safetensors"),
    )
    state = AdapterState(model)
    state.apply(load_adapters([str(folder)], model))
    assert model.lm_head is not None and not torch.equal(model.lm_head.weight, embed)
    assert torch.equal(model.decoder.embed_tokens.weight, embed)  # the embeddings are not adapted
    state.clear()
    assert model.lm_head is None and torch.equal(model.decoder.embed_tokens.weight, embed)
