"""Our llama.cpp pair (``convert --gguf-layout pair``) against llama.cpp's own converter on the same tiny model,
key by key: metadata (value types and bytes), tensor names, shapes, types and bytes.

llama.cpp's converter comes from PyPI's llama-cpp-python sdist (tests/oracle/llama_cpp.py; the first run on a
machine downloads it, ~2 min). Running ``llama-mtmd-cli`` itself needs a 15-minute build: not in CI;
benchmarks/llama_mtmd_check.py is the full check (docs/engine.md, "GGUF").

The tiny checkpoint has 4 audio layers here: the converter maps ``conv2d{N}`` only for N below the audio layer
count, so it cannot convert the 2-layer one.
"""

from __future__ import annotations

import struct

import pytest
import torch
from safetensors.torch import load_file

from dictation.asr.checkpoints.gguf.export import AUDIO_LAYER_NORM_EPS
from dictation.asr.nn.model import AsrModel
from dictation.asr.tune.convert import convert
from tests.oracle.checkpoints import cached_checkpoint
from tests.oracle.llama_cpp import gguf_entries, llama_cpp_tree, run_converter

TYPES = {"F32": "f32", "F16": "f16", "Q8_0": "q8_0"}  # the types llama.cpp's converter writes itself
# Metadata llama.cpp's converter writes differently, and why that is allowed:
ALLOWED = {
    # derived by gguf-py's naming heuristics from the folder name ("tiny-thinker-<hash>" -> "Tiny Thinker <hash>",
    # basename "tiny-thinker", finetune "<hash>"); informational, read by no runtime. Ours: the folder name
    # and the merged adapters.
    "general.name": "naming heuristic",
    "general.basename": "naming heuristic",
    "general.finetune": "naming heuristic",
}


@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    return cached_checkpoint(ckpt_root, tie_word_embeddings=False, audio_layers=4)


@pytest.fixture(scope="module")
def tied_checkpoint(ckpt_root):
    return cached_checkpoint(ckpt_root, tie_word_embeddings=True, audio_layers=4)


@pytest.fixture(scope="module")
def files(checkpoint, tied_checkpoint, ckpt_root, tmp_path_factory):
    """{type: {"ours": (text, mmproj), "theirs": (text, mmproj)}}; "tied" / "hf": the text files at F16 of the
    tied model and of the -hf folder (llama.cpp converts the mmproj only from the original layout)."""
    root = tmp_path_factory.mktemp("llama")
    tied = (root / "ours-tied.gguf", root / "theirs-tied.gguf")
    convert(tied_checkpoint, "gguf", tied[0], type_name="F16", gguf_layout="pair")
    hf_folder = cached_checkpoint(ckpt_root, tie_word_embeddings=False, layout="hf")  # has a tokenizer.json
    hf = (root / "ours-hf.gguf", root / "theirs-hf.gguf")
    convert(hf_folder, "gguf", hf[0], type_name="F16", gguf_layout="pair")
    jobs = [(tied_checkpoint, tied[1], "f16", False), (hf_folder, hf[1], "f16", False)]
    out = {"tied": {"ours": tied[:1], "theirs": tied[1:]}, "hf": {"ours": hf[:1], "theirs": hf[1:]}}
    for kind, outtype in TYPES.items():
        theirs = (root / f"theirs-{kind}.gguf", root / f"mmproj-theirs-{kind}.gguf")
        jobs += [(checkpoint, theirs[0], outtype, False), (checkpoint, theirs[1], outtype, True)]
        ours = tuple(convert(checkpoint, "gguf", root / f"ours-{kind}.gguf", type_name=kind, gguf_layout="pair"))
        out[kind] = {"ours": ours, "theirs": theirs}
    run_converter(llama_cpp_tree(), jobs)
    return out


@pytest.mark.parametrize("kind", list(TYPES))
@pytest.mark.parametrize("part", ["text", "mmproj"])
def test_the_pair_is_what_llama_cpp_converts(files, kind, part):
    i = 0 if part == "text" else 1
    ours_meta, ours_tensors = gguf_entries(files[kind]["ours"][i])
    their_meta, their_tensors = gguf_entries(files[kind]["theirs"][i])
    assert ours_meta.keys() - ALLOWED.keys() == their_meta.keys() - ALLOWED.keys()
    for key in ours_meta.keys() - ALLOWED.keys():
        assert ours_meta[key] == their_meta[key], key
    assert sorted(ours_tensors) == sorted(their_tensors)  # the same names (the order differs; no loader minds)
    for name, (shape, type_name, raw) in ours_tensors.items():
        their_shape, their_type, their_raw = their_tensors[name]
        assert (shape, type_name) == (their_shape, their_type), name
        assert raw == their_raw, name  # every tensor byte-identical, the quantized ones included


def test_a_tied_pair_leaves_out_the_head_llama_cpp_copies_from_the_checkpoint(files, tied_checkpoint):
    """A tied Qwen3-ASR checkpoint still stores a ``thinker.lm_head.weight`` that the official code ignores (spec
    §2.1; the tiny one's differs from the embeddings): llama.cpp's converter writes it as ``output.weight``, we
    write no head (llama.cpp then uses ``token_embd``, as the official model does). Everything else is equal."""
    ours_meta, ours_tensors = gguf_entries(files["tied"]["ours"][0])
    their_meta, their_tensors = gguf_entries(files["tied"]["theirs"][0])
    differ = ALLOWED.keys() | {"general.size_label"}  # the size counts their extra head
    assert ours_meta.keys() - differ == their_meta.keys() - differ
    assert all(ours_meta[key] == their_meta[key] for key in ours_meta.keys() - differ)
    assert sorted(their_tensors) == sorted([*ours_tensors, "output.weight"])
    assert all(ours_tensors[name] == their_tensors[name] for name in ours_tensors)
    stored = load_file(str(tied_checkpoint / "model.safetensors"))["thinker.lm_head.weight"]
    head = their_tensors["output.weight"]
    assert head[2] == stored.half().numpy().tobytes() != ours_tensors["token_embd.weight"][2]


def test_the_text_model_from_an_hf_folder_is_what_llama_cpp_converts(files):
    """An -hf folder ships tokenizer.json: the pad id (<|endoftext|>) and add_eos_token come from it, as in
    gguf-py's SpecialVocab. Transformers 5's config drops the M-RoPE sections: llama.cpp's converter then writes
    no qwen3vl.rope.dimension_sections; we write the model's [24, 20, 20, 0] (whatever the source layout)."""
    ours_meta, ours_tensors = gguf_entries(files["hf"]["ours"][0])
    their_meta, their_tensors = gguf_entries(files["hf"]["theirs"][0])
    sections = "qwen3vl.rope.dimension_sections"
    assert ours_meta.keys() - ALLOWED.keys() == (their_meta.keys() - ALLOWED.keys()) | {sections}
    assert all(their_meta[key] == ours_meta[key] for key in their_meta.keys() - ALLOWED.keys())
    assert their_meta["tokenizer.ggml.padding_token_id"] == (4, struct.pack("<I", 151643))
    assert their_meta["tokenizer.ggml.add_eos_token"] == (7, b"\0")
    assert ours_tensors == their_tensors


def test_mmproj_epsilon_and_position_table_are_llama_cpps_and_our_engines(files, checkpoint):
    """What our reader ignores (it computes both), checked by value: the audio LayerNorm epsilon (a float32
    under clip.audio.attention.layer_norm_epsilon, the key llama.cpp's mtmd requires) and the sinusoid table."""
    ours_meta, ours_tensors = gguf_entries(files["F32"]["ours"][1])
    their_meta, their_tensors = gguf_entries(files["F32"]["theirs"][1])
    key = "clip.audio.attention.layer_norm_epsilon"
    assert ours_meta[key] == their_meta[key] == (6, struct.pack("<f", AUDIO_LAYER_NORM_EPS))
    from dictation.asr.config import AsrConfig

    with torch.device("meta"):
        model = AsrModel(AsrConfig.from_file(checkpoint / "config.json"))
    assert model.audio_tower.layers[0].self_attn_layer_norm.eps == AUDIO_LAYER_NORM_EPS
    shape, type_name, raw = ours_tensors["a.position_embd.weight"]
    assert (shape, type_name, raw) == their_tensors["a.position_embd.weight"]
    table = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(shape)
    encoder = AsrModel(AsrConfig.from_file(checkpoint / "config.json")).audio_tower
    rows = encoder.positions.shape[0]  # our encoder's table: the first rows of the same sinusoids
    assert torch.equal(table[:rows], encoder.positions)
