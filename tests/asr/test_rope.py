"""Plain 1-D RoPE equals the checkpoint's interleaved MRoPE for speech positions (docs/model.md §6.2)."""

import torch

from dictation.asr.nn.rope import apply_rope, inverse_frequencies, rope_tables

HEAD_DIM, THETA, SECTIONS = 128, 1_000_000.0, (24, 20, 20)


def interleaved_mrope_tables(pos3: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A literal MRoPE: positions ``[3, S]`` (T, H, W rows), frequency j taken from row H when
    ``j % 3 == 1`` and ``j < 3 * 20``, from row W when ``j % 3 == 2`` and ``j < 3 * 20``, else T."""
    inv = inverse_frequencies(HEAD_DIM, THETA)
    freqs = pos3.float()[:, :, None] * inv[None, None, :]  # [3, S, 64]
    chosen = freqs[0].clone()
    for row, offset in ((1, 1), (2, 2)):
        limit = SECTIONS[row] * 3
        chosen[:, offset:limit:3] = freqs[row, :, offset:limit:3]
    emb = torch.cat([chosen, chosen], dim=-1)
    return emb.cos(), emb.sin()


def test_identical_rows_make_mrope_plain_rope():
    positions = torch.arange(0, 3000)
    cos, sin = rope_tables(positions, HEAD_DIM, THETA)
    m_cos, m_sin = interleaved_mrope_tables(positions.expand(3, -1))
    assert torch.equal(cos, m_cos) and torch.equal(sin, m_sin)


def test_mrope_differs_when_rows_differ():
    # The comparison above is meaningful: with distinct rows (as for images) the tables differ.
    positions = torch.arange(0, 50)
    rows = torch.stack([positions, positions // 2, positions % 7])
    cos, _ = rope_tables(positions, HEAD_DIM, THETA)
    m_cos, _ = interleaved_mrope_tables(rows)
    assert not torch.allclose(cos, m_cos)


def test_rotation_is_split_half_and_preserves_norm():
    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, HEAD_DIM)
    cos, sin = rope_tables(torch.arange(5), HEAD_DIM, THETA)
    y = apply_rope(x, cos, sin)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    # position 0 is the identity; at position p, dims (0, 64) rotate by angle p * inv_freq[0] = p.
    assert torch.equal(y[..., 0, :], x[..., 0, :])
    angle = torch.tensor(3.0)
    expected = x[..., 3, 0] * angle.cos() - x[..., 3, 64] * angle.sin()
    assert torch.allclose(y[..., 3, 0], expected, atol=1e-6)


def test_relative_positions_give_same_scores():
    torch.manual_seed(1)
    q, k = torch.randn(HEAD_DIM), torch.randn(HEAD_DIM)
    cos, sin = rope_tables(torch.arange(200), HEAD_DIM, THETA)
    s1 = apply_rope(q, cos[10], sin[10]) @ apply_rope(k, cos[3], sin[3])
    s2 = apply_rope(q, cos[107], sin[107]) @ apply_rope(k, cos[100], sin[100])
    assert torch.allclose(s1, s2, atol=1e-4)
