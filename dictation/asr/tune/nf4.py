"""4-bit NormalFloat (NF4) with double quantization, as in the QLoRA paper (Dettmers et al. 2023).

A weight is cut into blocks of :data:`BLOCK` (64) values in row-major order (the last block padded
with zeros). Each block is divided by its absolute maximum and every value replaced by the index of
the nearest of the 16 NF4 levels (:data:`NF4_CODE`: quantiles of N(0, 1) scaled to [-1, 1], with an
exact zero; the table bitsandbytes uses), two indices a byte. Dequantized, a value is
``NF4_CODE[index] * absmax``; its error is at most half the widest gap between neighbouring levels
times its block's absmax (plus, with double quantization, the error of that absmax).

Double quantization (the paper's section 3): the fp32 block scales are themselves quantized. Their
mean is subtracted (stored as one fp32 number per tensor), and the centred scales are quantized in
blocks of :data:`SCALE_BLOCK` (256): each divided by its block's absolute maximum (one fp32
second-level scale per block) and replaced by the index of the nearest value of the signed dynamic
8-bit code (:func:`dynamic_code`, the paper's "8-bit floats": fine near zero, coarse near one; the
code bitsandbytes uses, so our scales are bit for bit theirs — tests/asr/test_nf4_bnb.py). Storage
per parameter: 4 bits + 8/64 + 32/(64*256) = 4.127 bits, against 4 + 32/64 = 4.5 with fp32 scales
(``double_quant=False``).

:class:`NF4Linear` is a frozen linear layer on such a weight: its forward dequantizes the weight
(in the input's dtype) and multiplies, or uses the dequantized weight it was told to keep
(:meth:`NF4Linear.keep_dequantized`: the trainer's choice where it fits in memory); gradients
reach the input (a LoRA branch above it) and no weight, as QLoRA's frozen base.
:func:`nf4_decoder` puts it in place of the decoder's linear layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# The NF4 levels (QLoRA appendix E; bitsandbytes' NF4 table), ascending.
NF4_CODE = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)


def dynamic_code() -> torch.Tensor:
    """The signed dynamic 8-bit code, 256 ascending fp32 values in [-1, 1]: 0, 1, and for each
    exponent e = 0..6 the 2^e midpoints of an even split of [0.1, 1] scaled by 10^(e-6), with both
    signs. An 8-bit float in effect: the exponent (a run of leading zero bits) chooses the decade,
    the remaining bits the place within it."""
    values = [0.0, 1.0]
    for e in range(7):
        edges = torch.linspace(0.1, 1.0, 2**e + 1, dtype=torch.float64)
        mids = (edges[:-1] + edges[1:]) / 2 * 10.0 ** (e - 6)
        values += [*mids.tolist(), *(-mids).tolist()]
    return torch.tensor(sorted(values), dtype=torch.float32)


DYNAMIC_CODE = dynamic_code()
BLOCK = 64  # values per first-level block (one absmax each)
SCALE_BLOCK = 256  # block scales per second-level block (double quantization)
MAX_GAP = max(b - a for a, b in zip(NF4_CODE, NF4_CODE[1:], strict=False))  # 0.3038 (-1.0 .. -0.6962)
DYNAMIC_MAX_GAP = float((DYNAMIC_CODE[1:] - DYNAMIC_CODE[:-1]).max())  # 0.0141, near +-1


def bits_per_parameter(double_quant: bool = True, block: int = BLOCK, scale_block: int = SCALE_BLOCK) -> float:
    """Storage of one parameter in bits, per the paper: 4 + 32/64 = 4.5, or with double quantization
    4 + 8/64 + 32/(64*256) = 4.127 (the per-tensor mean, padding and shapes left out)."""
    if double_quant:
        return 4 + 8 / block + 32 / (block * scale_block)
    return 4 + 32 / block


@dataclass
class NF4Tensor:
    """One quantized weight: ``codes`` (uint8, two 4-bit indices a byte, the first in the low nibble),
    and the block scales either as fp32 ``absmax`` or double-quantized (``qscale``: uint8 indices into
    :data:`DYNAMIC_CODE`, ``scale2``: fp32 per 256 scales, ``mean``: fp32)."""

    shape: tuple[int, ...]
    codes: torch.Tensor
    absmax: torch.Tensor | None = None
    qscale: torch.Tensor | None = None
    scale2: torch.Tensor | None = None
    mean: torch.Tensor | None = None

    @property
    def double_quant(self) -> bool:
        return self.qscale is not None

    def tensors(self) -> dict[str, torch.Tensor]:
        names = ("codes", "absmax", "qscale", "scale2", "mean")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    @property
    def nbytes(self) -> int:
        """Bytes actually stored (padding and the per-tensor mean included)."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def block_scales(self) -> torch.Tensor:
        """The (dequantized) absmax of every 64-value block, fp32."""
        if self.absmax is not None:
            return self.absmax
        code = DYNAMIC_CODE.to(self.qscale.device)
        per_block = code[self.qscale.long()].view(-1, SCALE_BLOCK) * self.scale2[:, None]
        return per_block.reshape(-1) + self.mean  # padded to a multiple of 256: the caller slices

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        code = torch.tensor(NF4_CODE, dtype=torch.float32, device=self.codes.device)
        low, high = self.codes & 0x0F, self.codes >> 4
        idx = torch.stack([low, high], dim=-1).view(-1).long()
        values = code[idx].view(-1, BLOCK) * self.block_scales()[: idx.numel() // BLOCK, None]
        n = 1
        for d in self.shape:
            n *= d
        return values.view(-1)[:n].view(self.shape).to(dtype)


def quantize_nf4(weight: torch.Tensor, double_quant: bool = True) -> NF4Tensor:
    """Quantize ``weight`` (any float dtype and shape) to NF4 (see the module docstring)."""
    w = weight.detach().float().reshape(-1)
    pad = (-w.numel()) % BLOCK
    blocks = F.pad(w, (0, pad)).view(-1, BLOCK)
    absmax = blocks.abs().amax(dim=1)
    safe = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    normed = blocks / safe[:, None]
    code = torch.tensor(NF4_CODE, dtype=torch.float32, device=w.device)
    # Nearest level: the code is ascending, so count the midpoints below each value.
    mids = (code[1:] + code[:-1]) / 2
    idx = torch.bucketize(normed, mids).to(torch.uint8).view(-1)
    if idx.numel() % 2:
        idx = F.pad(idx, (0, 1))
    pairs = idx.view(-1, 2)
    codes = pairs[:, 0] | (pairs[:, 1] << 4)
    shape = tuple(weight.shape)
    if not double_quant:
        return NF4Tensor(shape, codes, absmax=absmax)
    mean = absmax.mean()
    centred = absmax - mean
    spad = (-centred.numel()) % SCALE_BLOCK
    sblocks = F.pad(centred, (0, spad)).view(-1, SCALE_BLOCK)
    scale2 = sblocks.abs().amax(dim=1)
    safe2 = torch.where(scale2 > 0, scale2, torch.ones_like(scale2))
    dyn = DYNAMIC_CODE.to(w.device)
    qscale = torch.bucketize(sblocks / safe2[:, None], (dyn[1:] + dyn[:-1]) / 2).to(torch.uint8).view(-1)
    return NF4Tensor(shape, codes, qscale=qscale, scale2=scale2, mean=mean.reshape(()))


class NF4Linear(nn.Module):
    """A frozen linear layer (no bias) whose weight is stored in NF4; see the module docstring."""

    def __init__(self, weight: torch.Tensor, double_quant: bool = True) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q = quantize_nf4(weight, double_quant)
        self._shape = q.shape
        for name, tensor in q.tensors().items():
            self.register_buffer(name, tensor)
        for name in ("absmax", "qscale", "scale2", "mean"):
            if name not in q.tensors():
                self.register_buffer(name, None)

    def nf4(self) -> NF4Tensor:
        return NF4Tensor(self._shape, self.codes, self.absmax, self.qscale, self.scale2, self.mean)

    @property
    def nbytes(self) -> int:
        return self.nf4().nbytes

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.nf4().dequantize(dtype)

    def keep_dequantized(self, dtype: torch.dtype | None) -> None:
        """Keep the dequantized weight in ``dtype`` for every later forward (None: drop it). The base is
        frozen, so dequantizing it again at every forward (and again in the backward pass) recomputes
        the same tensor; kept, each step costs the matmul alone, for the weight's memory in ``dtype``."""
        self._dequantized = None if dtype is None else self.dequantize(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = self.__dict__.get("_dequantized")
        if kept is not None and kept.dtype == x.dtype and kept.device == x.device:
            return F.linear(x, kept)
        return F.linear(x, self.dequantize(x.dtype))

    def extra_repr(self) -> str:
        dq = "double-quant" if self.qscale is not None else "fp32 scales"
        return f"in_features={self.in_features}, out_features={self.out_features}, nf4, {dq}"


def nf4_decoder(model: nn.Module, double_quant: bool = True, first: int = 0) -> list[str]:
    """Replace every ``nn.Linear`` of the decoder's layers (``model.decoder.layers``) from layer
    ``first`` up by an :class:`NF4Linear` of its weight; returns their names (ours, e.g.
    ``decoder.layers.0.self_attn.q_proj``). Embeddings, norms, the head, the encoder and the decoder
    layers below ``first`` stay."""
    names = []
    for index, layer in enumerate(model.decoder.layers):
        if index < first:
            continue
        for name, module in list(layer.named_modules()):
            if type(module) is nn.Linear and module.bias is None:
                parent_name, _, attr = name.rpartition(".")
                parent = layer.get_submodule(parent_name) if parent_name else layer
                with torch.no_grad():
                    setattr(parent, attr, NF4Linear(module.weight, double_quant).to(module.weight.device))
                names.append(f"decoder.layers.{index}.{name}")
    return names
