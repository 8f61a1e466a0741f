"""The prompt embeddings `Pipeline.run` decodes from, for tests that call `greedy` themselves."""

from __future__ import annotations

from typing import Any

import numpy as np


def prompt_embeds(engine: Any, audio: np.ndarray) -> Any:
    """``engine``'s prompt for ``audio`` (no context, language detected), as ``Pipeline.run`` builds it."""
    import torch

    with torch.inference_mode():
        return engine.pipeline.prompt_embeds(audio).embeds
