"""A small Transformer encoder classifier (pre-norm, learned positions, mean pooling).

Input is either token ids ``(batch, length)`` (give ``vocab_size``) or feature vectors
``(batch, length, input_dim)``; an image ``(batch, 1, H, W)`` is read as ``H`` rows of ``W``
pixels, so MNIST works with ``input_dim=28, max_length=28``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class SelfAttention(nn.Module):
    """Multi-head self-attention with q, k, v and the output as four Linears.

    Unlike ``nn.MultiheadAttention`` (q, k and v in one weight), the projections can be split
    by heads for tensor parallelism: ``query``/``key``/``value`` colwise and ``out`` rowwise
    give each tensor rank whole heads (its rows of q, k, v) and one all-reduce after ``out``,
    as the MLP's split does. The forward reads the number of heads from the projections'
    local output, so it runs unchanged on a rank holding ``num_heads / tensor`` of them.
    A state dict of ``nn.MultiheadAttention`` (``in_proj_weight``, ``in_proj_bias``,
    ``out_proj.*``; checkpoints from before the split) loads into it.
    """

    def __init__(self, dim: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.dropout = dropout
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        # nn.MultiheadAttention's initialisation (xavier q/k/v, zero biases)
        for layer in (self.query, self.key, self.value):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
        nn.init.zeros_(self.out.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length = x.shape[0], x.shape[1]

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, L, h*d) -> (B, h, L, d)
            return t.view(batch, length, -1, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        p = self.dropout if self.training else 0.0
        attended = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p)
        out: torch.Tensor = self.out(attended.transpose(1, 2).reshape(batch, length, -1))
        return out

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        fused = prefix + "in_proj_weight"
        if fused in state_dict:  # nn.MultiheadAttention's names
            weights = state_dict.pop(fused).chunk(3)
            biases = state_dict.pop(prefix + "in_proj_bias").chunk(3)
            for name, weight, bias in zip(("query", "key", "value"), weights, biases, strict=True):
                state_dict[f"{prefix}{name}.weight"] = weight
                state_dict[f"{prefix}{name}.bias"] = bias
            for kind in ("weight", "bias"):
                state_dict[f"{prefix}out.{kind}"] = state_dict.pop(f"{prefix}out_proj.{kind}")
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


class EncoderBlock(nn.Module):
    """Pre-norm self-attention and MLP, each with a residual connection."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = SelfAttention(dim, num_heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm1(x)
        x = x + self.dropout(self.attention(y))
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
    # model parallelism (trainhub.runtime.distributed.parallel): the stack pipeline stages cut,
    # what the first stage keeps before it and the last stage after it (None on other stages)
    pipeline_layers = "blocks"
    pipeline_first = ("embed", "position")
    pipeline_last = ("norm", "head")

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
        # each None on the pipeline stages that do not hold it (see ``pipeline_first``/``_last``)
        self.embed: nn.Module | None = (
            nn.Embedding(vocab_size, dim) if vocab_size is not None else nn.Linear(input_dim, dim)
        )
        self.tokens = vocab_size is not None
        self.position: nn.Parameter | None = nn.Parameter(torch.zeros(1, max_length, dim))
        nn.init.normal_(self.position, std=0.02)
        self.blocks = nn.ModuleList(
            EncoderBlock(dim, num_heads, mlp_ratio, dropout) for _ in range(depth)
        )
        self.norm: nn.Module | None = nn.LayerNorm(dim)
        self.head: nn.Module | None = nn.Linear(dim, num_classes)

    def tensor_parallel_plan(self, tensor: int = 1) -> dict[str, str]:
        """Megatron-style tensor parallelism of every block: attention by heads (``query``,
        ``key``, ``value`` colwise, ``out`` rowwise) and the MLP (the first Linear colwise,
        the second rowwise); one all-reduce after each in forward and one before each in
        backward. Embedding, norms and head stay replicated (a few ``dim``-sized tensors).
        Attention is split only where the tensor degree ``tensor`` divides the heads (each
        rank whole heads); otherwise it stays replicated."""
        plan: dict[str, str] = {}
        for index, block in enumerate(self.blocks):
            assert isinstance(block, EncoderBlock)
            if block.attention.num_heads % tensor == 0:
                for name in ("query", "key", "value"):
                    plan[f"blocks.{index}.attention.{name}"] = "colwise"
                plan[f"blocks.{index}.attention.out"] = "rowwise"
            plan[f"blocks.{index}.mlp.0"] = "colwise"
            plan[f"blocks.{index}.mlp.3"] = "rowwise"
        return plan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a later pipeline stage (no embedding) is given the hidden state
        h = x if self.embed is None else self._embed(x)
        for block in self.blocks:
            h = block(h)
        if self.head is None or self.norm is None:  # an earlier pipeline stage
            return h
        out: torch.Tensor = self.head(self.norm(h).mean(dim=1))
        return out

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        if not self.tokens and x.dim() == 4:  # (batch, channels, H, W) -> rows as a sequence
            x = x.flatten(1, 2) if x.shape[1] == 1 else x.permute(0, 2, 1, 3).flatten(2)
        assert self.embed is not None
        assert self.position is not None
        length = x.shape[1]
        if length > self.position.shape[1]:
            raise ValueError(f"sequence of {length} exceeds max_length {self.position.shape[1]}")
        h: torch.Tensor = self.embed(x) + self.position[:, :length]
        return h
