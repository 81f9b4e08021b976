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
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from openjarvis.engine.torch.cache import KVCache
from openjarvis.engine.torch.config import ModelArgs
from openjarvis.engine.torch.model import Transformer

SOURCE = Path(__file__).with_name("csrc") / "decode_step.cu"
#: Consumer warps per block (the producer is one more warp).
NCW = 8
THREADS = NCW * 32 + 32
#: Most attention splits per kv head (the kernel uses one per 32 positions up to this):
#: up to NKV * SPLITS blocks share a layer's attention.
SPLITS = 32
#: Positions per attention tile (``ATILE`` in the source).
ATILE = 128
#: Most bytes of one ring stage; a unit (NCW warps' rows, or a K chunk of them) must fit.
STAGE_BYTES = 28672
#: Trace points per layer of a TRACE build (``NTP`` in the source).
TRACE_POINTS = 28
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


def _pair_wpr(k: int, cap: int, hd: int) -> int:
    """Warps per row pair of the pair kinds (qkv, gate/up): 2 where that puts whole rows in a
    stage and one warp per pair cannot, since copies of whole rows are contiguous and long
    (bulk copies of 1.5 KB row chunks stream at 90 % of what 3 KB ones do: bench_stream.py)."""
    if _chunks(k, 2 * NCW, cap) > 1 and (hd // 2) % (NCW // 2) == 0 and _chunks(k, NCW, cap) == 1:
        return 2
    return 1


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
         extra: dict[str, int] | None = None, sms: int = 132,
         smem_limit: int = SMEM_LIMIT) -> Plan:
    """Rows and K chunks per unit for each matrix, and the deepest ring that fits shared
    memory (see ``Kind`` in the source). ``sms``: the blocks (one per SM) the rows are dealt
    to; ``smem_limit``: the device's opt-in shared memory per block. ``extra``: more macros
    (benchmark experiments), checked like the rest."""
    grp, hd = a.group, a.head_dim
    if hd % 64 or grp > 16 or (hd // 2) % NCW or a.n_ff % NCW:
        raise CudaStepError(f"unsupported shape for the CUDA step: {a}")
    d: dict[str, int] = {}
    stage = 0
    for kind, k, n_rows, pair in (("QKV", a.n_embd, 0, True), ("WO", a.q_dim, a.n_embd, False),
                                  ("13", a.n_embd, 0, True), ("2", a.n_ff, a.n_embd, False),
                                  ("OUT", a.n_embd, a.n_vocab, False)):
        wpr, rpw = (_pair_wpr(k, stage_cap, hd), 2) if pair else _shape(n_rows, k, stage_cap, sms,
                                                                      kind != "OUT")
        nr = NCW // wpr
        nkc = _chunks(k, nr * rpw, stage_cap)
        if not pair:
            d[f"RPW_{kind}"] = rpw
        if kind != "OUT":
            d[f"WPR_{kind}"] = wpr
        d[f"NKC_{kind}"] = nkc
        stage = max(stage, nr * rpw * (k // nkc) * 2)
    extra = extra or {}
    fixed = _fixed_smem(a, {"NCW": NCW, "UB": UB, **d, **extra})
    depth = nstage or min(16, (smem_limit - fixed) // (stage + 16))
    defines = dict(
        DM=a.n_embd, FF=a.n_ff, NH=a.n_head, NKV=a.n_head_kv, HD=hd, NL=a.n_layer,
        NV=a.n_vocab, NCW=NCW, NSTAGE=depth, STAGE_BYTES=stage, SPLITS=SPLITS, ATILE=ATILE, UB=UB,
        **d,
    ) | extra
    if "INFLIGHT" not in extra:  # below the ring's depth, whatever set it
        defines["INFLIGHT"] = min(INFLIGHT, defines["NSTAGE"] - 1)
    return Plan(defines, _check_plan(a, defines, smem_limit))


def _xmax(a: ModelArgs) -> int:
    return max(a.n_embd, a.n_ff, a.q_dim)


#: Most stages a block keeps in flight (issued, not landed): fewer bytes queued in L2 and DRAM
#: make every dependent round trip of the step shorter (``INFLIGHT`` in the source).
INFLIGHT = 2
#: Units a consumer batch takes (``UB`` in the source: one reduction tail a batch).
UB = 4


def _misc_floats(d: dict[str, int]) -> int:
    """Floats of the kernel's ``misc()`` area for macros ``d``: reductions and softmax state at
    0-48, then the cross-warp sums of rows that warps share (2 buffers x NCW warps x UB units x
    the most rows a warp holds in such a kind)."""
    rows = max([2] + [d.get(f"RPW_{k}", 1) for k in ("WO", "2") if d.get(f"WPR_{k}", 1) > 1])
    return 64 + 2 * d["NCW"] * d["UB"] * rows


def _fixed_smem(a: ModelArgs, d: dict[str, int]) -> int:
    """Shared memory besides the ring (each stage and its two mbarriers): the input vector
    (``xs``) and ``misc``."""
    return _xmax(a) * 4 + _misc_floats(d) * 4


def _check_plan(a: ModelArgs, d: dict[str, int], smem_limit: int) -> int:
    """Every assumption the source makes about its macros, on the final macros (defaults and
    overrides alike); returns the dynamic shared memory the kernel lays out."""
    ncw, atile, splits, hd, grp = d["NCW"], d["ATILE"], d["SPLITS"], a.head_dim, a.group
    nct = ncw * 32
    tpp = nct // atile if atile else 0
    problems = []
    if atile <= 0 or nct % atile or tpp & (tpp - 1) or tpp > 32 or (hd // 8) % tpp or atile % ncw:
        problems.append(f"ATILE={atile} must split {nct} threads into a power of two (<= 32) per "
                        f"position and {ncw} warps evenly")
    xmax = _xmax(a)
    if grp * hd + max(grp * atile, ncw * grp * hd) > xmax or 2 * grp * splits > xmax:
        problems.append("the attention's buffers do not fit the input-vector buffer")
    for kind in ("QKV", "WO", "13", "2"):  # warps share rows evenly; qkv pairs stay in a head
        wpr = d[f"WPR_{kind}"]
        if wpr < 1 or ncw % wpr or (kind == "QKV" and (hd // 2) % (ncw // wpr)):
            problems.append(f"WPR_{kind}={wpr} does not split {ncw} warps"
                            + (" or a head's pairs" if kind == "QKV" else ""))
    if not 0 <= d.get("INFLIGHT", 0) < d["NSTAGE"]:
        problems.append(f"INFLIGHT={d.get('INFLIGHT')} must be below NSTAGE={d['NSTAGE']}")
    if grp > 16 or not 1 <= d["UB"] <= 32:
        problems.append(f"UB={d['UB']} must be 1-32 units a batch, and a group at most 16 heads")
    units = (("QKV", a.n_embd, a.qkv_dim), ("13", a.n_embd, 2 * a.n_ff), ("WO", a.q_dim, a.n_embd),
             ("2", a.n_ff, a.n_embd), ("OUT", a.n_embd, a.n_vocab))
    for kind, k, n_rows in units:
        rows = ncw // max(1, d.get(f"WPR_{kind}", 1)) * d.get(f"RPW_{kind}", 2)
        nkc = d[f"NKC_{kind}"]
        if (rows < 1 or nkc < 1 or n_rows % rows or k % nkc or (k // nkc) % 8
                or rows * (k // nkc) * 2 > d["STAGE_BYTES"]):
            problems.append(f"{kind}: units of {rows} rows x {k // max(nkc, 1)} columns do not tile "
                            f"the matrix in {d['STAGE_BYTES']}-byte stages")
    smem = d["NSTAGE"] * (d["STAGE_BYTES"] + 16) + _fixed_smem(a, d)
    if d["NSTAGE"] < 2 or smem > smem_limit:
        problems.append(f"{d['NSTAGE']} stages need {smem} bytes of shared memory "
                        f"(this GPU gives a block {smem_limit})")
    if problems:
        raise CudaStepError("cannot plan the CUDA step: " + "; ".join(problems))
    return smem


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


def _compile_nvrtc(lib: ctypes.CDLL, src: str, opts: list[str], name: str) -> bytes:
    prog = ctypes.c_void_p()
    ok = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{name}.cu".encode(), 0, None,
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


def _compile_nvcc(nvcc: str, src: str, opts: list[str], name: str) -> bytes:
    with tempfile.TemporaryDirectory() as d:  # the source by its name: errors point into it
        out, path = Path(d) / f"{name}.cubin", Path(d) / f"{name}.cu"
        path.write_text(src)
        cmd = [nvcc, "-cubin", *opts, "-o", str(out), str(path)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode:
            raise CudaStepError("nvcc could not compile the CUDA step: " + proc.stderr[-2000:])
        return out.read_bytes()


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    return found or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


def _nvrtc_version(lib: ctypes.CDLL) -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"nvrtc {major.value}.{minor.value}"


def _nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    return "nvcc " + (out.strip().splitlines() or ["?"])[-1]


def with_ptx_helpers(src: str) -> str:
    """CUDA source ``src`` with decode_step.cu's ``<ptx-helpers>`` block (mbarriers, bulk
    copies, the ring's layout in shared memory) in place of its ``// @PTX_HELPERS@`` line: the
    benchmarks' probe kernels run the decode kernel's own copy code, not a copy of it."""
    decode = SOURCE.read_text()
    start, end = decode.index("// <ptx-helpers>"), decode.index("// </ptx-helpers>")
    return src.replace("// @PTX_HELPERS@\n", decode[start:end], 1)


def build(p: Plan, arch: str = "sm_90", compiler: str = "auto") -> tuple[bytes, str]:
    """The cubin for ``p``, and how it was had ("nvrtc", "nvcc", or either + " (cached)")."""
    return compile_cached(SOURCE.read_text(), p.defines, arch, compiler, "decode_step")


def compile_cached(src: str, macros: dict[str, int], arch: str, compiler: str = "auto",
                   name: str = "kernel") -> tuple[bytes, str]:
    """The cubin of CUDA source ``src`` with ``macros`` for ``arch``, and how it was had
    ("nvrtc", "nvcc", or either + " (cached)"); the decode step and the benchmarks' probes.

    ``compiler``: "auto" (NVRTC where found, else nvcc), "nvrtc" or "nvcc". The cache key is
    the source, the macros, the target, the compiler and its version and options, so a binary
    is never reused across any of them."""
    defs = [f"-D{k}={v}" for k, v in sorted(macros.items())]
    lib = _nvrtc() if compiler in ("auto", "nvrtc") else None
    nvcc = _nvcc() if lib is None and compiler in ("auto", "nvcc") else None
    if lib is not None:
        kind, version, opts = "nvrtc", _nvrtc_version(lib), [f"--gpu-architecture={arch}", "-std=c++17"]
    elif nvcc is not None:
        kind, version, opts = "nvcc", _nvcc_version(nvcc), [f"-arch={arch}", "-O3"]
    else:
        wanted = "NVRTC" if compiler == "nvrtc" else "nvcc" if compiler == "nvcc" else "a CUDA compiler"
        raise CudaStepError(f"no {wanted} found: install PyTorch's CUDA wheels (NVRTC) or the CUDA toolkit")
    key = hashlib.sha256("\0".join([src, *defs, arch, version, *opts]).encode()).hexdigest()[:24]
    cached = _cache_dir() / f"{name}-{key}.cubin"
    if cached.is_file():
        return cached.read_bytes(), f"{kind} (cached)"
    if lib is not None:
        cubin = _compile_nvrtc(lib, src, [*opts, *defs], name)
    else:
        assert nvcc is not None
        cubin = _compile_nvcc(nvcc, src, [*opts, *defs], name)
    try:  # a cache that cannot be written only costs the next start a compile
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(cubin)
        tmp.replace(cached)
    except OSError:
        pass
    return cubin, kind


# -- loading and launching through the driver API --------------------------------------------


_POINTERS = ("wtab", "emb", "out_w", "out_norm", "inputs", "rope", "kc", "vc", "h", "q", "attn",
             "act", "part", "logits", "counters", "trace")


class _Params(ctypes.Structure):
    """The kernel's ``Params``, field for field (passed by value as its one argument)."""

    _fields_ = [  # noqa: RUF012  # ctypes reads the class attribute
        *((n, ctypes.c_uint64) for n in _POINTERS),
        ("cache_s", ctypes.c_int64), ("eps", ctypes.c_float), ("scale", ctypes.c_float)]


class _LaunchAttr(ctypes.Structure):
    """``CUlaunchAttribute``: an id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),  # noqa: RUF012
                ("rest", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` of ``cuLaunchKernelEx``."""

    _fields_ = [  # noqa: RUF012
        ("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
        ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
        ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttr)), ("n_attrs", ctypes.c_uint)]


#: ``CU_LAUNCH_ATTRIBUTE_COOPERATIVE``: the driver starts every block at once or refuses.
_COOPERATIVE = 2


#: ``cuFuncSetAttribute``'s attributes used here: the dynamic shared memory a launch may ask
#: for, and the preferred share of L1 as shared memory (%).
FUNC_MAX_DYNAMIC_SHARED = 8
FUNC_CARVEOUT = 9


def set_function_attribute(fn: int | ctypes.c_void_p, attr: int, value: int, what: str) -> None:
    """``cuFuncSetAttribute`` on a loaded kernel (this module's or a compiled Triton kernel's
    ``function`` handle); a failure raises ``CudaStepError`` saying ``what`` was tried."""
    lib = _driver()
    handle = fn if isinstance(fn, ctypes.c_void_p) else ctypes.c_void_p(fn)
    _check(lib, lib.cuFuncSetAttribute(handle, attr, ctypes.c_int(value)), what)


#: ``CU_LIMIT_PERSISTING_L2_CACHE_SIZE``: the part of L2 set aside for persisting
#: (``evict_last``) lines.
LIMIT_PERSISTING_L2 = 0x06
#: ``CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE``: the largest set-aside a device grants.
ATTR_MAX_PERSISTING_L2 = 108


def _context_driver() -> ctypes.CDLL:
    """The driver library, with the runtime's primary context current (the synchronize makes
    it so): the context-wide calls below act on the context PyTorch's kernels run in."""
    torch.cuda.init()  # type: ignore[no-untyped-call]
    torch.cuda.synchronize()
    return _driver()


def _device_attribute(lib: ctypes.CDLL, attr: int, what: str) -> tuple[int, int]:
    """(the current context's device, its attribute ``attr``)."""
    dev, value = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.cuCtxGetDevice(ctypes.byref(dev)), "reading the context's device")
    _check(lib, lib.cuDeviceGetAttribute(ctypes.byref(value), attr, dev), f"reading {what}")
    return dev.value, value.value


def max_persisting_l2() -> int:
    """The largest persisting L2 set-aside the current context's device grants, in bytes."""
    return _device_attribute(_context_driver(), ATTR_MAX_PERSISTING_L2,
                             "the largest L2 set-aside")[1]


def set_persisting_l2(nbytes: int) -> int:
    """Set aside ``nbytes`` of L2 for persisting (``evict_last``) lines in the current context
    (0: none, the default); returns the size the driver granted, which it rounds up to its
    granularity (24 MiB asked: 26.25 on the H200); more than the device's
    ``persistingL2CacheMaxSize`` is refused with ValueError (the driver's own answer is only
    "invalid argument").
    With it, ``evict_last`` lines mostly survive a normal-priority stream (about 77 % of a 6 MB
    set through 400 MB, ``scripts/bench_l2_keep.py`` run 300); with none, fewer do (about 40 %).
    Context-wide: it holds for every kernel launched in this context after the call; lines left
    persisting before it are made normal. It synchronizes the device, so it cannot be called
    while a stream is capturing a graph: call it before capture."""
    if nbytes < 0:
        raise ValueError(f"a persisting L2 set-aside is bytes >= 0, not {nbytes}")
    lib = _context_driver()
    _, most = _device_attribute(lib, ATTR_MAX_PERSISTING_L2, "the largest L2 set-aside")
    if nbytes > most:  # (refused before anything changes)
        raise ValueError(f"a persisting L2 set-aside of {nbytes} bytes is more than this GPU "
                         f"grants ({most} bytes, {most / 2**20:.2f} MiB): ask for less")
    # (lines left persisting would otherwise hold the set-aside)
    _check(lib, lib.cuCtxResetPersistingL2Cache(), "resetting persisting L2 lines")
    _check(lib, lib.cuCtxSetLimit(LIMIT_PERSISTING_L2, ctypes.c_size_t(nbytes)),
           f"setting aside {nbytes} bytes of L2")
    got = ctypes.c_size_t()
    _check(lib, lib.cuCtxGetLimit(ctypes.byref(got), LIMIT_PERSISTING_L2),
           "reading the L2 set-aside")
    return got.value


#: ``CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW``, a stream attribute too; the properties of
#: ``CUaccessProperty``; ``CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE``.
ATTR_ACCESS_POLICY_WINDOW = 1
ACCESS_NORMAL, ACCESS_STREAMING, ACCESS_PERSISTING = 0, 1, 2
ATTR_MAX_WINDOW = 109


class _AccessPolicyWindow(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t),
                ("hitRatio", ctypes.c_float), ("hitProp", ctypes.c_int),
                ("missProp", ctypes.c_int)]


class _StreamAttrValue(ctypes.Union):
    _fields_ = [("window", _AccessPolicyWindow), ("pad", ctypes.c_char * 64)]


def stream_window(stream: int, base: int, nbytes: int, prop: int = ACCESS_STREAMING) -> int:
    """Give every L2 access that later work on ``stream`` (a CUstream handle) makes to
    [``base``, ``base`` + ``nbytes``) the property ``prop``, whatever the instructions' own
    hints; ``nbytes`` 0 clears the window. Returns the bytes covered: at most the device's
    largest window (the first bytes of a larger range). No synchronization, so it can be
    called while ``stream`` is capturing a graph.

    Why (session 36): on Triton 3.6 pipelined loads lose their ``evict_first`` hint (session
    34); a window marks lines streaming from outside the kernel, and does reach those
    ``cp.async`` loads, in a captured graph too (``bench_l2_keep.py --restream``, run 309).
    ``Runner.out_window`` (commit 5fbfeea holds it) marked the 0.5B's int8 screen so and
    gained nothing (run 308)."""
    if nbytes < 0 or prop not in (ACCESS_NORMAL, ACCESS_STREAMING, ACCESS_PERSISTING):
        raise ValueError(f"an access policy window is bytes >= 0 with a CUaccessProperty, not "
                         f"{nbytes} bytes, property {prop}")
    lib = _driver()  # (no synchronize: the stream may be capturing)
    dev, most = _device_attribute(lib, ATTR_MAX_WINDOW, "the largest access policy window")
    n = min(nbytes, most)
    v = _StreamAttrValue()
    v.window = _AccessPolicyWindow(base if n else None, n, 1.0 if n else 0.0, prop,
                                   ACCESS_NORMAL if prop == ACCESS_PERSISTING else prop)
    _check(lib, lib.cuStreamSetAttribute(ctypes.c_void_p(stream), ATTR_ACCESS_POLICY_WINDOW,
                                         ctypes.byref(v)), "setting an access policy window")
    return n


def stream_window_of(stream: int) -> tuple[int, int, float, int]:
    """(base, bytes, hit ratio, hit property) of ``stream``'s access policy window."""
    lib = _driver()
    v = _StreamAttrValue()
    _check(lib, lib.cuStreamGetAttribute(ctypes.c_void_p(stream), ATTR_ACCESS_POLICY_WINDOW,
                                         ctypes.byref(v)), "reading an access policy window")
    w = v.window
    return int(w.base_ptr or 0), int(w.num_bytes), float(w.hitRatio), int(w.hitProp)


def load_function(lib: ctypes.CDLL, module: ctypes.c_void_p, name: str, smem: int,
                  threads: int, carveout: int | None = None) -> tuple[ctypes.c_void_p, int]:
    """Kernel ``name`` of a loaded module, allowed ``smem`` bytes of dynamic shared memory
    (``carveout``: the % of L1 it prefers as shared memory), and how many of its blocks of
    ``threads`` fit one SM (in the current context)."""
    fn, occ = ctypes.c_void_p(), ctypes.c_int()
    _check(lib, lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()),
           f"finding {name}")
    _check(lib, lib.cuFuncSetAttribute(fn, FUNC_MAX_DYNAMIC_SHARED, smem),
           "reserving shared memory")
    if carveout is not None:
        _check(lib, lib.cuFuncSetAttribute(fn, FUNC_CARVEOUT, carveout), "setting the carveout")
    _check(lib, lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(occ), fn, threads, ctypes.c_size_t(smem)), "reading occupancy")
    return fn, occ.value


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
    """The compiled kernel bound to one model's weights, RoPE table and KV cache.

    ``blocks``: the grid (default one block per SM; fewer for tests of other GPUs' shapes).
    ``cooperative``: launch so that the driver starts every block at once or refuses (the
    grid barriers would spin forever on a block that never starts: another process's kernels
    under MPS, a partitioned GPU); a plain launch otherwise."""

    def __init__(self, model: Transformer, cache: KVCache, *, compiler: str = "auto",
                 nstage: int = 0, stage_cap: int = STAGE_BYTES,
                 extra: dict[str, int] | None = None, blocks: int = 0,
                 cooperative: bool = True) -> None:
        dev = model.device
        if dev.type != "cuda":
            raise CudaStepError("the CUDA step needs a CUDA device")
        cap = torch.cuda.get_device_capability(dev)
        if cap[0] < 9:
            raise CudaStepError(f"the CUDA step needs sm_90 or newer (this GPU is sm_{cap[0]}{cap[1]})")
        if model.dtype != torch.bfloat16:
            raise CudaStepError("the CUDA step runs bfloat16 weights only")
        a = self.args = model.args
        props = torch.cuda.get_device_properties(dev)
        self.device = dev
        self.blocks = blocks or props.multi_processor_count
        self.cooperative = cooperative
        smem_limit = int(getattr(props, "shared_memory_per_block_optin", SMEM_LIMIT))
        self.plan = plan(a, stage_cap, nstage, extra, self.blocks, smem_limit)
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
            if not t.is_contiguous() or t.data_ptr() % 16 or t.device != dev:
                raise CudaStepError("the CUDA step needs contiguous, 16-byte aligned tensors on "
                                    "the model's device")
        self.wtab = torch.tensor(rows, dtype=torch.int64).to(dev)
        #: TRACE builds (benchmarks): [layer + head, point, block] %globaltimer stamps (ns)
        self.trace: torch.Tensor | None = None
        if self.plan.defines.get("TRACE"):
            self.trace = torch.zeros(a.n_layer + 1, TRACE_POINTS, self.blocks, dtype=torch.int64,
                                     device=dev)
        # The kernel reads these addresses: hold the tensors themselves, so that a later
        # re-layout of the model (megakernel.stack_layers) cannot free memory under it.
        self._keep = (model, cache, tensors)
        self._params = _Params(
            wtab=self.wtab.data_ptr(), emb=w.tok_emb.data_ptr(), out_w=w.out.data_ptr(),
            out_norm=w.out_norm.data_ptr(), inputs=0, rope=model.rope.data_ptr(),
            kc=cache.k.data_ptr(), vc=cache.v.data_ptr(), h=self.h.data_ptr(),
            q=self.q.data_ptr(), attn=self.attn.data_ptr(), act=self.act.data_ptr(),
            part=self.part.data_ptr(), logits=self.logits.data_ptr(),
            counters=self.counters.data_ptr(),
            trace=0 if self.trace is None else self.trace.data_ptr(),
            cache_s=cache.capacity, eps=a.rms_eps,
            scale=a.head_dim**-0.5)
        self._lib = _driver()
        with torch.cuda.device(dev):  # the driver calls below use the current context
            torch.cuda.current_stream(dev).synchronize()  # the primary context exists now
            mod = ctypes.c_void_p()
            _check(self._lib, self._lib.cuModuleLoadData(ctypes.byref(mod), self.cubin),
                   "loading the CUDA step")
            self._module: ctypes.c_void_p | None = mod
            fn, occ = load_function(self._lib, mod, "decode_step", self.plan.smem, THREADS)
            self._fn: ctypes.c_void_p | None = fn
        if occ < 1 or self.blocks > occ * props.multi_processor_count:
            raise CudaStepError(f"{self.blocks} blocks of the CUDA step do not fit this GPU at once")
        self._attr = _LaunchAttr(id=_COOPERATIVE, value=1)

    def close(self) -> None:
        """Unload the kernel's module (the GPU memory of its code). Only once nothing can
        launch it any more: no CUDA graph captured with this step may be replayed after
        (``Runner.use_cuda_step`` drops its one-token graph first). Waits for the device's
        queued work, which may still be running the kernel. A closed step refuses to run."""
        if self._module is None:
            return
        torch.cuda.synchronize(self.device)
        with torch.cuda.device(self.device):
            _check(self._lib, self._lib.cuModuleUnload(self._module), "unloading the CUDA step")
        self._module = self._fn = None

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        """Run one token: ``inputs`` is int64 ``[2]`` (position, token) on the device; returns
        the logits ``[1, V]`` (a buffer the next call overwrites)."""
        if self._fn is None:
            raise CudaStepError("this CUDA step was closed; build a new one")
        self.counters.zero_()
        self._params.inputs = inputs.data_ptr()
        argv = (ctypes.c_void_p * 1)(ctypes.c_void_p(ctypes.addressof(self._params)))
        with torch.cuda.device(self.device):
            stream = ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)
            if self.cooperative:
                cfg = _LaunchConfig(self.blocks, 1, 1, THREADS, 1, 1, self.plan.smem, stream,
                                    ctypes.pointer(self._attr), 1)
                rc = self._lib.cuLaunchKernelEx(ctypes.byref(cfg), self._fn, argv, None)
            else:
                rc = self._lib.cuLaunchKernel(self._fn, self.blocks, 1, 1, THREADS, 1, 1,
                                              self.plan.smem, stream, argv, None)
        _check(self._lib, rc, "launching the CUDA step")
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
