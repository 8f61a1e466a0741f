"""The int8 output head (nn/int8_table.py): its error bound holds with either kernel (torch's, and
oneDNN's on prepacked pieces), its argmax is the float32 head's even where the int8 product alone
picks another row, and the engine gives a quantized model computing in bf16 on the CPU this head, with
the table left as the file's pages."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dictation.asr import AsrEngine, EngineOptions
from dictation.asr.nn.compact import expand
from dictation.asr.nn.int8_table import Int8Table, int8_head_usable, onednn_head_usable, two_rows
from dictation.asr.nn.options import ModelOptions
from dictation.bench.ours import decode_weight_bytes
from tests.asr.mapped import mapped_files
from tests.oracle import synth_audio

pytestmark = pytest.mark.skipif(not int8_head_usable(), reason="no int8 weight-only kernel on this CPU")


KERNELS = [
    "torch",
    pytest.param("onednn", marks=pytest.mark.skipif(not onednn_head_usable(), reason="no oneDNN")),
    "native",  # the native CPU step's int8 product (nn/native_step.py; tests/asr/test_native_step.py builds it)
]
NO_NATIVE = ModelOptions(native_cpu_step=False)


def _head(table: torch.Tensor, kernel: str) -> Int8Table:
    """The head with every piece on ``kernel``: torch's int8 kernel, oneDNN's once prepacked, or the
    native product (which the prepacking leaves alone)."""
    head = Int8Table(table)
    if kernel != "native":
        head.options = NO_NATIVE
    head.build()
    if kernel != "torch":
        assert head.prepack() is (kernel == "onednn")
    assert head.native() is (kernel == "native")
    assert all(p is None for p in head._plain) is (kernel == "onednn")
    return head


def _table(rows: int = 4096, width: int = 256, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # rows of very different magnitudes, so the per-row scales differ by 100x
    scale = torch.logspace(-2, 0, rows)[torch.randperm(rows, generator=gen)]
    return (torch.randn(rows, width, generator=gen) * scale[:, None] / 8).bfloat16()


def _hidden(width: int, seed: int, outlier: float = 0.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(width, generator=gen) * 3
    if outlier:
        h[seed % width] = outlier  # one large channel, as trained models have
    return h.bfloat16().float()


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_error_bound_holds_for_every_row(kernel):
    table = _table(rows=40000)  # three pieces, the last one short
    head = _head(table, kernel)
    for seed in range(12):
        h = _hidden(table.shape[1], seed, outlier=100.0 if seed % 2 else 0.0)
        if seed % 3 == 0:
            h = h + torch.randn(h.shape, generator=torch.Generator().manual_seed(seed)) * 1e-3  # not bf16
        approx, rounding = head.approx(h[None])
        exact = table.double() @ h.double()
        err = (approx[0].double() - exact).abs()
        bound = head.error_bound(h, approx[0], rounding[0]).double()
        assert bool((err <= bound / 2).all()), float((err / bound).max())  # the bound is doubled for safety
        assert float(err.max()) > 0  # the int8 product is not exact: the bound has work to do
    assert bool((head.scale.float() * 127 >= table.float().abs().amax(dim=1)).all())


def test_two_rows_hold_the_hidden_state_to_half_the_second_step():
    gen = torch.Generator().manual_seed(2)
    h = torch.randn(3, 512, generator=gen) * torch.tensor([[1.0], [300.0], [1e-3]])
    rows, steps, left = two_rows(h)
    assert rows.dtype == torch.uint8 and rows.shape == (6, 512)
    q = rows.view(3, 2, 512).double() - 128
    held = q[:, 0] * steps[:, :1].double() + q[:, 1] * steps[:, 1:].double()
    assert bool(((h.double() - held).abs() <= steps[:, 1:].double() / 2 * (1 + 1e-6)).all())
    assert torch.allclose((h.double() - held).norm(dim=1), left.double(), rtol=1e-4)


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_argmax_is_the_float32_heads_where_the_int8_product_alone_picks_another_row(kernel):
    """Eight near-equal rows far ahead of the rest, their logits closer than the int8 rounding: the int8
    product alone picks the wrong one in many trials (the test can tell), the head never does, and
    it re-scores those eight only. A table of rows that are all alike takes the whole float32 head."""
    width, rows = 256, 2048
    wrong_alone = 0
    for trial in range(40):
        gen = torch.Generator().manual_seed(trial)
        h = _hidden(width, 100 + trial, outlier=40.0 if trial % 3 == 0 else 0.0)
        t = torch.randn(rows, width, generator=gen) / 16
        near = torch.randperm(rows, generator=gen)[:8]
        t[near] = (h / h.norm() * 0.5)[None] + torch.randn(8, width, generator=gen) * 1e-3
        t = t.bfloat16()
        head = _head(t, kernel)
        exact = t.double() @ h.double()
        best = int(exact.argmax())
        approx, rounding = head.approx(h[None])
        approx = approx[0]
        bound = head.error_bound(h, approx, rounding[0])
        assert set((approx + bound >= (approx - bound).max()).nonzero().view(-1).tolist()) == set(near.tolist())
        logits = head.project(h.bfloat16()[None])[0]
        assert int(logits.argmax()) == best, trial
        assert torch.equal(logits[near], (t[near].float() @ h).float())
        assert bool(((logits.double() - exact).abs() <= bound.double()).all())
        wrong_alone += int(approx.argmax()) != best
    assert wrong_alone >= 5
    alike = (torch.randn(width) / 8 + torch.randn(rows, width) * 1e-3).bfloat16()  # every row a candidate
    h = _hidden(width, 7)
    logits = _head(alike, kernel).project(h.bfloat16()[None])[0]
    assert torch.allclose(logits.double(), alike.double() @ h.double(), rtol=1e-5, atol=1e-5)
    assert int(logits.argmax()) == int((alike.double() @ h.double()).argmax())


def test_lookups_are_the_table_and_expand_gives_the_modules_back():
    table = _table(rows=300, width=64)
    head = Int8Table(table)
    ids = torch.tensor([[0, 5, 299]])
    assert torch.equal(head(ids), table[ids])
    assert set(head.state_dict()) == {"weight"}  # the int8 copy is rebuilt, never saved
    holder = nn.Module()
    holder.decoder = nn.Module()
    holder.decoder.norm = nn.LayerNorm(64, dtype=torch.bfloat16)
    holder.decoder.embed_tokens = head
    holder.lm_head = Int8Table(table)
    assert expand(holder) == 2
    assert type(holder.decoder.embed_tokens) is nn.Embedding and type(holder.lm_head) is nn.Linear
    assert torch.equal(holder.decoder.embed_tokens.weight, table)
    assert torch.equal(holder.lm_head.weight, table)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads Linux's /proc/self/maps")
@pytest.mark.parametrize("tied", [True, False])
def test_a_prepared_int8_model_in_bf16_reads_its_head_from_an_int8_copy(ckpt_tied, ckpt_untied, tmp_path, tied):
    """A prepared int8 folder on the CPU computing in bf16 (forced here: CPUs without bf16 instructions
    compute in float32 and keep their float16 head): the head (the table when tied) is an Int8Table
    whose table is the file's pages, and the transcript is the one the float head gives, before and
    after the warm-up moves the head to oneDNN."""
    from dictation.asr.tune.writers import write_quantized_folder

    src = shutil.copytree(ckpt_tied if tied else ckpt_untied, tmp_path / "bf16")
    path = src / "model.safetensors"
    tensors = load_file(str(path))
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()}, str(path))
    out = write_quantized_folder(src, tmp_path / "int8", "int8")
    audio = synth_audio(3.0, seed=4)
    # torch's step and head kernels (the native ones: tests/asr/test_native_step.py)
    options = EngineOptions(model=str(out), device="cpu", model_options=replace(NO_NATIVE, cpu_bf16_compute=True))
    texts, step_bytes = {}, {}
    for int8_head in (True, False):
        engine = AsrEngine(replace(options, model_options=replace(options.model_options, int8_head=int8_head)))
        engine.prepare()
        model = engine.model
        head = model.decoder.embed_tokens if tied else model.lm_head
        assert isinstance(head, Int8Table) is int8_head
        if int8_head:
            assert mapped_files(head.weight.data_ptr()) == {str(out / "model.safetensors")}
            assert head.weight.dtype == torch.bfloat16 and not head.built  # made at its first use
        result = engine.transcribe(audio, language="English", max_new_tokens=12)
        texts[int8_head] = result.token_ids
        if int8_head:
            assert head.nbytes == head.weight.numel()
        if int8_head and onednn_head_usable():  # the app's warm-up hands the head over to oneDNN
            engine.warm_up()
            assert all(p is None for p in head._plain) and all(p is not None for p in head._packed)
            assert engine.transcribe(audio, language="English", max_new_tokens=12).token_ids == result.token_ids
        step_bytes[int8_head] = decode_weight_bytes(model)
        rows, width = model.output_weight.shape
    assert texts[True] == texts[False] and len(texts[True]) > 3
    # what a step reads: the head's int8 copy and bf16 scales instead of its bf16 table
    assert step_bytes[False] - step_bytes[True] == rows * width * 2 - (rows * width + rows * 2)


def _resident_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
def test_a_mapped_tables_pages_leave_the_resident_set_with_their_bytes_kept(tmp_path):
    """``heap.file_page_dropper``, which the int8 head's build uses on its table: a mapped tensor's pages
    stop counting as resident and read back the same; a copy, or a mapping written to, is refused
    (``MADV_DONTNEED`` would zero the one and lose the other's changes)."""
    from dictation.asr.checkpoints.tensor_reader import TensorReader
    from dictation.asr.heap import file_page_dropper

    table = torch.randn(4096, 1024)  # 16 MiB
    save_file({"t": table}, str(tmp_path / "t.safetensors"))
    with TensorReader(tmp_path / "t.safetensors") as f:
        mapped = f.map_run(["t"]).view(4096, 1024)
    assert torch.equal(mapped, table)  # every page read: resident
    before = _resident_bytes()
    drop = file_page_dropper(mapped)
    assert drop is not None
    dropped = sum(drop(mapped[i : i + 1024]) for i in range(0, 4096, 1024))
    assert dropped >= table.nbytes - 4 * 4096 * 2  # whole pages of each piece
    assert before - _resident_bytes() >= table.nbytes // 2
    assert torch.equal(mapped, table)  # read back from the page cache
    assert file_page_dropper(table) is None  # the process's own memory
    mapped[0, 0] = 1.0  # a written page is this process's own now
    assert file_page_dropper(mapped) is None
