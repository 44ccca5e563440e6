"""A small Transformer encoder classifier (pre-norm, learned positions, mean pooling).

Input is either token ids ``(batch, length)`` (give ``vocab_size``) or feature vectors
``(batch, length, input_dim)``; an image ``(batch, 1, H, W)`` is read as ``H`` rows of ``W``
pixels, so MNIST works with ``input_dim=28, max_length=28``.
"""

from __future__ import annotations

import torch
from torch import nn


class EncoderBlock(nn.Module):
    """Pre-norm self-attention and MLP, each with a residual connection."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm1(x)
        attended, _ = self.attention(y, y, y, need_weights=False)
        x = x + self.dropout(attended)
        out: torch.Tensor = x + self.dropout(self.mlp(self.norm2(x)))
        return out


class TransformerClassifier(nn.Module):
    """Embedding, ``depth`` encoder blocks, layer norm, mean over positions, linear head.

    Args:
        num_classes: number of logits.
        vocab_size: token vocabulary; ``None`` for vector (or image-row) inputs.
        input_dim: size of one input vector when ``vocab_size`` is ``None``.
        max_length: longest sequence (positions are learned).
        dim, depth, num_heads, mlp_ratio, dropout: the encoder's shape.
    """

    checkpoint_block_types = (EncoderBlock,)

    def __init__(
        self,
        num_classes: int = 10,
        *,
        vocab_size: int | None = None,
        input_dim: int = 28,
        max_length: int = 128,
        dim: int = 64,
        depth: int = 2,
        num_heads: int = 4,
        mlp_ratio: float = 2.0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.embed: nn.Module = (
            nn.Embedding(vocab_size, dim) if vocab_size is not None else nn.Linear(input_dim, dim)
        )
        self.tokens = vocab_size is not None
        self.position = nn.Parameter(torch.zeros(1, max_length, dim))
        nn.init.normal_(self.position, std=0.02)
        self.blocks = nn.ModuleList(
            EncoderBlock(dim, num_heads, mlp_ratio, dropout) for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.tokens and x.dim() == 4:  # (batch, channels, H, W) -> rows as a sequence
            x = x.flatten(1, 2) if x.shape[1] == 1 else x.permute(0, 2, 1, 3).flatten(2)
        length = x.shape[1]
        if length > self.position.shape[1]:
            raise ValueError(f"sequence of {length} exceeds max_length {self.position.shape[1]}")
        h = self.embed(x) + self.position[:, :length]
        for block in self.blocks:
            h = block(h)
        out: torch.Tensor = self.head(self.norm(h).mean(dim=1))
        return out
