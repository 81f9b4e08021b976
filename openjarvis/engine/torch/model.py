"""Qwen2 in plain torch ops: the reference path, and the fallback where Triton is absent.

One forward serves prefill, the 1-token decode step and the k-token verify step: tokens
``[T]`` at positions ``pos [T]`` are appended to the static cache and their logits returned.
With ``kv_len=None`` attention reads the whole cache under a position mask (fixed shapes: CUDA
graph capturable); with an int it reads only the first ``kv_len`` positions (cheaper eagerly).

Arithmetic: the residual stream is float32; products run in the weights' dtype; RMSNorm and
softmax in float32; RoPE is NeoX-style (pairs ``(i, i + head_dim/2)``), as Qwen2 uses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from openjarvis.engine.torch.cache import KVCache
from openjarvis.engine.torch.config import ModelArgs
from openjarvis.engine.torch.weights import Weights


def rope_table(args: ModelArgs, n_pos: int, device: torch.device | str) -> torch.Tensor:
    """``[n_pos, head_dim/2, 2]`` float32 (cos, sin), computed in float64 then rounded once."""
    half = args.head_dim // 2
    inv = args.rope_theta ** (-torch.arange(half, dtype=torch.float64) * 2 / args.head_dim)
    ang = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.stack([ang.cos(), ang.sin()], dim=-1).float().to(device)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [T, D]`` float32 -> float32, scaled by ``weight [D]``."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def apply_rope(x: torch.Tensor, cs: torch.Tensor) -> torch.Tensor:
    """NeoX RoPE on ``x [T, H, hd]`` with ``cs [T, hd/2, 2]``; returns float32."""
    x = x.float()
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cs[:, None, :, 0], cs[:, None, :, 1]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Transformer:
    """Weights + shape + RoPE table; ``forward`` runs the reference path."""

    def __init__(self, args: ModelArgs, weights: Weights, n_pos: int) -> None:
        self.args = args
        self.weights = weights
        self.device = weights.tok_emb.device
        self.dtype = weights.tok_emb.dtype
        self.rope = rope_table(args, n_pos, self.device)  # [n_pos, hd/2, 2]

    def forward(
        self,
        tokens: torch.Tensor,  # [T] int64
        pos: torch.Tensor,  # [T] int64, increasing
        cache: KVCache,
        kv_len: int | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:  # [T, V] float32 ([1, V] if last_only)
        a, w, dt = self.args, self.weights, self.dtype
        T = tokens.shape[0]
        h = w.tok_emb[tokens].float()  # [T, D]
        cs = self.rope[pos]  # [T, hd/2, 2]
        S = cache.capacity if kv_len is None else kv_len
        key_pos = torch.arange(S, device=self.device)
        mask = key_pos[None, :] <= pos[:, None]  # [T, S]
        for i, lw in enumerate(w.layers):
            x = rms_norm(h, lw.attn_norm, a.rms_eps).to(dt)
            qkv = F.linear(x, lw.wqkv, lw.bqkv)  # [T, qkv_dim]
            q, k, v = qkv[:, : a.q_dim], qkv[:, a.q_dim : -a.kv_dim], qkv[:, -a.kv_dim :]
            q = apply_rope(q.view(T, a.n_head, a.head_dim), cs)  # [T, H, hd]
            k = apply_rope(k.view(T, a.n_head_kv, a.head_dim), cs)  # [T, Hkv, hd]
            cache.write(i, pos, k, v.view(T, a.n_head_kv, a.head_dim))
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1).to(dt),  # [H, T, hd]
                cache.k[i, :, :S],  # [Hkv, S, hd]: query head h reads kv head h // group
                cache.v[i, :, :S],
                attn_mask=mask[None],
                enable_gqa=True,
            )  # [H, T, hd]
            o = o.transpose(0, 1).reshape(T, a.q_dim)
            h = h + F.linear(o, lw.wo).float()
            x = rms_norm(h, lw.ffn_norm, a.rms_eps).to(dt)
            gu = F.linear(x, lw.w13)  # [T, 2F]: gate, then up
            gate, up = gu[:, : a.n_ff], gu[:, a.n_ff :]
            h = h + F.linear(F.silu(gate) * up, lw.w2).float()
        x = rms_norm(h[-1:] if last_only else h, w.out_norm, a.rms_eps).to(dt)
        return F.linear(x, w.out).float()  # [T, V]
