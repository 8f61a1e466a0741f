"""The output head read from an int8 copy of the token table, giving the float32 head's argmax
(docs/engine.md, "The int8 output head").

On the CPU a decode step streams every weight it uses from memory once. The 0.6B's output head is
151936 x 1024 values, 297 MiB in bf16: 40 % of what a step of the int8 model reads. An
:class:`Int8Table` keeps the table as it was read (the embedding lookups and the re-scoring below
touch only a few rows of it, so the loader may leave it mapped from the file) and an int8 copy with
one scale per row (148 MiB), made once at load.

The head is torch's int8 weight-only kernel on the hidden state rounded to bf16. Every error of that
product is bounded per row (:meth:`Int8Table.error_bound`), and every row whose logit could be the
largest within those bounds is computed again from the table in float32. So the argmax, which greedy
decoding takes, is the float32 head's over the table, and every other logit is within its bound.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from dictation.asr.heap import file_page_dropper

# More candidate rows than this share of the vocabulary are not re-scored one by one: the whole head is
# then computed in float32 (only reached with logits far flatter than a trained model gives).
MAX_CANDIDATE_SHARE = 1 / 64
BUILD_ROWS = 4096  # rows quantized at a time (bounds the float32 temporaries)
_ROUND_MARGIN = 2.0**-16  # |w / s - q| may exceed one half by float32 division's rounding (127 * 2**-24)


class Int8Table(nn.Module):
    """A token table ``[rows, width]`` (``weight``, as read) and its int8 copy: an embedding
    (:meth:`forward`) and, tied or not, the output head (:meth:`project`)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        if weight.dim() != 2 or weight.device.type != "cpu":
            raise ValueError(f"an int8 table needs a 2-D CPU table, got {tuple(weight.shape)} on {weight.device}")
        self.num_embeddings, self.embedding_dim = weight.shape
        self.register_buffer("weight", weight.detach())
        # The int8 copy and what bounds its error, made by build(); not saved (the state dict is the table).
        self.register_buffer("qweight", torch.empty(0, dtype=torch.int8), persistent=False)
        self.register_buffer("scale", torch.empty(0, dtype=torch.bfloat16), persistent=False)
        self.register_buffer("qnorm", torch.empty(0), persistent=False)  # ||q_row||_2, float32
        self.build()

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    def build(self) -> None:
        """Quantize the table, symmetric per row: ``q = round(w / s)``, ``s`` a bf16 value at least
        ``max |w| / 127`` (the kernel takes bf16 scales: rounding ``s`` up keeps ``|q| <= 127`` and the
        error of every weight within ``s / 2``)."""
        rows, width = self.weight.shape
        q = torch.empty(rows, width, dtype=torch.int8)
        scale = torch.empty(rows, dtype=torch.bfloat16)
        qnorm = torch.empty(rows)
        buf = torch.empty(min(rows, BUILD_ROWS), width)
        # Read whole once, here, then a few rows a step: a mapped table's pages need not stay resident.
        drop = file_page_dropper(self.weight)
        for start in range(0, rows, BUILD_ROWS):
            w = buf[: min(BUILD_ROWS, rows - start)]
            w.copy_(self.weight[start : start + w.shape[0]])
            s32 = w.abs().amax(dim=1).div_(127)
            s = (s32 * (1 + 2.0**-7)).bfloat16()  # rounded to nearest, still >= s32 (bf16 steps are 2**-7)
            s = torch.where(s32 > 0, s, torch.ones_like(s))
            w.div_(s.float()[:, None]).round_().clamp_(-127, 127)
            q[start : start + w.shape[0]].copy_(w)
            scale[start : start + w.shape[0]] = s
            torch.linalg.vector_norm(w, dim=1, out=qnorm[start : start + w.shape[0]])
            if drop is not None:
                drop(self.weight[start : start + w.shape[0]])
        self.qweight, self.scale, self.qnorm = q, scale, qnorm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)

    def error_bound(self, h: torch.Tensor, approx: torch.Tensor) -> torch.Tensor:
        """For one hidden state ``h [width]`` (float32) and the kernel's logits ``approx [rows]``: a bound
        per row on |approx - h . w_row|, doubled for safety. With ``s`` the row's scale, ``q`` its
        integers and ``h'`` = bf16(h): the weights' rounding moves a logit by at most
        ``s / 2 * |h|_1``; rounding ``h`` by ``s |q|_2 |h - h'|_2``; float32 accumulation over
        ``width`` terms by ``width * 2**-24 * s |q|_2 |h'|_2``; the bf16 result by ``2**-8 |approx|``."""
        width = h.shape[-1]
        h16 = h.bfloat16().float()
        per_norm = float((h - h16).norm()) + width * 2.0**-24 * float(h16.norm()) * 1.01
        scale = self.scale.float()
        bound = scale * ((0.5 + _ROUND_MARGIN) * float(h.abs().sum()))
        bound.addcmul_(scale, self.qnorm, value=per_norm)
        bound.add_(approx.abs(), alpha=2.0**-8)
        return bound.mul_(2)

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """``h [..., width]`` -> logits ``[..., rows]`` in float32: the int8 product, with every row whose
        logit could be the largest computed again in float32 (see the module docstring)."""
        h2d = h.reshape(-1, self.embedding_dim).float()
        if not bool(torch.isfinite(h2d).all()):
            return self._exact(h2d).view(*h.shape[:-1], -1)
        approx = torch._weight_int8pack_mm(h2d.bfloat16(), self.qweight, self.scale).float()
        limit = max(1, int(self.num_embeddings * MAX_CANDIDATE_SHARE))
        for r in range(h2d.shape[0]):
            row = approx[r]
            bound = self.error_bound(h2d[r], row)
            floor = (row - bound).max()
            candidates = (row + bound >= floor).nonzero().view(-1)
            if candidates.numel() > limit:
                row.copy_(self._exact(h2d[r : r + 1]).view(-1))
            else:
                row[candidates] = self.weight.index_select(0, candidates).float() @ h2d[r]
        return approx.view(*h.shape[:-1], -1)

    def _exact(self, h2d: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
        out = torch.empty(h2d.shape[0], self.num_embeddings, dtype=torch.float32)
        for start in range(0, self.num_embeddings, chunk):
            out[:, start : start + chunk] = h2d @ self.weight[start : start + chunk].float().T
        return out

    def to_embedding(self, dtype: torch.dtype) -> nn.Embedding:
        table = self.weight.to(dtype)
        return nn.Embedding(self.num_embeddings, self.embedding_dim, _weight=table).requires_grad_(False)

    def to_linear(self, dtype: torch.dtype) -> nn.Linear:
        linear = nn.Linear(self.embedding_dim, self.num_embeddings, bias=False, device="meta")
        linear.weight = nn.Parameter(self.weight.to(dtype), requires_grad=False)
        return linear

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.weight.dtype} with an int8 head"


@functools.cache
def int8_head_usable() -> bool:
    """Whether torch's int8 weight-only kernel runs on this CPU with bf16 activations and stays within
    :meth:`Int8Table.error_bound` (a quarter of it); checked once on a small random table."""
    gen = torch.Generator().manual_seed(13)
    table = torch.randn(512, 256, generator=gen).div_(16).bfloat16()
    h = torch.randn(256, generator=gen) * 4
    try:
        head = Int8Table(table)
        approx = torch._weight_int8pack_mm(h.bfloat16()[None], head.qweight, head.scale).float()[0]
    except RuntimeError:
        return False
    exact = table.double() @ h.double()
    return bool(((approx.double() - exact).abs() <= head.error_bound(h, approx).double() / 4).all())


def use_int8_head(model: nn.Module) -> bool:
    """Give ``model`` (an AsrModel on the CPU computing in bf16) an int8 output head: its table
    (tied) or its head (untied) becomes an :class:`Int8Table` holding the same tensor. True if done."""
    if not int8_head_usable():
        return False
    name = "decoder.embed_tokens" if model.lm_head is None else "lm_head"
    module = model.get_submodule(name)
    if isinstance(module, Int8Table):
        return True
    if type(module) not in (nn.Embedding, nn.Linear) or module.weight.device.type != "cpu":
        return False
    new = Int8Table(module.weight.data)
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent), leaf, new)
    return True
