"""A damaged GGUF header is one line naming the file and the real problem: the field a
cut-short file ends inside, and a tensor whose size or offset no model file can have (it used to be
"truncated ... an interrupted download?" with a 49-digit byte offset, or Python's "unpack_from
requires a buffer")."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from dictation.asr.checkpoints.gguf.reader import read_gguf_file
from dictation.asr.errors import WeightsError


def string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def gguf(path: Path, body: bytes, *, n_tensors: int = 0, n_kv: int = 0) -> Path:
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + body)
    return path


def tensor_entry(name: str, dims: tuple[int, ...], offset: int = 0, ggml_type: int = 0) -> bytes:
    return string(name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims) + struct.pack("<IQ", ggml_type, offset)


def error_of(path: Path) -> str:
    with pytest.raises(WeightsError) as info:
        read_gguf_file(path)
    return str(info.value)


def test_a_file_cut_inside_a_metadata_value_names_the_key(tmp_path):
    path = gguf(tmp_path / "m.gguf", string("general.file_type") + struct.pack("<I", 10) + b"\x01\x02\x03", n_kv=1)
    assert error_of(path) == (
        f"{path}: cut short or corrupt: metadata key 'general.file_type' runs past the end of the file "
        "(8 bytes from byte 53, the file has 56); an interrupted download?"
    )


def test_a_file_cut_inside_a_key_name_or_an_array(tmp_path):
    name = gguf(tmp_path / "name.gguf", struct.pack("<Q", 1000) + b"general.", n_kv=2)
    assert error_of(name).startswith(
        f"{name}: cut short or corrupt: the name of metadata key 1 of 2 (a string of 1,000 bytes) runs past the end"
    )
    numbers = string("qwen3asr.layer_sizes") + struct.pack("<IIQ", 9, 4, 50) + bytes(12)
    array = gguf(tmp_path / "array.gguf", numbers, n_kv=1)
    assert error_of(array).startswith(
        f"{array}: cut short or corrupt: metadata key 'qwen3asr.layer_sizes' (an array of 50 numbers) runs past the end"
    )
    words = string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3) + string("a") + string("b")
    tokens = gguf(tmp_path / "tokens.gguf", words, n_kv=1)
    assert "metadata key 'tokenizer.ggml.tokens' (the length of string 3 of 3) runs past the end" in error_of(tokens)


def test_a_file_cut_inside_the_tensor_table_names_the_tensor(tmp_path):
    entry = tensor_entry("blk.0.attn_q.weight", (64, 64))
    path = gguf(tmp_path / "m.gguf", entry[:-10], n_tensors=1)
    message = error_of(path)
    assert message.startswith(
        f"{path}: cut short or corrupt: the entry of tensor 'blk.0.attn_q.weight' in the tensor table runs past the end"
    )
    assert "unpack_from" not in message


def test_an_impossible_tensor_size_says_the_header_is_corrupt(tmp_path):
    huge = tensor_entry("token_embd.weight", (2**62, 2**62, 2**30))
    path = gguf(tmp_path / "m.gguf", huge + bytes(64), n_tensors=1)
    size = path.stat().st_size
    assert error_of(path) == (
        f"{path}: corrupt header: tensor 'token_embd.weight' has an impossible size (its 3-D shape), beyond 1 TiB "
        f"(the file has {size:,} bytes)"
    )


def test_an_impossible_tensor_offset_says_the_header_is_corrupt(tmp_path):
    path = gguf(tmp_path / "m.gguf", tensor_entry("output_norm.weight", (4,), offset=2**60) + bytes(64), n_tensors=1)
    assert "corrupt header: tensor 'output_norm.weight' has an impossible data offset, beyond 1 TiB" in error_of(path)


def test_a_plausible_tensor_past_the_end_is_still_a_truncated_file(tmp_path):
    path = gguf(tmp_path / "m.gguf", tensor_entry("output_norm.weight", (4096,)) + bytes(64), n_tensors=1)
    assert "truncated (tensor output_norm.weight ends at byte" in error_of(path)
