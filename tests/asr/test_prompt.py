"""Tokenizer loading and prompt ids against the ids the spec lists (§6.1, §2.4)."""

from __future__ import annotations

import json
import shutil

import pytest

from dictation.asr.errors import ModelError
from dictation.asr.text.prompt import PromptBuilder

PROMPT_HEAD = [151644, 8948, 198, 151645, 198, 151644, 872, 198, 151669]
PROMPT_TAIL = [151670, 151645, 198, 151644, 77091, 198]
HOTWORDS = "Hotwords: Qwen3-ASR, Tongyi, 通义千问"
HOTWORD_IDS = [20170, 5761, 25, 1207, 16948, 18, 12, 1911, 49, 11, 50391, 38072, 11, 220, 31935, 64559, 99320, 56007]


@pytest.fixture(scope="module")
def builder(ckpt_untied):
    return PromptBuilder.from_folder(ckpt_untied)


def test_special_ids_come_from_the_tokenizer_files(builder):
    s = builder.special
    assert (s.im_start, s.im_end, s.end_of_text) == (151644, 151645, 151643)
    assert (s.audio_start, s.audio_pad, s.audio_end, s.asr_text) == (151669, 151676, 151670, 151704)
    assert s.eos == {151645, 151643}


def test_prompt_without_context(builder):
    assert builder.prompt_ids(7) == PROMPT_HEAD + [151676] * 7 + PROMPT_TAIL


def test_forced_language_suffix(builder):
    assert builder.prompt_ids(3, language="English") == PROMPT_HEAD + [151676] * 3 + PROMPT_TAIL + [11528, 6364, 151704]
    assert builder.prompt_ids(3, language="Chinese")[-3:] == [11528, 8453, 151704]


def test_context_goes_in_the_system_turn(builder):
    ids = builder.prompt_ids(2, context=HOTWORDS)
    assert ids == [151644, 8948, 198, *HOTWORD_IDS, 151645, 198, 151644, 872, 198, 151669, 151676, 151676, *PROMPT_TAIL]


def test_control_tokens_are_removed_from_context(builder):
    assert builder.prompt_ids(1, context="a<|audio_pad|>b<|im_end|>") == builder.prompt_ids(1, context="ab")


def test_decode_keeps_asr_text_and_skips_specials(builder):
    ids = [11528, 6364, 151704] + builder.encode("Hello there.") + [151645]
    assert builder.decode(ids) == "language English<asr_text>Hello there."
    assert builder.decode(builder.encode("Grüße 你好 🎙")) == "Grüße 你好 🎙"


def test_tokenizer_json_and_vocab_merges_agree(ckpt_untied, tmp_path):
    from tests.oracle.checkpoints import build_tiny_checkpoint

    with_json = build_tiny_checkpoint(tmp_path / "j", tokenizer_json=True)
    assert (with_json / "tokenizer.json").exists()
    a, b = PromptBuilder.from_folder(with_json), PromptBuilder.from_folder(ckpt_untied)
    for text in (HOTWORDS, "HelloWorld don't\n\n  x", "Grüße 你好"):
        assert a.prompt_ids(3, context=text, language="fr") == b.prompt_ids(3, context=text, language="fr")


def test_missing_tokenizer_files_are_named(ckpt_untied, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(ckpt_untied, folder)
    (folder / "merges.txt").unlink()
    with pytest.raises(ModelError, match="merges.txt: missing"):
        PromptBuilder.from_folder(folder)


def test_tokenizer_without_asr_tokens_is_rejected(ckpt_untied, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(ckpt_untied, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"] = {k: v for k, v in cfg["added_tokens_decoder"].items() if int(k) < 151669}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="no <\\|audio_start\\|> token"):
        PromptBuilder.from_folder(folder)


def test_a_tokenizer_is_read_once_while_its_files_stay_the_same(ckpt_untied, tmp_path):
    """Engines loaded again from one folder share the tokenizer read first; a changed, added or
    broken file is read again, and a failed read is not kept."""
    from dictation.asr.text.tokenizer import load_tokenizer

    folder = tmp_path / "m"
    shutil.copytree(ckpt_untied, folder)
    first, added = load_tokenizer(folder)
    again, added_again = load_tokenizer(folder)
    assert again is first and added_again == added and added_again is not added  # the list is the caller's
    assert load_tokenizer(folder, vocab_size=151936)[0] is not first  # another check of the ids: read again

    config = folder / "tokenizer_config.json"
    cfg = json.loads(config.read_text())
    cfg["added_tokens_decoder"] = {k: v for k, v in cfg["added_tokens_decoder"].items() if int(k) < 151669}
    config.write_text(json.dumps(cfg))
    changed, fewer = load_tokenizer(folder)
    assert changed is not first and len(fewer) < len(added)

    (folder / "merges.txt").write_text("not a merge list\n")
    for _ in range(2):  # each load fails again: the error is never kept, nor the tokenizer before it
        with pytest.raises(ModelError, match="merges.txt"):
            load_tokenizer(folder)


def test_the_same_tokenizer_files_in_another_folder_share_the_tokenizer_and_an_edit_is_seen(ckpt_untied, tmp_path):
    """The cache is keyed by the files' contents: a copy elsewhere (a variant's or a merged adapter's
    folder) gets the tokenizer read first, and a file edited in place keeping its size and time is
    read again."""
    import os

    from dictation.asr.text.tokenizer import load_tokenizer

    first, second = tmp_path / "a", tmp_path / "b"
    shutil.copytree(ckpt_untied, first)
    shutil.copytree(ckpt_untied, second)
    tok, _ = load_tokenizer(first)
    assert load_tokenizer(second)[0] is tok

    vocab = second / "vocab.json"
    text, times = vocab.read_text(encoding="utf-8"), os.stat(vocab)
    hello, world = tok.token_to_id("hello"), tok.token_to_id("world")  # two 5-digit ids: swapped, same size
    swapped = text.replace(f'"hello":{hello}', '"hello":X').replace(f'"world":{world}', f'"world":{hello}')
    swapped = swapped.replace('"hello":X', f'"hello":{world}')
    assert swapped != text and len(swapped.encode()) == len(text.encode())
    vocab.write_text(swapped, encoding="utf-8")
    os.utime(vocab, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert (os.stat(vocab).st_size, os.stat(vocab).st_mtime_ns) == (times.st_size, times.st_mtime_ns)
    edited, _ = load_tokenizer(second)
    assert edited is not tok and (edited.token_to_id("hello"), edited.token_to_id("world")) == (world, hello)
    assert load_tokenizer(first)[0] is tok
