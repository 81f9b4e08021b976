"""The static KV cache: fixed-shape buffers allocated once; rollback is a position reset.

Nothing here tracks how many positions are valid: the caller passes positions, every write lands
at its position, and attention masks keys by position, so tokens past ``n_past`` are dead
without being cleared (a later write overwrites them before any query can see them).
"""

from __future__ import annotations

import torch

from openjarvis.engine.torch.config import ModelArgs

#: Positions beyond ``n_ctx`` so that a padded verify step near the end of the window still
#: writes inside the buffers.
SLACK = 32


class KVCache:
    """K and V for every layer: ``[n_layer, n_head_kv, n_ctx + SLACK, head_dim]`` each."""

    def __init__(
        self, args: ModelArgs, n_ctx: int, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        self.n_ctx = n_ctx
        shape = (args.n_layer, args.n_head_kv, n_ctx + SLACK, args.head_dim)
        # Random, not zeros: a read of an unwritten position shows up in tests as wrong logits.
        self.k = torch.randn(shape, device=device).to(dtype)  # [L, Hkv, S, hd]
        self.v = torch.randn(shape, device=device).to(dtype)  # [L, Hkv, S, hd]

    @property
    def capacity(self) -> int:
        return int(self.k.shape[2])

    def write(self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k, v [T, Hkv, hd]`` at positions ``pos [T]`` of ``layer`` (graph-safe)."""
        self.k[layer].index_copy_(1, pos, k.transpose(0, 1).to(self.k.dtype))
        self.v[layer].index_copy_(1, pos, v.transpose(0, 1).to(self.v.dtype))

    def snapshot(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the first ``n`` positions, on the CPU: ``[L, Hkv, n, hd]`` each."""
        return self.k[:, :, :n].cpu().clone(), self.v[:, :, :n].cpu().clone()

    def restore(self, k: torch.Tensor, v: torch.Tensor) -> None:
        n = k.shape[2]
        if n > self.n_ctx or k.shape[:2] != self.k.shape[:2] or k.shape[3] != self.k.shape[3]:
            raise ValueError(f"state of shape {tuple(k.shape)} does not fit this cache")
        self.k[:, :, :n].copy_(k)
        self.v[:, :, :n].copy_(v)
