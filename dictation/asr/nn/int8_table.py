"""The output head read from an int8 copy of the token table, giving the float32 head's argmax
(docs/engine.md, "The int8 output head").

On the CPU a decode step streams every weight it uses from memory once. The 0.6B's output head is
151936 x 1024 values, 297 MiB in bf16: 40 % of what a step of the int8 model reads. An
:class:`Int8Table` keeps the table as it was read (the embedding lookups and the re-scoring below
touch only a few rows of it, so the loader may leave it mapped from the file) and an int8 copy with
one scale per row (148 MiB), made at the head's first use (:meth:`Int8Table.build`).

The int8 product comes from one of three kernels, piece by piece of the table (:data:`PIECE_ROWS`
rows). Where the native CPU step's library builds (nn/native_step.py; the ``native_cpu_step`` option
not False), one hidden state goes through its int8 matrix-vector product in float32, unrounded, over
the plain pieces as one tensor: 6.7-7.5 ms for the 0.6B's head on 2 threads against 8.7-9.2 for
oneDNN's on the same machine, so the warm-up then prepacks nothing. Otherwise, after the build,
torch's int8 weight-only kernel (``_weight_int8pack_mm``) on the hidden state rounded to bf16.
:meth:`Int8Table.prepack` (the engine's warm-up, where the app pays its one-time
set-up) hands each piece over to oneDNN's int8 linear (``torch.ops.onednn.qlinear_pointwise``, 1.5-2x
faster for this shape; packing costs 0.3 s for the 0.6B, which a one-shot transcription does not win
back), dropping the piece's plain copy; the hidden state then goes in as two int8 rows, its rounding
and the remainder (:func:`two_rows`), whose integer products are exact. Every error of either product
is bounded per row (:meth:`Int8Table.error_bound`, one bound valid for all three), and every row whose
logit could be the largest within those bounds is computed again from the table in float32. So the
argmax, which greedy decoding takes, is the float32 head's over the table whichever kernel ran, and
every other logit is within its bound.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from dictation.asr.heap import Arena, file_page_dropper, release_freed_memory
from dictation.asr.nn import native_step
from dictation.asr.nn.options import DEFAULT_OPTIONS

# More candidate rows than this share of the vocabulary are not re-scored one by one: the whole head is
# then computed in float32 (only reached with logits far flatter than a trained model gives).
MAX_CANDIDATE_SHARE = 1 / 64
BUILD_ROWS = 4096  # rows quantized at a time (bounds the float32 temporaries)
PIECE_ROWS = 16384  # rows per piece of the int8 copy (each prepacked and handed over on its own)
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
        # What bounds the int8 copy's error, made by build(); not saved (the state dict is the table).
        self.register_buffer("scale", torch.empty(0, dtype=torch.bfloat16), persistent=False)
        self.register_buffer("qnorm", torch.empty(0), persistent=False)  # ||q_row||_2, float32
        # The int8 copy, a piece of PIECE_ROWS rows each: plain (torch's kernel) until prepack() puts its
        # oneDNN form in ``_packed`` and drops the plain one.
        self._plain: list[torch.Tensor | None] = []
        self._packed: list[torch.Tensor | None] = []
        # The model's options (AsrModel.spread_options): ``native_cpu_step`` not False lets one hidden
        # state take the native step's int8 product (nn/native_step.py) instead of either kernel.
        self.options = DEFAULT_OPTIONS
        self.arena: Arena | None = None  # where build() put the int8 copy for the native product
        self._whole: torch.Tensor | None = None  # that copy as one tensor, while every piece is plain

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the int8 copy (outside the module's tensors; read by ``tune.quantize.weight_bytes``)."""
        return sum(p.numel() for p in self._plain if p is not None) + sum(
            p.numel() for p in self._packed if p is not None
        )

    @property
    def built(self) -> bool:
        return bool(self._plain)

    def build(self) -> None:
        """Quantize the table, symmetric per row: ``q = round(w / s)``, ``s`` a bf16 value at least
        ``max |w| / 127`` (torch's kernel takes bf16 scales: rounding ``s`` up keeps ``|q| <= 127`` and
        the error of every weight within ``s / 2``). Done at the head's first use (0.17 s for the 0.6B
        on 2 threads), not at load: the app's warm-up pays it with its other one-time set-up."""
        # At a first transcription this runs right after the prefill: hand back what its temporaries
        # left in the C heap before the copy adds its 148 MiB (the 0.6B's peak was here).
        release_freed_memory()
        rows, width = self.weight.shape
        scale = torch.empty(rows, dtype=torch.bfloat16)
        qnorm = torch.empty(rows)
        if self.native():
            # One tensor in a fresh mapping (heap.Arena: streamed faster), its pieces views of it: the
            # native product reads it in one call (approx). oneDNN's prepacking frees the pieces one by
            # one, so they stay tensors of their own where it may run.
            self.arena = Arena(Arena.bytes_for((rows, width), torch.int8))
            whole = self.arena.take((rows, width), torch.int8)
            pieces = [whole[p : p + PIECE_ROWS] for p in range(0, rows, PIECE_ROWS)]
            self._whole = whole
        else:
            pieces = [
                torch.empty(min(PIECE_ROWS, rows - p), width, dtype=torch.int8) for p in range(0, rows, PIECE_ROWS)
            ]
        buf = torch.empty(min(rows, BUILD_ROWS), width)
        # Read whole once, here, then a few rows a step: a mapped table's pages need not stay resident.
        drop = file_page_dropper(self.weight)
        for start in range(0, rows, BUILD_ROWS):
            n = min(BUILD_ROWS, rows - start, PIECE_ROWS - start % PIECE_ROWS)
            w = buf[:n]
            w.copy_(self.weight[start : start + n])
            s32 = w.abs().amax(dim=1).div_(127)
            s = (s32 * (1 + 2.0**-7)).bfloat16()  # rounded to nearest, still >= s32 (bf16 steps are 2**-7)
            s = torch.where(s32 > 0, s, torch.ones_like(s))
            w.div_(s.float()[:, None]).round_().clamp_(-127, 127)
            offset = start % PIECE_ROWS
            pieces[start // PIECE_ROWS][offset : offset + n].copy_(w)
            scale[start : start + n] = s
            torch.linalg.vector_norm(w, dim=1, out=qnorm[start : start + n])
            if drop is not None:
                drop(self.weight[start : start + n])
        self.scale, self.qnorm = scale, qnorm
        self._plain, self._packed = pieces, [None] * len(pieces)
        self._scale32 = scale.float()

    def prepack(self) -> bool:
        """Hand every piece over to oneDNN's int8 linear where it is usable here (module docstring):
        prepacked, then its plain copy dropped. True if every piece is on oneDNN. Not where the native
        product runs (:meth:`native`): it reads the plain pieces, faster than oneDNN (module docstring)."""
        if self.native() or not onednn_head_usable():
            return False
        if not self.built:
            self.build()
        return self._prepack()

    def _prepack(self) -> bool:
        self._whole = None  # pieces are dropped below: their storage goes with the last one
        for i, plain in enumerate(self._plain):
            if plain is None:
                continue
            try:
                self._packed[i] = torch.ops.onednn.qlinear_prepack(plain, [2, self.embedding_dim])
            except RuntimeError:  # no oneDNN int8 for this piece after all: the plain pieces stay
                return False
            self._plain[i] = None
        return True

    def native(self) -> bool:
        """Whether one hidden state's product takes the native library's int8 matrix-vector product
        (float32 hidden state, no rounding of it; the options allow it and the library builds here)."""
        return self.options.native_cpu_step is not False and native_step.library() is not None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)

    def approx(self, h2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``h2d [R, width]`` float32 -> (the int8 product ``[R, rows]`` float32, the norm of the hidden
        state's rounding per row ``[R]``: the larger of its bf16 rounding and its two-row remainder,
        whichever kernel each piece ran; none for the native product, which takes it in float32)."""
        if not self.built:
            self.build()
        out = torch.empty(h2d.shape[0], self.num_embeddings)
        rounding = torch.zeros(h2d.shape[0])
        if h2d.shape[0] == 1 and self._whole is not None and self.native():
            # Every piece plain, consecutive rows of one tensor (build): read in one call.
            native_step.int8_gemv(self._whole, self._scale32, h2d[0].contiguous(), out=out[0])
            return out, rounding
        h16 = rows = None
        for i, (plain, packed) in enumerate(zip(self._plain, self._packed, strict=True)):
            lo = i * PIECE_ROWS
            n = min(PIECE_ROWS, self.num_embeddings - lo)
            if packed is None:
                if h16 is None:
                    h16 = h2d.bfloat16()
                    rounding = torch.maximum(rounding, (h2d - h16.float()).norm(dim=1))
                out[:, lo : lo + n] = torch._weight_int8pack_mm(h16, plain, self.scale[lo : lo + n])
                continue
            if rows is None:
                rows, steps, remainder = two_rows(h2d)
                rounding = torch.maximum(rounding, remainder)
            y = torch.ops.onednn.qlinear_pointwise(
                rows, 1.0, 128, packed, self._scale32[lo : lo + n], _zeros(n), None, 1.0, 0,
                torch.float32, "none", [], "",
            )  # fmt: skip
            y = y.view(h2d.shape[0], 2, n)
            out[:, lo : lo + n] = torch.addcmul(y[:, 0] * steps[:, :1], y[:, 1], steps[:, 1:])
        return out, rounding

    def error_bound(self, h: torch.Tensor, approx: torch.Tensor, rounding: float | torch.Tensor = 0.0) -> torch.Tensor:
        """For one hidden state ``h [width]`` (float32), the int8 product ``approx [rows]`` and the norm of
        ``h``'s rounding in it (:meth:`approx`): a bound per row on |approx - h . w_row|, doubled for
        safety. With ``s`` the row's scale and ``q`` its integers: the weights' rounding moves a logit
        by at most ``s / 2 * |h|_1``; the hidden state's by ``s |q|_2 * rounding``; float32
        accumulation over ``width`` terms (torch's kernel) by ``width * 2**-24 * s |q|_2 |h|_2``; a bf16
        result (torch's kernel) by ``2**-8 |approx|``."""
        width = h.shape[-1]
        per_norm = float(rounding) + width * 2.0**-24 * float(h.norm()) * 1.01
        bound = self._scale32 * ((0.5 + _ROUND_MARGIN) * float(h.abs().sum()))
        bound.addcmul_(self._scale32, self.qnorm, value=per_norm)
        bound.add_(approx.abs(), alpha=2.0**-8)
        return bound.mul_(2)

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """``h [..., width]`` -> logits ``[..., rows]`` in float32: the int8 product, with every row whose
        logit could be the largest computed again in float32 (see the module docstring)."""
        h2d = h.reshape(-1, self.embedding_dim).float()
        if not bool(torch.isfinite(h2d).all()):
            return self._exact(h2d).view(*h.shape[:-1], -1)
        approx, rounding = self.approx(h2d)
        limit = max(1, int(self.num_embeddings * MAX_CANDIDATE_SHARE))
        for r in range(h2d.shape[0]):
            row = approx[r]
            bound = self.error_bound(h2d[r], row, rounding[r])
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


def two_rows(h2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``h2d [R, width]`` float32 -> (uint8 ``[2R, width]``: per row its rounding to 255 levels and the
    remainder's, both offset by 128; the steps ``[R, 2]``; the norm of what is left ``[R]``). Row r is
    ``steps[r, 0] * (rows[2r] - 128) + steps[r, 1] * (rows[2r + 1] - 128)`` to within half the second
    step per value: a 16-bit fixed-point hidden state whose products with int8 weights are exact."""
    top = h2d.abs().amax(dim=1, keepdim=True)
    first = torch.where(top > 0, top / 127, torch.ones_like(top))
    second = first / 254
    q1 = torch.round(h2d / first)
    q2 = torch.round((h2d - q1 * first) / second).clamp_(-127, 127)
    left = (h2d.double() - (q1.double() * first.double() + q2.double() * second.double())).norm(dim=1)
    rows = torch.stack((q1, q2), dim=1).reshape(-1, h2d.shape[1]).add_(128).to(torch.uint8)
    return rows, torch.cat((first, second), dim=1), (left * (1 + 2.0**-20)).float()


@functools.cache
def _zeros(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int32)


def _within_bound(head: Int8Table, table: torch.Tensor, h: torch.Tensor) -> bool:
    approx, rounding = head.approx(h[None])
    exact = table.double() @ h.double()
    bound = head.error_bound(h, approx[0], rounding[0]).double()
    return bool(((approx[0].double() - exact).abs() <= bound / 4).all())


def _probe_table() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(13)
    return torch.randn(512, 256, generator=gen).div_(16).bfloat16(), torch.randn(256, generator=gen) * 4


@functools.cache
def int8_head_usable() -> bool:
    """Whether torch's int8 weight-only kernel runs on this CPU with bf16 activations and stays within
    :meth:`Int8Table.error_bound` (a quarter of it); checked once on a small random table."""
    table, h = _probe_table()
    try:
        return _within_bound(Int8Table(table), table, h)
    except RuntimeError:
        return False


@functools.cache
def onednn_head_usable() -> bool:
    """Whether oneDNN's int8 linear runs here on prepacked pieces and stays within the bound, as
    :func:`int8_head_usable` checks torch's kernel."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_prepack")):
        return False
    table, h = _probe_table()
    try:
        head = Int8Table(table)
        head.build()
        return head._prepack() and _within_bound(head, table, h)
    except (RuntimeError, AttributeError):
        return False


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
