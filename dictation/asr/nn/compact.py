"""Float weights held in half the memory on the CPU, computing what the float32 model computes.

Checkpoints are stored in bf16, and a CPU model computes in float32, so every float32 weight it holds
is a bf16 value widened: half its bytes carry nothing. Where float16 holds a weight exactly (every
bf16 value of a trained weight, except magnitudes under float16's normal range, 2**-14, which round
by at most 2**-25), the weight is held in float16 instead (docs/engine.md, "CPU memory"):

- :class:`HalfLinear` (the audio encoder's linear layers): fbgemm's float16 GEMM, float32 activations
  in and out, the weight widened in registers. As fast as float32 for the encoder's rows, and faster
  for one row (half the bytes read).
- :class:`HalfTable` (the token embedding and the output head, one table when they are tied):
  a looked-up row is widened exactly; the head is a float16 matrix product whose error is bounded, and
  every token whose logit could be the largest within that bound is computed again in float32, so the
  argmax (what greedy decoding takes) is the float32 head's, and every logit is within the bound
  (about 1e-3 of the logits' scale) of it.

Weights that float16 does not hold (a float32 checkpoint's) stay as they are. Used where the engine
computes in float32 on the CPU (``checkpoints/safetensors.py`` compacts each module as it is read, so
its float32 copy never outlives its own load); :func:`expand` gives float32 modules back (adapters are
merged into float32 weights).
"""

from __future__ import annotations

import functools
import logging
import math

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

# Largest rounding error accepted when a weight is held in float16: the subnormal range's half step.
SUBNORMAL_ERROR = 2.0**-25
# More candidate rows than this (of the vocabulary) are not re-scored one by one: the whole head is then
# computed in float32 (only reached with logits far flatter than any model gives).
MAX_CANDIDATE_SHARE = 1 / 64
CHUNK = 1 << 20  # values per piece when a whole table is checked or measured


def holds_in_half(weight: torch.Tensor) -> bool:
    """Whether float16 holds every value of ``weight`` to within :data:`SUBNORMAL_ERROR` (and no value
    overflows it)."""
    if not weight.is_floating_point() or weight.device.type != "cpu":
        return False
    if weight.dtype in (torch.float16, torch.bfloat16):  # bf16 -> float16: see the module docstring
        return in_half_range(weight)
    if weight.dtype != torch.float32:
        return False
    # A float32 value float16 holds this closely is a bf16 value (its low 16 bits zero) within float16's
    # range: its 8 significant bits fit float16's 11, and below 2**-14 it rounds by at most 2**-25.
    flat = weight.detach().reshape(-1).view(torch.int32)
    for start in range(0, flat.numel(), CHUNK):  # in pieces: no full-size temporaries at a load's peak
        if bool(torch.bitwise_and(flat[start : start + CHUNK], 0xFFFF).any()):
            return False
    return in_half_range(weight)


def in_half_range(weight: torch.Tensor) -> bool:
    """Whether no value of ``weight`` overflows float16 (one pass, no temporary)."""
    low, high = torch.aminmax(weight.detach())
    return bool(low > -65504) and bool(high < 65504)


@functools.cache
def fbgemm_half_usable() -> bool:
    """Whether fbgemm's float16 linear runs here and computes float32 results of the float16 weight
    (checked once on a small problem; False where torch was built without fbgemm, e.g. ARM)."""
    gen = torch.Generator().manual_seed(7)
    weight = (torch.randn(48, 96, generator=gen) / 8).half().float()
    bias = torch.randn(48, generator=gen)
    x = torch.randn(5, 96, generator=gen)
    try:
        packed = torch.ops.quantized.linear_prepack_fp16(weight, bias)
        got = torch.ops.quantized.linear_dynamic_fp16(x, packed)
    except (RuntimeError, AttributeError) as exc:
        log.info("no float16 linear on this CPU (%s); float weights stay float32", exc)
        return False
    want = F.linear(x.double(), weight.double(), bias.double())
    return bool(((got.double() - want).abs() <= 1e-4 * want.abs().max()).all())


class HalfLinear(nn.Module):
    """A float32 ``nn.Linear`` whose weight is held as float16, packed for fbgemm. Its state dict is the
    float32 layer's (``weight``, ``bias``); off the CPU it computes through a widened copy."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.has_bias = linear.bias is not None
        weight = linear.weight.detach()
        bias = linear.bias.detach().float() if self.has_bias else None
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), bias)
        self.nbytes = weight.numel() * 2 + (bias.numel() * 4 if bias is not None else 0)

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, bias) in float32."""
        weight, bias = torch.ops.quantized.linear_unpack_fp16(self.packed)
        return weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            weight, bias = self.unpacked()
            return F.linear(x, weight.to(x), None if bias is None else bias.to(x))
        x2d = x.reshape(-1, self.in_features)
        y = torch.ops.quantized.linear_dynamic_fp16(x2d.float().contiguous(), self.packed)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        weight, bias = self.unpacked()
        destination[prefix + "weight"] = weight
        if self.has_bias:
            destination[prefix + "bias"] = bias

    def to_linear(self) -> nn.Linear:
        weight, bias = self.unpacked()
        linear = nn.Linear(self.in_features, self.out_features, bias=self.has_bias, device="meta")
        linear.weight = nn.Parameter(weight, requires_grad=False)
        if self.has_bias:
            linear.bias = nn.Parameter(bias, requires_grad=False)
        return linear

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.has_bias}, float16"


@functools.cache
def half_matmul_usable() -> bool:
    """Whether a float16 matrix product on this CPU stays within :meth:`HalfTable.error_bound` (it does
    where it accumulates in float32, as oneDNN does on x86); checked once on a 1024-wide problem."""
    gen = torch.Generator().manual_seed(11)
    table = (torch.randn(512, 1024, generator=gen) / 32).half()
    h = torch.randn(3, 1024, generator=gen) * 4
    try:
        approx = F.linear(h.half(), table).float()
    except RuntimeError as exc:
        log.info("no float16 matrix product on this CPU (%s); the output head stays float32", exc)
        return False
    exact = (h.double() @ table.double().T).float()
    norms = table.float().norm(dim=1).max()
    bound = HalfTable.error_bound(h, norms, approx)
    return bool(((approx - exact).abs() <= bound[:, None] / 4).all())


class HalfTable(nn.Module):
    """A float table ``[rows, width]`` held in float16: an embedding (:meth:`forward`, rows widened to
    ``dtype``) and, tied or not, the output head (:meth:`project`)."""

    def __init__(self, table: torch.Tensor, dtype: torch.dtype = torch.float32, max_abs: float | None = None) -> None:
        """``max_abs``: the table's largest magnitude if known; its rows' norms are then bounded by
        ``sqrt(width) * max_abs`` (a looser bound: a few more rows re-scored) instead of measured."""
        super().__init__()
        self.num_embeddings, self.embedding_dim = table.shape
        if max_abs is not None:
            self.row_norm = math.sqrt(self.embedding_dim) * max_abs
        else:
            rows = max(1, CHUNK // max(1, self.embedding_dim))
            norms = [table[i : i + rows].float().norm(dim=1).max() for i in range(0, self.num_embeddings, rows)]
            self.row_norm = float(torch.stack(norms).max()) if norms else 0.0
        self.register_buffer("weight", table.detach().to(torch.float16))
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight).to(self.dtype)

    @staticmethod
    def error_bound(h: torch.Tensor, row_norm: torch.Tensor | float, approx: torch.Tensor) -> torch.Tensor:
        """Per row of ``h [R, width]``: a bound on |float16 product - float32 product| for every logit.
        Rounding ``h`` to float16 moves a logit by at most 2**-11 * |w| * |h| (Cauchy-Schwarz), float32
        accumulation by ``width`` * 2**-24 * |w| * |h|, rounding the result by 2**-11 of its size;
        doubled for safety."""
        width = h.shape[-1]
        hn = h.float().norm(dim=-1)
        return 2 * ((2.0**-11 + width * 2.0**-24) * row_norm * hn + 2.0**-11 * approx.abs().amax(dim=-1))

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """``h [..., width]`` -> logits ``[..., rows]`` in float32: the float16 product, with every row
        whose logit could be the largest computed again in float32 (see the module docstring)."""
        h2d = h.reshape(-1, self.embedding_dim).float()
        if not bool(h2d.abs().max() < 6e4) or not half_matmul_usable():
            return self._exact(h2d).view(*h.shape[:-1], -1)
        logits = F.linear(h2d.half(), self.weight).float()
        bound = self.error_bound(h2d, self.row_norm, logits)
        limit = max(1, int(self.num_embeddings * MAX_CANDIDATE_SHARE))
        for r in range(h2d.shape[0]):
            row = logits[r]
            candidates = (row >= row.max() - 2 * bound[r]).nonzero().view(-1)
            if candidates.numel() > limit:
                row.copy_(self._exact(h2d[r : r + 1]).view(-1))
            else:
                row[candidates] = self.weight[candidates].float() @ h2d[r]
        return logits.view(*h.shape[:-1], -1)

    def _exact(self, h2d: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
        out = torch.empty(h2d.shape[0], self.num_embeddings, dtype=torch.float32, device=h2d.device)
        for start in range(0, self.num_embeddings, chunk):
            out[:, start : start + chunk] = h2d @ self.weight[start : start + chunk].float().T
        return out

    def to_embedding(self) -> nn.Embedding:
        table = self.weight.to(self.dtype)
        return nn.Embedding(self.num_embeddings, self.embedding_dim, _weight=table).requires_grad_(False)

    def to_linear(self) -> nn.Linear:
        linear = nn.Linear(self.embedding_dim, self.num_embeddings, bias=False, device="meta")
        linear.weight = nn.Parameter(self.weight.to(self.dtype), requires_grad=False)
        return linear

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, float16"


def compactable(model: nn.Module) -> dict[str, list[str]]:
    """Module name -> the names of its tensors, for the modules :func:`compact_module` may compact: the
    audio encoder's linear layers, the embedding table and an untied output head."""
    out: dict[str, list[str]] = {}
    for name, module in model.audio_tower.named_modules(prefix="audio_tower"):
        if type(module) is nn.Linear:
            out[name] = [f"{name}.{t}" for t, _ in module.named_parameters()]
    out["decoder.embed_tokens"] = ["decoder.embed_tokens.weight"]
    if getattr(model, "lm_head", None) is not None and type(model.lm_head) is nn.Linear:
        out["lm_head"] = ["lm_head.weight"]
    return out


def compact_module(
    model: nn.Module,
    name: str,
    *,
    exact: bool | None = None,
    max_abs: float | None = None,
    weight: torch.Tensor | None = None,
) -> bool:
    """Hold module ``name`` of ``model`` (one of :func:`compactable`) in float16 if float16 holds its
    weight exactly and this CPU has the kernels; True if it was replaced. ``exact``: whether float16
    holds the weight, when the caller knows (a bf16 weight of known ``max_abs``, its largest
    magnitude); None: checked here. ``weight``: the weight's values as read, when they are not in the
    module (a table is then never widened to float32: the loader's peak)."""
    module = model.get_submodule(name)
    if module.weight.dtype != torch.float32:
        return False
    weight = module.weight if weight is None else weight
    if exact is None:
        exact = holds_in_half(weight)
    if not exact:
        return False
    if type(module) is nn.Linear and name.startswith("audio_tower."):
        if not fbgemm_half_usable():
            return False
        if weight is not module.weight:
            module.weight = nn.Parameter(weight.float(), requires_grad=False)
        new: nn.Module = HalfLinear(module)
    elif name in ("decoder.embed_tokens", "lm_head"):
        if not half_matmul_usable():
            return False
        new = HalfTable(weight, module.weight.dtype, max_abs=max_abs)
    else:
        return False
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)
    return True


def expand(model: nn.Module) -> int:
    """Give every compacted module of ``model`` back as its float32 module; returns how many."""
    from dictation.asr.nn.int8_table import Int8Table

    found = [(n, m) for n, m in model.named_modules() if isinstance(m, HalfLinear | HalfTable | Int8Table)]
    for name, module in found:
        if isinstance(module, Int8Table):  # the table as read, in the model's dtype; no int8 copy
            dtype = model.decoder.norm.weight.dtype
            new = module.to_linear(dtype) if name == "lm_head" else module.to_embedding(dtype)
        elif isinstance(module, HalfLinear):
            new: nn.Module = module.to_linear()
        elif name == "lm_head":
            new = module.to_linear()
        else:
            new = module.to_embedding()
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, new)
    return len(found)


def is_compact(model: nn.Module) -> bool:
    return any(isinstance(m, HalfLinear | HalfTable) for m in model.modules())
