"""The one-token step as one persistent CUDA kernel (``csrc/decode_step.cu``), for sm_90 GPUs.

Why a CUDA kernel beside the Triton ones: the per-kernel Triton step pays a fixed 2.5-3 µs on
each of its ~170 launches, and the Triton single-launch step cannot keep enough bytes in
flight per SM (docs/gpu-notes.md). This kernel streams every weight through shared memory with
the copy engine, a producer warp per SM running ahead of the consumers across layers. It is
slower than the Triton step today (BENCHMARKS.md, "Persistent CUDA one-token step"), so it is
opt-in; the shapes it takes are the real models' (head_dim a multiple of 64), not the tests'
tiny ones.

Building needs no CUDA toolkit where PyTorch's CUDA wheels are installed: the source has no
includes and is compiled with NVRTC (``libnvrtc``, which those wheels ship), or with ``nvcc``
where NVRTC is not found; the binary is cached under ``~/.cache/openjarvis/cuda`` by source,
shape and GPU. It is loaded and launched through the CUDA driver API (``libcuda``) on PyTorch's
current stream, so a CUDA graph captures it like any other launch.

``available()`` says whether this machine could run it; ``Runner.use_cuda_step()`` builds it
and uses it for one-token steps (verify steps stay on the Triton kernels).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from openjarvis.engine.torch.cache import KVCache
from openjarvis.engine.torch.config import ModelArgs
from openjarvis.engine.torch.model import Transformer

SOURCE = Path(__file__).with_name("csrc") / "decode_step.cu"
#: Consumer warps per block (the producer is one more warp).
NCW = 8
#: Attention splits per kv head: NKV * SPLITS blocks share a layer's attention.
SPLITS = 32
#: Positions per attention tile (``ATILE`` in the source).
ATILE = 128
#: Bytes of one ring stage; rows per stage are the most that fit (at most 16).
STAGE_BYTES = 28672
#: Dynamic shared memory a block may ask for on sm_90 (227 KB).
SMEM_LIMIT = 232448


class CudaStepError(RuntimeError):
    """This GPU, driver or toolchain cannot build or run the CUDA step (the message says why)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Compile-time shape of the kernel for one model: the -D macros and the shared memory."""

    defines: dict[str, int]
    smem: int


def _chunks(k: int, rows: int, cap: int) -> int:
    """Fewest K chunks that put ``rows`` rows of a chunk in ``cap`` bytes (16-byte aligned)."""
    for n in range(1, k // 8 + 1):
        if k % n == 0 and (k // n) % 8 == 0 and rows * (k // n) * 2 <= cap:
            return n
    raise CudaStepError(f"no K chunk of {k} fits a {cap}-byte stage")


def _shape(n_rows: int, k: int, cap: int, sms: int, split: bool) -> tuple[int, int]:
    """(warps per row, rows per warp) of a kind: the fewest rows for the busiest block, then
    the fewest K chunks, then the largest unit. ``split``: warps may share a row."""
    best: tuple[int, int, int, int, int] | None = None
    # one-row units (8 warps to a row) measured slower for the 0.5B (run 31): at most 2
    for wpr, rpw in ((1, 2), (1, 1), (2, 1)) if split else ((1, 2), (1, 1)):
        rows = NCW // wpr * rpw
        if n_rows % rows:
            continue
        busiest = -(-(n_rows // rows) // sms) * rows
        key = (busiest, _chunks(k, rows, cap), -rows, wpr, rpw)
        if best is None or key < best:
            best = key
    if best is None:
        raise CudaStepError(f"{n_rows} rows do not split into units")
    return best[3], best[4]


def plan(a: ModelArgs, stage_cap: int = STAGE_BYTES, nstage: int = 0,
         extra: dict[str, int] | None = None, sms: int = 132) -> Plan:
    """Rows and K chunks per unit for each matrix, and the deepest ring that fits shared
    memory (see ``Kind`` in the source). ``sms``: the blocks (one per SM) the rows are dealt
    to. ``extra``: more macros (benchmark experiments)."""
    grp, hd = a.group, a.head_dim
    if hd % 64 or grp > 16 or (hd // 2) % NCW or a.n_ff % NCW:
        raise CudaStepError(f"unsupported shape for the CUDA step: {a}")
    d: dict[str, int] = {}
    stage = 0
    for kind, k, n_rows, pair in (("QKV", a.n_embd, 0, True), ("WO", a.q_dim, a.n_embd, False),
                                  ("13", a.n_embd, 0, True), ("2", a.n_ff, a.n_embd, False),
                                  ("OUT", a.n_embd, a.n_vocab, False)):
        wpr, rpw = (1, 2) if pair else _shape(n_rows, k, stage_cap, sms, kind != "OUT")
        assert kind != "OUT" or wpr == 1  # the source has no WPR_OUT
        nr = NCW // wpr
        nkc = _chunks(k, nr * rpw, stage_cap)
        if not pair:
            d[f"RPW_{kind}"] = rpw
            if kind != "OUT":
                d[f"WPR_{kind}"] = wpr
        d[f"NKC_{kind}"] = nkc
        stage = max(stage, nr * rpw * (k // nkc) * 2)
    xmax = max(a.n_embd, a.n_ff, a.q_dim)
    if (grp * hd + max(grp * ATILE, NCW * grp * hd) > xmax or (NCW * 32) % ATILE
            or ATILE % NCW or 2 * grp * SPLITS > xmax):
        raise CudaStepError("the attention's buffers do not fit the input-vector buffer")
    fixed = xmax * 4 + 96 * 4  # xs, misc
    per_stage = stage + 16  # the stage and its two mbarriers
    depth = nstage or min(16, (SMEM_LIMIT - fixed) // per_stage)
    if depth < 2 or depth * per_stage + fixed > SMEM_LIMIT:
        raise CudaStepError("shared memory holds fewer stages than asked for")
    defines = dict(
        DM=a.n_embd, FF=a.n_ff, NH=a.n_head, NKV=a.n_head_kv, HD=hd, NL=a.n_layer,
        NV=a.n_vocab, NCW=NCW, NSTAGE=depth, STAGE_BYTES=stage, SPLITS=SPLITS, ATILE=ATILE,
        **d,
    ) | (extra or {})
    return Plan(defines, depth * per_stage + fixed)


# -- building ---------------------------------------------------------------------------------


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "openjarvis" / "cuda"


def _nvrtc() -> ctypes.CDLL | None:
    names = []
    for base in sys.path:  # PyTorch's CUDA wheels: nvidia/cuda_nvrtc/lib/libnvrtc.so.*
        names += sorted(glob.glob(os.path.join(base, "nvidia", "*nvrtc*", "lib", "libnvrtc.so*")))
        names += sorted(glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libnvrtc.so*")))
    found = ctypes.util.find_library("nvrtc")
    names += [n for n in (found, "libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so") if n]
    for n in names:
        if "builtins" in n or "alt" in os.path.basename(n):
            continue
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    return None


def _compile_nvrtc(lib: ctypes.CDLL, src: str, opts: list[str]) -> bytes:
    prog = ctypes.c_void_p()
    ok = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"decode_step.cu", 0, None,
                                None)
    if ok:
        raise CudaStepError(f"nvrtcCreateProgram failed ({ok})")
    try:
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        ok = lib.nvrtcCompileProgram(prog, len(opts), arr)
        if ok:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise CudaStepError("NVRTC could not compile the CUDA step: "
                                + log.value.decode(errors="replace").strip()[-2000:])
        size = ctypes.c_size_t()
        if lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)):
            raise CudaStepError("NVRTC gave no sm_90 binary")
        out = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, out)
        return out.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _compile_nvcc(nvcc: str, src: Path, opts: list[str]) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "step.cubin"
        cmd = [nvcc, "-cubin", "-O3", *opts, "-o", str(out), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode:
            raise CudaStepError("nvcc could not compile the CUDA step: " + proc.stderr[-2000:])
        return out.read_bytes()


def build(p: Plan, arch: str = "sm_90", compiler: str = "auto") -> tuple[bytes, str]:
    """The cubin for ``p`` (cached), and the compiler that made it ("nvrtc" or "nvcc")."""
    src = SOURCE.read_text()
    defs = [f"-D{k}={v}" for k, v in sorted(p.defines.items())]
    key = hashlib.sha256((src + " ".join(defs) + arch).encode()).hexdigest()[:24]
    cached = _cache_dir() / f"decode_step-{key}.cubin"
    if cached.is_file() and compiler == "auto":
        return cached.read_bytes(), "cache"
    lib = _nvrtc() if compiler in ("auto", "nvrtc") else None
    if lib is not None:
        cubin = _compile_nvrtc(lib, src, [f"--gpu-architecture={arch}", "-std=c++17", *defs])
        how = "nvrtc"
    else:
        nvcc = shutil.which("nvcc") or (
            "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
        if nvcc is None or compiler == "nvrtc":
            raise CudaStepError("no CUDA compiler: install PyTorch's CUDA wheels (NVRTC) or nvcc")
        cubin = _compile_nvcc(nvcc, SOURCE, [f"-arch={arch}", *defs])
        how = "nvcc"
    try:  # a cache that cannot be written only costs the next start a compile
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(cubin)
        tmp.replace(cached)
    except OSError:
        pass
    return cubin, how


# -- loading and launching through the driver API --------------------------------------------


_POINTERS = ("wtab", "emb", "out_w", "out_norm", "inputs", "rope", "kc", "vc", "h", "q", "attn",
             "act", "part", "logits", "counters")


class _Params(ctypes.Structure):
    """The kernel's ``Params``, field for field (passed by value as its one argument)."""

    _fields_ = [  # noqa: RUF012  # ctypes reads the class attribute
        *((n, ctypes.c_uint64) for n in _POINTERS),
        ("cache_s", ctypes.c_int64), ("eps", ctypes.c_float), ("scale", ctypes.c_float)]


def _driver() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise CudaStepError(f"the CUDA driver library is not loadable: {e}") from e


def _check(lib: ctypes.CDLL, rc: int, what: str) -> None:
    if rc:
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(rc, ctypes.byref(msg))
        raise CudaStepError(f"{what} failed: {(msg.value or b'?').decode()} ({rc})")


class DecodeStep:
    """The compiled kernel bound to one model's weights, RoPE table and KV cache."""

    def __init__(self, model: Transformer, cache: KVCache, *, compiler: str = "auto",
                 nstage: int = 0, stage_cap: int = STAGE_BYTES,
                 extra: dict[str, int] | None = None) -> None:
        dev = model.device
        if dev.type != "cuda":
            raise CudaStepError("the CUDA step needs a CUDA device")
        cap = torch.cuda.get_device_capability(dev)
        if cap[0] < 9:
            raise CudaStepError(f"the CUDA step needs sm_90 or newer (this GPU is sm_{cap[0]}{cap[1]})")
        if model.dtype != torch.bfloat16:
            raise CudaStepError("the CUDA step runs bfloat16 weights only")
        a = self.args = model.args
        self.sms = torch.cuda.get_device_properties(dev).multi_processor_count
        self.plan = plan(a, stage_cap, nstage, extra, self.sms)
        self.cubin, self.compiler = build(self.plan, f"sm_{cap[0]}{cap[1]}", compiler)
        w = model.weights
        f32 = torch.float32
        self.h = torch.empty(a.n_embd, dtype=f32, device=dev)
        self.q = torch.empty(a.q_dim, dtype=f32, device=dev)
        self.attn = torch.empty(a.q_dim, dtype=f32, device=dev)
        self.act = torch.empty(a.n_ff, dtype=f32, device=dev)
        splits = self.plan.defines["SPLITS"]
        self.part = torch.empty(a.n_head_kv * splits, a.group * a.head_dim + 2 * a.group,
                                dtype=f32, device=dev)
        self.logits = torch.empty(1, a.n_vocab, dtype=f32, device=dev)
        # grid barriers, then per (layer, kv head): splits finished, qkv units written
        self.counters = torch.zeros(a.n_layer * 5 + 2 * a.n_layer * a.n_head_kv,
                                    dtype=torch.int32, device=dev)
        tensors = [w.tok_emb, w.out, w.out_norm, model.rope, cache.k, cache.v]
        rows = []
        for lw in w.layers:
            lt = [lw.wqkv, lw.bqkv, lw.wo, lw.w13, lw.w2, lw.attn_norm, lw.ffn_norm]
            tensors += lt
            rows.append([t.data_ptr() for t in lt])
        for t in tensors:
            if not t.is_contiguous() or t.data_ptr() % 16:
                raise CudaStepError("the CUDA step needs contiguous, 16-byte aligned tensors")
        self.wtab = torch.tensor(rows, dtype=torch.int64).to(dev)
        self._keep = (model, cache)  # the kernel reads their memory: keep it alive
        self._params = _Params(
            wtab=self.wtab.data_ptr(), emb=w.tok_emb.data_ptr(), out_w=w.out.data_ptr(),
            out_norm=w.out_norm.data_ptr(), inputs=0, rope=model.rope.data_ptr(),
            kc=cache.k.data_ptr(), vc=cache.v.data_ptr(), h=self.h.data_ptr(),
            q=self.q.data_ptr(), attn=self.attn.data_ptr(), act=self.act.data_ptr(),
            part=self.part.data_ptr(), logits=self.logits.data_ptr(),
            counters=self.counters.data_ptr(), cache_s=cache.capacity, eps=a.rms_eps,
            scale=a.head_dim**-0.5)
        self._lib = _driver()
        torch.cuda.current_stream(dev).synchronize()  # the primary context is current here
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        _check(self._lib, self._lib.cuModuleLoadData(ctypes.byref(mod), self.cubin),
               "loading the CUDA step")
        _check(self._lib, self._lib.cuModuleGetFunction(ctypes.byref(fn), mod, b"decode_step"),
               "finding decode_step")
        self._module, self._fn = mod, fn
        _check(self._lib, self._lib.cuFuncSetAttribute(fn, 8, self.plan.smem),  # max dyn. smem
               "reserving shared memory")
        occ = ctypes.c_int()
        _check(self._lib, self._lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(occ), fn, NCW * 32 + 32, ctypes.c_size_t(self.plan.smem)),
            "reading occupancy")
        if occ.value < 1:  # the grid barrier spins forever unless every block is resident
            raise CudaStepError("a block of the CUDA step does not fit one SM")

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        """Run one token: ``inputs`` is int64 ``[2]`` (position, token) on the device; returns
        the logits ``[1, V]`` (a buffer the next call overwrites)."""
        self.counters.zero_()
        self._params.inputs = inputs.data_ptr()
        arg = ctypes.c_void_p(ctypes.addressof(self._params))
        argv = (ctypes.c_void_p * 1)(arg)
        stream = torch.cuda.current_stream(inputs.device).cuda_stream
        _check(self._lib, self._lib.cuLaunchKernel(
            self._fn, self.sms, 1, 1, NCW * 32 + 32, 1, 1, self.plan.smem,
            ctypes.c_void_p(stream), argv, None), "launching the CUDA step")
        return self.logits


def available() -> bool:
    """True where a CUDA step could run: an sm_90+ GPU and the driver library."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        return False
    try:
        _driver()
    except CudaStepError:
        return False
    return True


__all__ = ["CudaStepError", "DecodeStep", "Plan", "available", "build", "plan"]
