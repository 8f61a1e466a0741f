"""Local push-to-talk dictation on Qwen3-ASR."""

__version__ = "0.1.0"
