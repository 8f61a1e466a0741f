"""The engine's build-time choices: which code paths one model runs (docs/engine.md, "Model options").

One frozen :class:`ModelOptions` per model, given when it is built (``AsrModel(cfg, options=...)``)
or set on it afterwards (``model.options = replace(model.options, rows_bucketed=True)``): the model
hands it to the encoder, the decoder's layers and its quantized layers, which read it instead of
module-wide switches, so two models in one process may differ. ``EngineOptions.model`` carries it
for an engine. The defaults are what the engine does everywhere unless a test or a benchmark asks
otherwise; ``None`` means "decided by the device" (CUDA or not) or, for the CPU's bf16, by the CPU.

What the machine can do, measured once per process (kernel probes, the CUDA path timings, the CPU's
bf16 timing: ``quant_paths.py``; the fused kernels' probe: ``kernels/fused.py``), stays module-wide:
those are facts about the machine, not choices.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelOptions:
    # --- AsrModel (model.py) ---
    # Prompts longer than this are prefilled in pieces, so attention memory stays bounded.
    prefill_chunk: int = 1024
    # A prompt from position 0 padded to a prefill bucket (None: on CUDA only).
    prefill_bucketed: bool | None = None
    # Rows after the cached prompt padded to a row bucket (None: on CUDA only).
    rows_bucketed: bool | None = None
    # Capture the bucketed prefills and rows as CUDA graphs (False: run them eagerly).
    prefill_graph: bool = True
    # On the CPU, a quantized model that computes in bf16 reads its output head from an int8 copy of
    # the table, re-scoring the rows that could win in float32 (nn/int8_table.py; set when loaded).
    int8_head: bool = True
    # --- AudioEncoder (encoder.py) ---
    # A clip padded to an encoder bucket of 8-s windows (None: on CUDA only).
    encoder_bucketed: bool | None = None
    # Capture the bucketed encoder as CUDA graphs (False: run it eagerly).
    encoder_graph: bool = True
    # Channels-last conv weights on the CPU (oneDNN's faster convs).
    channels_last_on_cpu: bool = True
    # One-second chunks per conv call on a GPU / on the CPU (memory only, no numeric effect).
    conv_batch: int = 100
    conv_batch_cpu: int = 2
    # --- TextDecoder (decoder.py) ---
    # q/k/v and gate/up each as one matmul (False: every projection on its own, the plain path).
    fuse_projections: bool = True
    # Masked attention with GQA folded into rows instead of enable_gqa (None: on CUDA only).
    fold_masked_gqa: bool | None = None
    # --- Int8Linear / Int4Linear (quantized.py) ---
    # Use the integer kernels at all (False: always dequantize + matmul).
    quant_kernels: bool = True
    # Quantized layers on the CPU compute in bf16 (None: where the CPU has bf16 instructions; and on
    # other CPUs the decode-sized calls where the bf16 kernel was timed faster). False: float32.
    cpu_bf16_compute: bool | None = None
    # The CUDA path for int8 / int4 rows ("triton", "torch", "dequantize"; None: the fastest, timed).
    cuda_int8_path: str | None = None
    cuda_int4_path: str | None = None
    # Devices where int4 layers dequantize for many rows in one Triton kernel.
    one_pass_dequantize: tuple[str, ...] = ("cuda",)
    # --- decoding (decode/greedy.py) ---
    # Which one-token step decodes: None = the static-shape step on CUDA (and where the model compiles
    # its step), the plain step elsewhere; True: the static step everywhere; False: the plain step.
    static_step: bool | None = None
    # Capture the static step as a CUDA graph (False: it runs eagerly on CUDA).
    capture_step: bool = True
    # The plain step of an int8 decoder on the CPU in one native call (nn/native_step.py), where its
    # library builds (None); False: torch's operators.
    native_cpu_step: bool | None = None


DEFAULT_OPTIONS = ModelOptions()
