"""Which GGUF tensor and metadata names hold which of our tensors and hyper-parameters, per layout."""

from __future__ import annotations

# --- tensor names -------------------------------------------------------------------------------------
# (GGUF module name, our module name); "{i}" is a layer index. A GGUF tensor is "<module>.weight" or
# "<module>.bias" and maps to the same suffix on our side.

DECODER_NAMES: tuple[tuple[str, str], ...] = (  # both layouts (llama.cpp's standard names)
    ("token_embd", "decoder.embed_tokens"),
    ("output_norm", "decoder.norm"),
    ("output", "lm_head"),
    ("blk.{i}.attn_norm", "decoder.layers.{i}.input_layernorm"),
    ("blk.{i}.attn_q", "decoder.layers.{i}.self_attn.q_proj"),
    ("blk.{i}.attn_k", "decoder.layers.{i}.self_attn.k_proj"),
    ("blk.{i}.attn_v", "decoder.layers.{i}.self_attn.v_proj"),
    ("blk.{i}.attn_output", "decoder.layers.{i}.self_attn.o_proj"),
    ("blk.{i}.attn_q_norm", "decoder.layers.{i}.self_attn.q_norm"),
    ("blk.{i}.attn_k_norm", "decoder.layers.{i}.self_attn.k_norm"),
    ("blk.{i}.ffn_norm", "decoder.layers.{i}.post_attention_layernorm"),
    ("blk.{i}.ffn_gate", "decoder.layers.{i}.mlp.gate_proj"),
    ("blk.{i}.ffn_up", "decoder.layers.{i}.mlp.up_proj"),
    ("blk.{i}.ffn_down", "decoder.layers.{i}.mlp.down_proj"),
)
SINGLE_AUDIO_NAMES: tuple[tuple[str, str], ...] = (  # CrispASR "qwen3asr"
    ("audio.conv.1", "audio_tower.conv2d1"),
    ("audio.conv.2", "audio_tower.conv2d2"),
    ("audio.conv.3", "audio_tower.conv2d3"),
    ("audio.conv_out", "audio_tower.conv_out"),
    ("audio.blk.{i}.attn_norm", "audio_tower.layers.{i}.self_attn_layer_norm"),
    ("audio.blk.{i}.attn_q", "audio_tower.layers.{i}.self_attn.q_proj"),
    ("audio.blk.{i}.attn_k", "audio_tower.layers.{i}.self_attn.k_proj"),
    ("audio.blk.{i}.attn_v", "audio_tower.layers.{i}.self_attn.v_proj"),
    ("audio.blk.{i}.attn_out", "audio_tower.layers.{i}.self_attn.out_proj"),
    ("audio.blk.{i}.ffn_norm", "audio_tower.layers.{i}.final_layer_norm"),
    ("audio.blk.{i}.ffn_up", "audio_tower.layers.{i}.fc1"),
    ("audio.blk.{i}.ffn_down", "audio_tower.layers.{i}.fc2"),
    ("audio.ln_post", "audio_tower.ln_post"),
    ("audio.proj1", "audio_tower.proj1"),
    ("audio.proj2", "audio_tower.proj2"),
)
MMPROJ_AUDIO_NAMES: tuple[tuple[str, str], ...] = (  # llama.cpp mmproj, projector "qwen3a"
    ("a.conv2d.1", "audio_tower.conv2d1"),
    ("a.conv2d.2", "audio_tower.conv2d2"),
    ("a.conv2d.3", "audio_tower.conv2d3"),
    ("a.conv_out", "audio_tower.conv_out"),
    ("a.blk.{i}.ln1", "audio_tower.layers.{i}.self_attn_layer_norm"),
    ("a.blk.{i}.attn_q", "audio_tower.layers.{i}.self_attn.q_proj"),
    ("a.blk.{i}.attn_k", "audio_tower.layers.{i}.self_attn.k_proj"),
    ("a.blk.{i}.attn_v", "audio_tower.layers.{i}.self_attn.v_proj"),
    ("a.blk.{i}.attn_out", "audio_tower.layers.{i}.self_attn.out_proj"),
    ("a.blk.{i}.ln2", "audio_tower.layers.{i}.final_layer_norm"),
    ("a.blk.{i}.ffn_up", "audio_tower.layers.{i}.fc1"),
    ("a.blk.{i}.ffn_down", "audio_tower.layers.{i}.fc2"),
    ("a.post_ln", "audio_tower.ln_post"),
    ("mm.a.mlp.1", "audio_tower.proj1"),
    ("mm.a.mlp.2", "audio_tower.proj2"),
)
SINGLE_IGNORED = frozenset({"audio.mel_filters", "audio.mel_window"})  # CrispASR's own frontend constants
MMPROJ_IGNORED = frozenset({"a.position_embd.weight"})  # the sinusoid table; we compute it


# --- hyper-parameters ---------------------------------------------------------------------------------
# our config field -> metadata key; absent keys fall back to tensor shapes or the config defaults.

SINGLE_KEYS = {
    "audio.num_mel_bins": "qwen3asr.n_mels",
    "audio.d_model": "qwen3asr.audio.d_model",
    "audio.encoder_layers": "qwen3asr.audio.n_layers",
    "audio.encoder_attention_heads": "qwen3asr.audio.n_heads",
    "audio.encoder_ffn_dim": "qwen3asr.audio.ff_dim",
    "audio.downsample_hidden_size": "qwen3asr.audio.conv_channels",
    "audio.output_dim": "qwen3asr.audio.proj_dim",
    "audio.max_source_positions": "qwen3asr.audio.max_source_pos",
    "text.vocab_size": "qwen3asr.llm.vocab_size",
    "text.hidden_size": "qwen3asr.llm.d_model",
    "text.intermediate_size": "qwen3asr.llm.ff_dim",
    "text.num_hidden_layers": "qwen3asr.llm.n_layers",
    "text.num_attention_heads": "qwen3asr.llm.n_heads",
    "text.num_key_value_heads": "qwen3asr.llm.n_kv_heads",
    "text.head_dim": "qwen3asr.llm.head_dim",
    "text.rms_norm_eps": "qwen3asr.llm.rms_norm_eps",
    "text.rope_theta": "qwen3asr.llm.rope_theta",
    "text.max_position_embeddings": "qwen3asr.llm.max_pos",
    "special.audio_token_id": "qwen3asr.audio_pad_token_id",
    "special.audio_start_token_id": "qwen3asr.audio_start_token_id",
    "special.audio_end_token_id": "qwen3asr.audio_end_token_id",
}
TEXT_KEYS = {  # "{arch}" is the text file's general.architecture
    "text.vocab_size": "{arch}.vocab_size",
    "text.hidden_size": "{arch}.embedding_length",
    "text.intermediate_size": "{arch}.feed_forward_length",
    "text.num_hidden_layers": "{arch}.block_count",
    "text.num_attention_heads": "{arch}.attention.head_count",
    "text.num_key_value_heads": "{arch}.attention.head_count_kv",
    "text.head_dim": "{arch}.attention.key_length",
    "text.rms_norm_eps": "{arch}.attention.layer_norm_rms_epsilon",
    "text.rope_theta": "{arch}.rope.freq_base",
    "text.max_position_embeddings": "{arch}.context_length",
}
MMPROJ_KEYS = {
    "audio.num_mel_bins": "clip.audio.num_mel_bins",
    "audio.d_model": "clip.audio.embedding_length",
    "audio.encoder_layers": "clip.audio.block_count",
    "audio.encoder_attention_heads": "clip.audio.attention.head_count",
    "audio.encoder_ffn_dim": "clip.audio.feed_forward_length",
    "audio.output_dim": "clip.audio.projection_dim",
}
AUDIO_HEAD_DIM = 64  # every Qwen3-ASR audio tower (docs/model.md §1); used only when a file omits the head count
