"""One-token attention in one launch: thread-block clusters, splits merged on chip.

The Triton step's one-token attention is two launches (``kernels.attention``: a split kernel,
then a merge). ``csrc/attn_cluster.cu`` does both in one: a cluster of ``cs`` CTAs covers the
sequence for one kv head and ``hg`` of its query heads, and the CTAs merge their softmax states
through distributed shared memory. Keys written by earlier steps are asked for before the PDL
wait on the qkv kernel; the step's own key after it. Opt-in (``Runner.cluster_attention``);
built with NVRTC or nvcc like the CUDA step (``cuda_step.compile_cached``), sm_90 and
bfloat16 K/V only. Measured in docs/gpu-notes.md (session 10).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from openjarvis.engine.torch.config import ModelArgs
from openjarvis.engine.torch.cuda_step import (
    CudaStepError,
    _check,
    _driver,
    _LaunchAttr,
    _LaunchConfig,
    compile_cached,
    load_function,
)

SOURCE = Path(__file__).with_name("csrc") / "attn_cluster.cu"
THREADS = 256
BLOCK_KEYS = 64
#: CUlaunchAttributeID values (cuda.h) and CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
_CLUSTER_DIM, _PROGRAMMATIC, _NON_PORTABLE = 4, 6, 14


class _Attr(ctypes.Structure):
    """``CUlaunchAttribute`` with its value read as three uints (a cluster's dimensions)."""

    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4),  # noqa: RUF012
                ("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint),
                ("rest", ctypes.c_char * 52)]


def shape(a: ModelArgs, cs: int, hg: int, nb: int) -> dict[str, int]:
    """The kernel's compile-time shape for model ``a``, or ValueError naming what does not fit."""
    hd, g = a.head_dim, a.group
    if hd % 8 or hd < 64 or THREADS % hd:
        raise ValueError(f"cluster attention needs a head dim of 64, 128 or 256, not {hd}")
    if g % hg or hg > THREADS // 32:
        raise ValueError(f"hg={hg} must divide the {g} query heads a kv head has, up to 8")
    if cs < 1 or cs > 16 or (hg * hd) % cs or hg * hd // cs > THREADS:
        raise ValueError(f"a cluster of {cs} CTAs cannot split {hg} x {hd} outputs evenly")
    if nb < 1:
        raise ValueError("nb (blocks in flight) must be at least 1")
    return {"HD": hd, "G": g, "HG": hg, "CS": cs, "NT": THREADS, "BK": BLOCK_KEYS, "NB": nb}


def smem_bytes(d: dict[str, int]) -> int:
    stage = 2 * d["BK"] * d["HD"] * 2
    ks, kq = d["NT"] // d["HD"], d["NT"] // d["BK"]
    floats = (d["HG"] * (d["HD"] + 2 * kq) + d["HG"] * d["NB"] * d["BK"] + 4 * d["HG"]
              + ks * d["HG"] * d["HD"] + 2 * d["HD"])
    return d["NB"] * stage + 4 * floats


class ClusterAttention:
    """The compiled kernel for one model shape; ``__call__`` launches one layer's attention."""

    def __init__(self, a: ModelArgs, device: torch.device, *, cs: int = 16, hg: int = 0,
                 nb: int = 0, n_ctx: int = 4160, compiler: str = "auto") -> None:
        """``nb``: blocks of 64 keys a CTA holds at once (0: enough for ``n_ctx`` positions
        in one pass, as shared memory allows; longer sequences take several passes)."""
        if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
            raise CudaStepError("cluster attention needs an sm_90 or newer CUDA device")
        self.args = a
        self.device = device
        hg = hg or min(a.group, 2 if a.group % 2 == 0 else a.group)
        if not nb:
            props = torch.cuda.get_device_properties(device)
            limit = int(getattr(props, "shared_memory_per_block_optin", 227 * 1024))
            per_cta = -(-n_ctx // cs)
            nb = -(-(per_cta + 1) // BLOCK_KEYS)  # + 1: the value pass reads keys in pairs
            while nb > 1 and smem_bytes(shape(a, cs, hg, nb)) > limit:
                nb -= 1
        self.defines = shape(a, cs, hg, nb)
        self.smem = smem_bytes(self.defines)
        cap = torch.cuda.get_device_capability(device)
        self.cubin, self.compiler = compile_cached(SOURCE.read_text(), self.defines,
                                                   f"sm_{cap[0]}{cap[1]}", compiler,
                                                   "attn_cluster")
        self._lib = _driver()
        with torch.cuda.device(device):
            torch.cuda.current_stream(device).synchronize()
            mod = ctypes.c_void_p()
            _check(self._lib, self._lib.cuModuleLoadData(ctypes.byref(mod), self.cubin),
                   "loading cluster attention")
            self._module = mod
            self._fn, _ = load_function(self._lib, mod, "attn_cluster", self.smem, THREADS)
            if cs > 8:
                _check(self._lib, self._lib.cuFuncSetAttribute(self._fn, _NON_PORTABLE, 1),
                       "allowing a cluster of more than 8 CTAs")
        d = self.defines
        self.grid = (d["CS"], a.n_head_kv * (d["G"] // d["HG"]))

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 start: torch.Tensor, out: torch.Tensor, pdl: bool = True) -> torch.Tensor:
        """out [1, H * hd] (bfloat16) = attention of q [1, H, hd] (float32, RoPE applied) over
        the cache [Hkv, S, hd] (bfloat16) up to and including position ``start`` (int64 [1]
        on the device); ``pdl``: launched early, waiting on the kernel before it."""
        a = self.args
        if (q.dtype != torch.float32 or q.shape != (1, a.n_head, a.head_dim)
                or not q.is_contiguous()):
            raise ValueError(f"q must be contiguous float32 [1, {a.n_head}, {a.head_dim}]")
        if (k_cache.dtype != torch.bfloat16 or v_cache.dtype != torch.bfloat16
                or k_cache.stride(1) != a.head_dim or k_cache.stride(2) != 1
                or v_cache.stride() != k_cache.stride()):
            raise ValueError("the cache must be bfloat16 [Hkv, S, hd] with contiguous rows")
        if out.dtype != torch.bfloat16 or out.numel() != a.q_dim or not out.is_contiguous():
            raise ValueError(f"out must be contiguous bfloat16 with {a.q_dim} values")
        if start.dtype != torch.int64:
            raise ValueError("start must be int64 on the device")
        from openjarvis.engine.torch import kernels as K

        tr, _ = K._trace(out)  # tracing only (scripts/trace_step.py)
        vals = [ctypes.c_uint64(q.data_ptr()), ctypes.c_uint64(k_cache.data_ptr()),
                ctypes.c_uint64(v_cache.data_ptr()), ctypes.c_uint64(start.data_ptr()),
                ctypes.c_uint64(out.data_ptr()), ctypes.c_int64(k_cache.stride(0)),
                ctypes.c_float(a.head_dim**-0.5),
                ctypes.c_uint64(tr[0].data_ptr() if tr[0] is not out else 0),
                ctypes.c_int(tr[1])]
        argv = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        attrs = (_Attr * 2)()
        attrs[0].id, attrs[0].x, attrs[0].y, attrs[0].z = _CLUSTER_DIM, self.defines["CS"], 1, 1
        attrs[1].id, attrs[1].x = _PROGRAMMATIC, 1
        with torch.cuda.device(self.device):
            stream = ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)
            cfg = _LaunchConfig(self.grid[0], self.grid[1], 1, THREADS, 1, 1, self.smem, stream,
                                ctypes.cast(attrs, ctypes.POINTER(_LaunchAttr)),
                                2 if pdl else 1)
            rc = self._lib.cuLaunchKernelEx(ctypes.byref(cfg), self._fn, argv, None)
        _check(self._lib, rc, "launching cluster attention")
        return out
