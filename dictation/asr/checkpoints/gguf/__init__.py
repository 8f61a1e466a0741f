"""Qwen3-ASR models stored as GGUF files: reading them into our model.

Two public layouts are read:

* **single file** (``general.architecture = "qwen3asr"``), as CrispASR's converter writes it
  (CrispStrobe/CrispASR ``models/convert-qwen3-asr-to-gguf.py``, loader ``src/qwen3_asr.cpp``):
  ``audio.*`` (encoder, convs, projector), ``blk.N.*`` / ``token_embd`` / ``output_norm`` /
  ``output`` (decoder), hyper-parameters under ``qwen3asr.*``, the vocabulary under
  ``tokenizer.ggml.*`` (tokens + merges; no token types in the files we know);
* **llama.cpp pair**: a text model (llama.cpp's converter registers ``Qwen3ASRForConditionalGeneration``
  as architecture ``qwen3vl``; a plain ``qwen3`` file is accepted too) with llama.cpp's standard
  decoder names and tokenizer, plus an ``mmproj`` file (``general.architecture = "clip"``,
  ``clip.audio.projector_type = "qwen3a"``) holding the audio tower under ``a.*`` / ``mm.a.*``
  (ggml-org/llama.cpp ``conversion/qwen3vl.py`` ``Qwen3ASRMmprojModel`` / ``Qwen3ASRTextModel``,
  ``gguf-py/gguf/tensor_mapping.py``, ``tools/mtmd/clip.cpp`` ``PROJECTOR_TYPE_QWEN3A``).

Neither converter permutes a weight that we use, except that llama.cpp stores the three conv
biases as ``[C, 1, 1]`` (they are flattened back); Qwen2/Qwen3 Q/K are not permuted for RoPE
(only llama.cpp's ``LlamaModel`` does that). GGUF lists dimensions fastest-first; shapes here are
torch order (reversed). Tensors a layout carries for its own runtime (CrispASR's mel filters and
window, llama.cpp's sinusoid table ``a.position_embd.weight``) are ignored.

The file format is parsed here (header, metadata, tensor table) instead of with gguf-py's
``GGUFReader``, which takes ~7 s to index the 300k vocabulary and merge strings of a Qwen file;
this parser takes well under a second and needs no extra package. Tensor data is memory-mapped
copy-on-write and dequantized with torch on the target device, vectorised over blocks; values are
computed in float32 exactly as ggml / gguf-py define them (bit-identical to ``gguf.quants.dequantize``),
then cast to the requested dtype. Types read (values per block / bytes per block):

==========  ======  =====  =====================================================================
type        values  bytes  layout (value = ...)
==========  ======  =====  =====================================================================
F32, F16,   1       4/2/2  plain floats
BF16
Q8_0        32      34     ``[d f16][32 x int8 q]``; ``d * q``
Q4_0        32      18     ``[d f16][16 B nibbles]``; ``d * (q - 8)``
Q4_1        32      20     ``[d f16][m f16][16 B nibbles]``; ``d * q + m``
Q5_0        32      22     ``[d f16][qh u32][16 B nibbles]``; ``d * (q - 16)``, bit i of qh = bit 4 of q_i
Q5_1        32      24     ``[d f16][m f16][qh u32][16 B nibbles]``; ``d * q + m``
Q3_K        256     110    ``[hmask 32][qs 64][scales 12][d f16]``; 16 x 16, ``d * (sc - 32) * q``,
                           q = 2 low bits - (4 where the hmask bit is 0), sc 6-bit
Q4_K        256     144    ``[d][dmin][scales 12][qs 128]``; 8 x 32, ``d * sc * q - dmin * m``
Q5_K        256     176    ``[d][dmin][scales 12][qh 32][qs 128]``; as Q4_K with a fifth bit
Q6_K        256     210    ``[ql 128][qh 64][scales 16 x int8][d]``; 16 x 16, ``d * sc * (q - 32)``
==========  ======  =====  =====================================================================

Nibble blocks of 32 (Q4_*/Q5_*) hold values 0-15 in the low nibbles of their 16 bytes and 16-31 in
the high nibbles. Other types (Q2_K, the IQ types, ...) are refused with a WeightsError naming the
file, the tensor and the type. CrispASR's quantizer falls back to Q4_0/Q5_0 (``Q4_K``/``Q5_K``
requests) for rows that are not a multiple of 256, e.g. the 0.6B audio encoder's width 896.
"""
