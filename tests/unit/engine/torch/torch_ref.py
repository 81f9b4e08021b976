"""An independent float64 Qwen2: unfused weights by GGUF name, no cache, explicit loops."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from openjarvis.engine.torch.config import ModelArgs


def qwen2_f64(args: ModelArgs, named: Mapping[str, torch.Tensor], tokens: list[int]) -> torch.Tensor:
    """Logits ``[len(tokens), V]`` in float64 for the whole sequence from position 0."""
    w = {k: v.detach().to("cpu", torch.float64) for k, v in named.items()}
    T, hd, H, Hkv = len(tokens), args.head_dim, args.n_head, args.n_head_kv

    def norm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + args.rms_eps) * g

    def rope(x: torch.Tensor) -> torch.Tensor:  # [T, h, hd], NeoX pairs (i, i + hd/2)
        out = x.clone()
        for t in range(T):
            for i in range(hd // 2):
                ang = t * args.rope_theta ** (-2 * i / hd)
                c, s = math.cos(ang), math.sin(ang)
                a, b = x[t, :, i], x[t, :, i + hd // 2]
                out[t, :, i], out[t, :, i + hd // 2] = a * c - b * s, b * c + a * s
        return out

    h = w["token_embd.weight"][tokens]
    for layer in range(args.n_layer):
        p = f"blk.{layer}."
        x = norm(h, w[p + "attn_norm.weight"])
        q = (x @ w[p + "attn_q.weight"].T + w[p + "attn_q.bias"]).view(T, H, hd)
        k = (x @ w[p + "attn_k.weight"].T + w[p + "attn_k.bias"]).view(T, Hkv, hd)
        v = (x @ w[p + "attn_v.weight"].T + w[p + "attn_v.bias"]).view(T, Hkv, hd)
        q, k = rope(q), rope(k)
        o = torch.empty(T, H, hd, dtype=torch.float64)
        for head in range(H):
            kv = head // (H // Hkv)
            s = q[:, head] @ k[:, kv].T / math.sqrt(hd)  # [T, T]
            s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), -math.inf)
            o[:, head] = torch.softmax(s, -1) @ v[:, kv]
        h = h + o.reshape(T, H * hd) @ w[p + "attn_output.weight"].T
        x = norm(h, w[p + "ffn_norm.weight"])
        g, u = x @ w[p + "ffn_gate.weight"].T, x @ w[p + "ffn_up.weight"].T
        h = h + (torch.nn.functional.silu(g) * u) @ w[p + "ffn_down.weight"].T
    out = w.get("output.weight", w["token_embd.weight"])
    return norm(h, w["output_norm.weight"]) @ out.T
