"""Adapters the engine refuses with one line: absurd weights, and a modules_to_save
entry the adapter file holds nothing for (it used to be ignored without a word)."""

from __future__ import annotations

import pytest
import torch

from dictation.asr.errors import AdapterError
from dictation.asr.limits import MAX_ADAPTER_WEIGHT
from dictation.asr.tune.adapter_files import check_adapter, parse_adapter_spec
from tests.asr.test_lora import write_adapter


@pytest.mark.parametrize("tail", ["1e30", "-11", "10.5", "1e3"])
def test_an_absurd_adapter_weight_is_refused(tail):
    with pytest.raises(AdapterError) as exc:
        parse_adapter_spec(f"/adapters/mine:{tail}")
    assert str(exc.value) == (
        f"/adapters/mine: adapter weight {tail} is outside -10 to 10 (1 applies the adapter as trained; beyond "
        "that range its change swamps the model's own weights)"
    )


@pytest.mark.parametrize("weight", [MAX_ADAPTER_WEIGHT, -MAX_ADAPTER_WEIGHT, 0.0, 2.0, -1.0])
def test_weights_within_the_range_are_taken(weight):
    assert parse_adapter_spec(f"/adapters/mine:{weight:g}") == ("/adapters/mine", weight)


@pytest.mark.parametrize("listed", ["classifier", "lm_head"])
def test_a_listed_module_the_file_lacks_is_refused(tmp_path, listed):
    adapter = write_adapter(tmp_path / "a", modules_to_save=[listed])
    assert check_adapter(adapter) == (
        f"{adapter / 'adapter_config.json'}: modules_to_save lists {listed!r}, but adapter_model.safetensors holds "
        "no weights of such a module (no module of that name in the model it was trained on?)"
    )


def test_a_listed_module_the_file_holds_is_read(tmp_path):
    saved = {"base_model.model.thinker.lm_head.weight": torch.zeros(151936, 64)}
    adapter = write_adapter(tmp_path / "a", modules_to_save=["lm_head"], extra_tensors=saved)
    assert check_adapter(adapter) is None
    both = write_adapter(tmp_path / "b", modules_to_save=["lm_head", "classifier"], extra_tensors=saved)
    assert "modules_to_save lists 'classifier'" in check_adapter(both)
