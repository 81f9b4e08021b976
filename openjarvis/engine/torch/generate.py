"""The step runner: evaluate T tokens at a position, fast, with one CUDA graph per T.

``Runner.logits(tokens, start)`` appends ``tokens`` at ``start`` to the static KV cache and
returns their logits; ``Runner.argmax`` returns only each token's greedy next token, from steps
of their own whose output projection never writes the logits. Two implementations of the
forward pass share the cache and the weights:

- ``"triton"``: the fused kernels of ``kernels.py`` over fixed per-T workspaces (6 launches per
  layer). Positions are read from a device scalar, so the graph captured for T serves every
  position; prompts longer than ``MAX_STEP`` run in chunks of ``MAX_STEP``, and on the GPU a
  prompt's runs whose last token alone is asked for in wide steps of 1,024 to 128 tokens
  (``Runner.wide``: cuBLAS products).
- ``"torch"``: the reference forward of ``model.py`` (cuBLAS, SDPA); captured with attention over
  the whole cache under a position mask, or run eagerly over only the live positions.

Graphs are captured lazily, on the first call with a given T, and kept on the Runner.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import torch

from openjarvis.engine.torch.cache import SLACK, KVCache
from openjarvis.engine.torch.model import Transformer

if TYPE_CHECKING:  # importing megakernel imports triton: only where the step is used
    from openjarvis.engine.torch.cuda_step import DecodeStep
    from openjarvis.engine.torch.kernels import LinearConfig, OutScreen, ScreenBuffers
    from openjarvis.engine.torch.megakernel import MegaConfig, Scratch

_R = TypeVar("_R")
Kernels = Literal["triton", "torch"]
StepPath = Literal["cuda_step", "mega", "triton", "torch"]

#: Largest T run as one fixed-shape step (a k=16 verify is 17 tokens; prefill chunks are this).
MAX_STEP = 32
#: ``Runner.host``: results this large or larger come down through page-locked memory (a
#: logits row is 600 KB; token ids are bytes), up to ``PINNED_MAX_BYTES`` (the caching host
#: allocator keeps its blocks: a long prompt's logits would stay pinned for good).
PINNED_MIN_BYTES = 64 * 1024
PINNED_MAX_BYTES = 32 * 2**20
#: Longest ``Runner.draft`` chain in one graph (a k = 16 draft's 15 steps after its first);
#: longer drafts run as several.
MAX_CHAIN = 16
#: Sequence splits of the decode attention (grid = n_head_kv x NSPLIT programs).
NSPLIT = 64
#: Tokens of the narrowest wide step (``Runner.wide_widths``): a run of 128 is wide enough for
#: the matrix engines (``MAX_STEP``'s 32-token steps read every weight four times a run,
#: through kernels tiled for a verify step's few tokens). Runs shorter than this keep those
#: steps. ``prefix_cache.RUN`` is a multiple of it.
WIDE_STEP = 128
#: Tokens of the widest step on the GPU, and so of a GPU engine's runs (``TorchEngine.
#: prefill_run``): a step of 1,024 reads each weight once for 1,024 tokens, where the products
#: become compute-bound. Runs of 128, 256, 512 and 1,024 (H200, random weights, a prompt of
#: 4,096 in runs of the step's width; scripts/bench_wide.py --ways, run 325): the 1.5B 71.4,
#: 46.6, 37.1 and 33.8 ms, the 0.5B 44.8, 29.8, 20.7 and 17.5. A run of 1,024 takes 7-9 ms, so
#: a cancel still lands at once.
WIDE_MAX = 1024
#: The wide attention's splits of the sequence times the step's tokens: 8 splits for 128, 1 for
#: 1,024. The float32 partials of a step's heads, written and merged, cost more than the
#: parallelism they buy once the step's own query blocks fill the GPU (the last t of 4,096
#: tokens, µs, scripts/bench_wide.py --sweep-attention, runs 320 and 326: the 1.5B at 128
#: 20.5 in 8 splits, 24.6 in 16, 32.7 in 4; at 256 34.3 in 4, 37.4 in 8; at 512 61.3 in 2,
#: 72.9 in 8; at 1,024 116.0 in 1, 151.3 in 8; the 0.5B alike).
WIDE_SPLIT_TOKENS = 1024
WIDE_BLOCK_S = 64


def wide_nsplit(t: int) -> int:
    """Splits of the sequence for a wide step of ``t`` tokens (``WIDE_SPLIT_TOKENS``): a power
    of two, at least 1."""
    return 1 << (max(1, WIDE_SPLIT_TOKENS // max(1, t)).bit_length() - 1)


def verify_floors(caps: dict[str, int], device: torch.device) -> dict[tuple[str, bool], int]:
    """``Runner.smem_floor`` entries of verify steps for ``caps`` ({kernel: programs an SM},
    ``tuning.VERIFY_SMEM_CAPS``) on this GPU: each the shared memory a program that lets at
    most that many share one of its SMs. Empty where the caps were not measured (they were on
    an sm_90 GPU, the H200), where the floor cannot be set here (``kernels.floor_supported``)
    or where a floor exceeds what one program may ask for: the steps then run unfloored, as
    fast as before the caps were measured."""
    if not caps or device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
        return {}
    from openjarvis.engine.torch.kernels import floor_supported, shared_floor_for

    props = torch.cuda.get_device_properties(device)
    per_sm = getattr(props, "shared_memory_per_multiprocessor", 0)
    per_block = getattr(props, "shared_memory_per_block_optin", 0)
    if not per_sm or not floor_supported():
        return {}
    floors = {(k, True): shared_floor_for(n, per_sm) for k, n in caps.items()}
    return floors if max(floors.values()) <= per_block else {}


#: PDL mode per T where supported (see ``Runner.pdl``; verify steps take theirs per kernel
#: from ``tuning.VERIFY_PDL``), measured in docs/gpu-notes.md. One-token kernels let the next
#: one launch after their main loop (``PDL_LATE``), except those in ``DEFAULT_ONE_TOKEN_PDL``
#: (session 6 runs 53-54: 1.5B -4.3 to -5.3 %, 0.5B -5.9 to -7.4 % against launching every
#: next kernel at the start).
DEFAULT_PDL_BY_T = {1: 1 + 4}  # 4: kernels.PDL_LATE (kernels imports triton; this may not)
#: Kernels of the one-token step that let the next kernel launch at their start: the
#: attention (its merge is tiny), the merge and the down-projection, whose successors (wo,
#: qkv) load all their weights before they wait, overlapping this kernel; and gate/up, whose
#: successor, the down-projection, loads its first weight tile before it waits (mode 2): its
#: programs take SM slots as gate/up's leave and read during gate/up's tail (session 12 runs
#: 116-117: 1.5B -0.7 / -0.8 %, 0.5B -0.4 / -1.1 % @512 / @4096; either change alone +0.9 to
#: +1.4 % or even).
DEFAULT_ONE_TOKEN_PDL = {"attn": 1, "combine": 1, "w13": 1, "w2": 2}


class _Inputs:
    """A step's ``inputs`` [1 + T] int64, the start position then the tokens, as its kernels
    read them (one host-to-device copy a call, or a graph's first node)."""

    __slots__ = ()
    inputs: torch.Tensor

    @property
    def start(self) -> torch.Tensor:
        return self.inputs[:1]

    @property
    def tokens(self) -> torch.Tensor:
        return self.inputs[1:]


@dataclass(slots=True)
class Workspace(_Inputs):
    """The buffers of one T: its inputs and results, and its scratch and logits (views of the
    Runner's buffers every step shares, ``Runner._scratch``, unless T keeps its own)."""

    inputs: torch.Tensor  # [1 + T] int64: start position, then the tokens
    h: torch.Tensor  # [T, D] float32 residual stream
    q: torch.Tensor  # [T, H, hd] float32
    o_part: torch.Tensor  # [NSPLIT, T, H, hd] float32
    ml_part: torch.Tensor  # [NSPLIT, T, H, 2] float32
    attn: torch.Tensor  # [T, q_dim]
    act: torch.Tensor  # [T, F]
    logits: torch.Tensor  # [T, V] float32 ([0] in a greedy Triton step: never written)
    graph: torch.cuda.CUDAGraph | None = None
    #: A greedy step (``Runner.argmax``): its result is ``ids`` [T] int64, the first column of
    #: each token's largest logit among the first ``Runner.greedy_cols``; the Triton path
    #: writes only the output projection's per-program maxima (``partials``), never the logits.
    greedy: bool = False
    ids: torch.Tensor | None = None
    partials: torch.Tensor | None = None
    #: ``Runner.screen_out``: x's int8 limbs and statistics, the screen's bounds and the
    #: rescoring's partials (``partials`` is their ``partials``).
    screen: ScreenBuffers | None = None
    #: ``Runner.graph_io``: the page-locked inputs the graph copies in as its first node, the
    #: greedy step's token ids in page-locked memory (its merge kernel writes them there, or
    #: a copy node after it: ``Runner.host_ids_direct``), and the event of the last replay
    #: (the host rewrites ``host_in`` only once the replay before has read it).
    host_in: torch.Tensor | None = None
    host_ids: torch.Tensor | None = None
    replayed: torch.cuda.Event | None = None
    #: ``Runner.draft`` (set while a chain is captured): where the merge kernel also writes
    #: its token, the next step's input.
    feed: torch.Tensor | None = None
    #: Which forward pass runs this T (``Runner._run``): fixed when the workspace is built. A
    #: name rather than a closure, so nothing in the workspace refers back to it or the Runner
    #: and a dropped step (its CUDA graph) is freed at once, never by a garbage collection that
    #: might land inside another capture and fail it (seen on the H200, session 6 run 53).
    path: StepPath = "torch"
    #: The single-launch step's buffers (``megakernel.py``), when that path runs this T.
    mega: Scratch | None = None
    #: [T, qkv_dim] float32 zeros: the split-K qkv accumulator of verify steps (``qkv_split``).
    qkv_acc: torch.Tensor | None = None
    #: The o-projection's hand-off to gate/up (``Runner.norm_handoff``, ``verify_handoff``):
    #: x * g (float32 in one-token steps, the weights' dtype in verify steps) and per-program
    #: sums of squares.
    xg: torch.Tensor | None = None
    ss_part: torch.Tensor | None = None
    #: Verify steps' split-K o-projection: its arrival count per column block (int32 zeros
    #: between launches; ``kernels.NormHandoff``).
    hand_count: torch.Tensor | None = None


@dataclass(slots=True)
class Chain:
    """``Runner.draft``'s graph of n greedy one-token steps, over the one-token greedy step's
    workspace: step j reads row j of ``dev_in`` (position, token) and its merge kernel writes
    its token into row j + 1 and into ``host_out[j]``."""

    host_in: torch.Tensor  # [n, 2] int64 page-locked: the positions and the first token
    dev_in: torch.Tensor  # [n, 2] int64: the graph's copy of it, fed forward on the GPU
    host_out: torch.Tensor  # [n] int64 page-locked: each step's greedy token
    graph: torch.cuda.CUDAGraph
    replayed: torch.cuda.Event
    #: The workspace the graph runs over, held so its buffers (views of the shared scratch
    #: where the one-token step has none of its own) outlive any rebuilt step's.
    ws: Workspace | None = None


@dataclass(slots=True)
class Wide(_Inputs):
    """A wide step's buffers (``Runner.wide_widths``), T tokens: views of the Runner's one
    arena for every width; the products' inputs and outputs in the weights' dtype (cuBLAS),
    the residual in float32."""

    inputs: torch.Tensor  # [1 + T] int64: start position, then the tokens
    h: torch.Tensor  # [T, D] float32 residual stream
    xg: torch.Tensor  # [T, D]: h * g, the products' input (1/RMS is applied after them)
    inv: torch.Tensor  # [T] float32: each row's 1/RMS (``kernels.residual_norm``)
    qkv: torch.Tensor  # [T, qkv_dim]
    q: torch.Tensor  # [T, H, hd] float32
    o_part: torch.Tensor  # [wide_nsplit(T), T, H, hd] float32
    ml_part: torch.Tensor  # [wide_nsplit(T), T, H, 2] float32
    attn: torch.Tensor  # [T, q_dim]
    out: torch.Tensor  # [T, D]: the o-projection's and the down projection's product
    gu: torch.Tensor  # [T, 2F]
    act: torch.Tensor  # [T, F]
    row: torch.Tensor  # [1, V] float32: the last token's logits (``Runner._wide_last``)
    graph: torch.cuda.CUDAGraph | None = None


class FfnHook(Protocol):
    """``Runner.ffn_hook``: called by a one-token step on the GPU as it is built (and so as
    its graph is captured)."""

    def begin(self, ws: Workspace) -> None:
        """Before the first layer."""

    def fork(self, i: int, layer: Any, ws: Workspace) -> None:
        """At layer ``i``'s start, instead of the L2 prefetch, on the step's side stream (the
        current one), which waits for everything launched so far and which the step joins
        at its end."""

    def gate_up(self, i: int, layer: Any, ws: Workspace, hand: Any) -> None:
        """On the current stream, in gate/up's place (``hand``: the o-projection's
        ``kernels.NormHandoff``); ``ws.act`` must hold silu(gate) * up when the down
        projection's PDL wait returns."""


class Runner:
    """Owns the cache and the per-T steps of one model on one device."""

    def __init__(
        self,
        model: Transformer,
        n_ctx: int,
        *,
        kernels: Kernels | None = None,
        graphs: bool | None = None,
        nsplit: int = NSPLIT,
    ) -> None:
        self.model = model
        self.args = model.args
        self.device = model.device
        on_cuda = self.device.type == "cuda"
        self.kernels: Kernels = kernels or ("triton" if on_cuda and _has_triton() else "torch")
        self.graphs = on_cuda if graphs is None else graphs and on_cuda
        self.nsplit = nsplit
        self.cache = KVCache(self.args, n_ctx, model.dtype, self.device)
        if model.rope.shape[0] < self.cache.capacity:
            raise ValueError("the RoPE table is shorter than the cache")
        self._steps: dict[int, Workspace] = {}
        self._greedy_steps: dict[int, Workspace] = {}  # ``argmax``'s, by T
        #: Every step's scratch (h, q, the attention's partials, attn, act) and logits as views
        #: of one buffer a kind (``_scratch``): steps run one at a time on one stream, each
        #: writes its scratch before reading it, and the logits are valid until the next call
        #: (``logits``; the engine copies them at once, ``host``). With a buffer a step the 64
        #: captured steps held 772 MiB of the 1.5B's GPU memory and 584 MiB of the 0.5B's; shared,
        #: 48 and 38 (session 25 run 223). Off: a buffer a step, as before (bench_startup.py
        #: compares).
        self.shared_scratch = True
        #: Step sizes whose buffers stay their own: the one-token step, the decode loop's, ran
        #: 0.3 % slower @4096 (1.5B) on views of the shared buffers (runs 222-224: -0.46, -0.29,
        #: -0.31 % with its own; an A/A of the default in the same place +0.04 %; @512 and the
        #: verify steps even). Its buffers are 1/528 of the whole (1.4 MiB for the 1.5B).
        self.own_scratch_t: frozenset[int] = frozenset({1})
        self._arena: dict[str, torch.Tensor] = {}
        self._chains: dict[int, Chain] = {}  # ``draft``'s, by length
        #: A prompt's runs of this many tokens (0: none) in one wide step (``Wide``), when only
        #: the last token's logits or greedy token are asked for (``logits``, ``argmax`` with
        #: ``last_only``: how a prompt is read); what is left of a run in narrower ones
        #: (``wide_widths``). Its products go through cuBLAS and its attention through
        #: ``kernels.attention_wide``; the rest of a run keeps the ``MAX_STEP`` steps. On by
        #: default on the GPU's Triton path (``WIDE_MAX``), where a run of 128 took four
        #: 32-token steps before. A run read this way and in smaller steps leaves the same K/V
        #: to float rounding, not to the bit: a GPU engine reads a prompt in runs of this
        #: (``TorchEngine.prefill_run``) wherever its state is saved. The steps' buffers, one
        #: arena outside the shared scratch, by their shapes at 1,024: 84.2 MiB for the 1.5B,
        #: 47.2 for the 0.5B.
        self._wide_t = 0
        self._wides: dict[int, Wide] = {}  # by width (``wide_widths``)
        self._wide_arena: dict[str, torch.Tensor] = {}  # their buffers (``_wide_ws``)
        self._wide: Wide | None = None  # the last wide step run: ``_wide_last`` reads its h
        self._greedy_cols = self.args.n_vocab
        #: Greedy Triton steps pick their token through ``kernels.OutScreen``: the output
        #: matrix read as int8 (half its bytes) for each logit's bounds, then the few rows whose
        #: bound reaches the top read exactly; the same token as reading every row in bfloat16
        #: (up to float32 rounding between near-equal logits), for one int8 copy of the output
        #: matrix in memory (234 MB for the 1.5B, 136 for the 0.5B). On by default on GPUs of
        #: sm_80+ for the shapes in ``tuning.SCREEN_OUT`` (the 1.5B: its one-token step 0.96x,
        #: session 33 run 278; the 0.5B since session 36: 1.003x @512, 0.962x @4096, run 314;
        #: docs/gpu-notes.md); off elsewhere (on the CPU the interpreter's float path only
        #: costs). Set it before the first greedy step (or ``drop_steps`` after): a built step
        #: keeps the path it was built with; ``drop_steps`` with it off frees the int8 copy.
        self.screen_out = False
        self._screen: tuple[int, OutScreen] | None = None  # (greedy_cols, its OutScreen)
        #: On the GPU, ``host`` brings results of ``PINNED_MIN_BYTES`` or more (logits) down
        #: through page-locked memory.
        self.pinned_io = on_cuda
        self._graph_io = self.graphs
        #: With ``graph_io``, the Triton greedy step's merge kernel writes the token ids into
        #: page-locked host memory itself, instead of a copy node after it.
        self.host_ids_direct = True
        self._pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self._side: torch.cuda.Stream | None = None  # ``_graph``'s warm-up runs
        #: Tiles per (matrix, T): "wo", "w13", "w2", "out" -> LinearConfig; "qkv" -> (block_p,
        #: block_k). Filled by tuning (scripts/bench_gpu.py); defaults where absent.
        self.linear_configs: dict[tuple[str, int], object] = {}
        self.attn_block_s = 64
        #: T > 1: (splits, keys per block) of the attention where they differ from the
        #: one-token step's (``nsplit``, ``attn_block_s``); None: the same.
        self.verify_attention: tuple[int, int] | None = None
        #: Warps of each program of the attention's merge, per T (absent: 1; the 1.5B's verify
        #: merge had 2 until it spread over ``combine_cols``, session 16 runs 158-160).
        self.combine_warps: dict[int, int] = {}
        self.rope_warps: dict[int, int] = {}
        #: Warps of each (kv head, split) program of the attention, per T (absent: 4; query
        #: tiles over 32 rows always take 8).
        self.attn_warps: dict[int, int] = {}
        #: Warps of each program of the per-pair qkv kernel, per T (absent: 4; on the GPU
        #: ``tuning.QKV_WARPS``). Its block reductions (the norm's squares, each
        #: pair's two dot products) cross warps through shared memory and a barrier, which a
        #: program of one warp does with shuffles alone.
        self.qkv_warps: dict[int, int] = {}
        #: Programs of the attention's merge a (token, head), per T (absent: 1), each merging
        #: head_dim / this columns (``kernels.attention``'s ``combine_cols``; a one-token step
        #: with ``fuse_attn_out`` merges inside the o-projection instead). On the GPU
        #: ``tuning.COMBINE_COLS``.
        self.combine_cols: dict[int, int] = {}
        #: T = 1: merge the attention splits inside the o-projection (one launch fewer per
        #: layer; float atomics into the residual, so the last bits vary from run to run).
        self.fuse_attn_out = False
        #: The attention's merge reads only the splits that hold keys (``kernels.attention``).
        self.trim_merge = True
        #: T = 1: the o-projection hands the feed-forward norm to gate/up (``kernels.NormHandoff``)
        #: instead of gate/up normalizing h inside its K loop; needs an unsplit o-projection.
        #: On by default for the shapes in ``tuning.NORM_HANDOFF``.
        self.norm_handoff = False
        #: The same for verify steps (T > 1), serially where the o-projection splits K. On by
        #: default for the shapes in ``tuning.VERIFY_HANDOFF``.
        self.verify_handoff = False
        self.attn_out_block_n = 128
        #: Memory semantics of split-K partials' float atomics (``kernels.ATOMIC_SEMS``).
        self.atomic_sem = "relaxed"
        #: Programmatic dependent launch of the Triton kernels (Hopper), per T: 0 off, 1 each
        #: kernel launched while the previous one finishes, 2 also loading its first weight
        #: tile before waiting. ``pdl`` is the mode for any T not in ``pdl_by_t``.
        self.pdl = 0
        self.pdl_by_t: dict[int, int] = {}
        #: The single-launch step (``megakernel.py``) and the largest T it runs; larger T use
        #: the per-kernel step. ``None``: not used. Set with ``use_megakernel``.
        self.mega: MegaConfig | None = None
        self.mega_max_t = 0
        #: T > 1: qkv as a split-K product plus a small RoPE/KV-write kernel (``kernels.qkv_split``)
        #: with these tiles, instead of the per-pair qkv kernel; None keeps the per-pair kernel.
        self.qkv_split: object | None = None
        self._stacked: object | None = None
        #: Cache policy of the weight loads: "", "evict_first" (a step reads each weight once)
        #: or ".cg" (past L1; session 20: 1-5 % slower), ``kernels.WEIGHT_CACHE``.
        self.weight_evict = ""
        #: The output projection's (or the screen's) own policy where not None (benchmarks:
        #: session 34 asked what a step's last stream, without the hint, costs the next).
        self.out_evict: str | None = None
        #: (kernel, verify step?) -> at least this much shared memory a program of it, to bound
        #: how many share an SM (``kernels.floor_shared``; session 20). On an sm_90 GPU the
        #: tuned shapes' verify steps floor the kernels of ``tuning.VERIFY_SMEM_CAPS`` (session
        #: 40: the 1.5B's merge and o-projection, the 0.5B's split-K qkv), where
        #: ``verify_floors`` finds the floors can be set; otherwise empty. Deterministic steps
        #: run unfloored (their kernels are not the ones measured).
        self.smem_floor: dict[tuple[str, bool], int] = {}
        #: Steps of more tokens than this run unfloored (``tuning.VERIFY_SMEM_MAX_T`` where
        #: the tuned floors are set).
        self.smem_floor_max_t = MAX_STEP
        #: Kernels ("qkv", "wo", "w13", "w2", "out") that, in a step whose PDL mode is 1, load
        #: their first weight tile before waiting on the previous kernel (mode 2) -- all their
        #: weights where K fits one tile, so the load overlaps the kernel before them.
        self.pdl_prologue: frozenset[str] = frozenset()
        #: Verify steps (T > 1): PDL mode per kernel ("qkv", "rope_kv", "attn", "combine", "wo",
        #: "w13", "w2", "out", "embed"; others use ``pdl_by_t``), ``kernels.PDL_LATE`` added
        #: where the next kernel should launch only after this one's main loop,
        #: ``kernels.PDL_AFTER_WAIT`` where right after this one's wait.
        self.verify_pdl: dict[str, int] = {}
        #: The same for one-token steps: PDL mode per kernel, over ``pdl_by_t[1]``.
        self.one_token_pdl: dict[str, int] = {}
        #: One-token steps on the GPU: (MiB, programs a half, after) of each layer's gate/up
        #: weights (the rows of its last programs, half in the gate half and half in the up
        #: half) asked into L2 from a side stream once the kernels before are done (after: 0
        #: the layer before, 1 qkv, 2 the attention's merge; with ``fuse_attn_out``, the merge
        #: fused with the o-projection), while the latency-bound chain up to the o-projection
        #: leaves DRAM idle (``kernels.l2_prefetch``). None: off; on the GPU
        #: ``tuning.L2_PREFETCH``.
        self.l2_prefetch: tuple[float, int, int] | None = None
        #: Experimental, for scripts/bench_hold.py only (None: off): stands in for the
        #: one-token step's L2 prefetch and gate/up launch (``FfnHook``), to time gate/up
        #: computed from weights held in shared memory by a kernel on a side stream
        #: (docs/gpu-notes.md, session 19).
        self.ffn_hook: FfnHook | None = None
        self._prefetch_stream: torch.cuda.Stream | None = None
        #: Set by ``make_deterministic``; default tiles (shapes without tuning) never split K.
        self.deterministic = False
        #: One-token steps as one persistent CUDA kernel (``cuda_step.DecodeStep``, sm_90+);
        #: set by ``use_cuda_step``. Bit-identical from run to run, like deterministic steps.
        self.cuda_step: DecodeStep | None = None
        self._cuda_step_kwargs: dict[str, object] = {}
        if self.kernels == "triton" and on_cuda:
            from openjarvis.engine.torch.kernels import pdl_supported
            from openjarvis.engine.torch.tuning import (
                ATTENTION,
                L2_PREFETCH,
                NORM_HANDOFF,
                PDL_PROLOGUE,
                QKV_SPLIT,
                QKV_WARPS,
                SCREEN_OUT,
                VERIFY_ATTENTION,
                VERIFY_HANDOFF,
                VERIFY_PDL,
                VERIFY_SMEM_CAPS,
                VERIFY_SMEM_MAX_T,
                WEIGHT_EVICT,
                combine_cols,
                tuned_configs,
            )

            shape = (self.args.n_embd, self.args.n_ff)  # what tuning.py's tables are keyed by
            if pdl_supported():
                self.pdl_by_t = dict(DEFAULT_PDL_BY_T)
                self.one_token_pdl = dict(DEFAULT_ONE_TOKEN_PDL)
                self.verify_pdl = dict(VERIFY_PDL.get(shape, {}))
            self.verify_attention = VERIFY_ATTENTION.get(shape)
            self.combine_cols = combine_cols(self.args, MAX_STEP)
            self.linear_configs = tuned_configs(self.args, MAX_STEP)
            self.qkv_split = QKV_SPLIT.get(shape)
            self.qkv_warps = dict(QKV_WARPS.get(shape, {}))
            self.norm_handoff = shape in NORM_HANDOFF
            self.verify_handoff = shape in VERIFY_HANDOFF
            self.pdl_prologue = PDL_PROLOGUE.get(shape, frozenset())
            if torch.cuda.get_device_capability(self.device)[0] >= 8:  # L2 cache hints: sm_80+
                self.weight_evict = WEIGHT_EVICT
                # (the screen's int8 matrix instructions: sm_80+ too; measured on sm_90 only)
                self.screen_out = shape in SCREEN_OUT
            self.nsplit, self.attn_block_s = ATTENTION.get(shape, (nsplit, self.attn_block_s))
            self.l2_prefetch = L2_PREFETCH.get(shape)
            self.smem_floor = verify_floors(VERIFY_SMEM_CAPS.get(shape, {}), self.device)
            self.smem_floor_max_t = VERIFY_SMEM_MAX_T
            self._wide_t = WIDE_MAX

    @property
    def graph_io(self) -> bool:
        """Captured steps copy their inputs in from page-locked memory as the graph's first
        node, and greedy steps leave their token ids in page-locked memory (``greedy_tokens``;
        ``host_ids_direct``), so a call is a write to host memory, one replay and one sync,
        instead of two synchronous copies around the replay. Setting it drops the steps
        captured the other way."""
        return self._graph_io

    @graph_io.setter
    def graph_io(self, on: bool) -> None:
        if on != self._graph_io:
            self.drop_steps()
        self._graph_io = on and self.graphs

    @property
    def wide(self) -> int:
        """Tokens of the widest wide step (0: none); setting another drops every wide step
        built and their buffers."""
        return self._wide_t

    @wide.setter
    def wide(self, t: int) -> None:
        if t < 0:
            raise ValueError(f"wide must be 0 (off) or a step's tokens, not {t}")
        if t != self._wide_t:
            self._drop_wide()
        self._wide_t = t

    @property
    def wide_widths(self) -> tuple[int, ...]:
        """The widths a run's wide steps take, widest first: ``wide``, then each ``WIDE_STEP``
        times a power of two narrower than it (``wide`` 1,024: 1,024, 512, 256, 128; a run of
        1,000 takes one step of 512, one of 256, one of 128, then 32-token steps), so a run
        that is not a multiple of ``wide`` still reads its rest in wide steps. Runs that are
        multiples of the widest split alike read as runs or as one."""
        if self._wide_t <= 0:
            return ()
        narrower = []
        w = WIDE_STEP
        while w < self._wide_t:
            narrower.append(w)
            w *= 2
        return (self._wide_t, *reversed(narrower))

    @property
    def greedy_cols(self) -> int:
        """Columns of the output projection a greedy step chooses among: the model's
        vocabulary, or fewer where the tokenizer's is smaller (the rest are padding rows that
        no token has). Setting it drops the greedy steps built for another width."""
        return self._greedy_cols

    @greedy_cols.setter
    def greedy_cols(self, n: int) -> None:
        if not 0 < n <= self.args.n_vocab:
            raise ValueError(f"greedy_cols must be in 1..{self.args.n_vocab}, not {n}")
        if n != self._greedy_cols:
            self._greedy_steps.clear()
            self._chains.clear()
        self._greedy_cols = n

    def use_megakernel(self, cfg: MegaConfig | None = None, max_t: int = 1) -> None:
        """Run steps of up to ``max_t`` tokens as one persistent launch (Triton kernels only).

        Stacks each kind of layer matrix into one tensor (the layers become views of it), and
        drops workspaces already built so that the next call of each T builds the new path.
        Stacking moves the weights: graphs captured earlier by any Runner of the same weights
        would read freed memory, so stack first (``megakernel.stack_layers``) where several
        Runners share a model."""
        from openjarvis.engine.torch.megakernel import MegaConfig, stack_layers

        if self.kernels != "triton":
            raise ValueError("the single-launch step needs the Triton kernels")
        self._stacked = stack_layers(self.model.weights)
        self.mega = cfg or MegaConfig()
        self.mega_max_t = max_t
        self.drop_steps()
        if self.cuda_step is not None:  # bound to the old layout: rebind to the stacked one
            self.use_cuda_step(**self._cuda_step_kwargs)

    def use_cuda_step(self, **kwargs: object) -> None:
        """Run one-token steps with the persistent CUDA kernel (``cuda_step.py``): compiles it
        for this model (cached), checks it fits the GPU, and drops a one-token step built
        before. Raises ``CudaStepError`` where it cannot run; verify steps are unchanged."""
        from openjarvis.engine.torch.cuda_step import DecodeStep

        new = DecodeStep(self.model, self.cache, **kwargs)  # type: ignore[arg-type]
        self.drop_steps(1)  # its graph may launch the step replaced here: gone before that is
        old, self.cuda_step = self.cuda_step, new
        self._cuda_step_kwargs = kwargs
        if old is not None:
            old.close()

    def uniform_pdl(self, mode: int = 0) -> None:
        """One PDL mode for every kernel of every step (0: none), instead of the measured
        per-T and per-kernel defaults (benchmarks, and GPUs without PDL)."""
        self.pdl, self.pdl_by_t, self.verify_pdl, self.one_token_pdl = mode, {}, {}, {}
        self.pdl_prologue = frozenset()
        self.drop_steps()

    def make_deterministic(self) -> None:
        """Make every step bit-for-bit reproducible from run to run: no split-K (whose partial
        sums land in float atomics, in whatever order the programs finish), no split-K qkv, no
        fused attention output. Held at every step, whatever the tiles are set to later
        (``tiles``). The cost is measured in BENCHMARKS.md ("Deterministic steps"); the
        single-launch step is deterministic already."""
        self.deterministic = True
        self.drop_steps()

    def drop_steps(self, t: int | None = None) -> None:
        """Forget the step of ``t`` tokens (every step: None), so that the next call builds
        and captures it anew with the settings of then (its CUDA graph is freed here)."""
        if t is None:
            self._steps.clear()
            self._greedy_steps.clear()
            self._arena.clear()  # (sized anew for the settings of then)
            self._drop_wide()
        else:
            self._steps.pop(t, None)
            self._greedy_steps.pop(t, None)
        if t in (None, 1):
            self._chains.clear()  # (they run the one-token greedy step's kernels and buffers)
        if t is None and not self.screen_out:
            self._screen = None  # (the int8 copy of the output matrix, no step using it now)

    def tiles(self, name: str, t: int) -> LinearConfig | None:
        """The tile the linear ``name`` ("wo", "w13", "w2", "out") of a T-token step runs with;
        None: ``kernels.default_linear_config``. Deterministic steps turn a split-K tile into
        an unsplit one with about as many programs (a power-of-two ``block_n``, at least 16 at
        T > 1, where it is an MMA dimension)."""
        from dataclasses import replace

        from openjarvis.engine.torch.kernels import LinearConfig

        cfg = self.linear_configs.get((name, t))
        if not isinstance(cfg, LinearConfig):
            return None
        if self.deterministic and cfg.split_k > 1:
            q = cfg.block_n // cfg.split_k
            bn = max(1 if t == 1 else 16, 1 << (q.bit_length() - 1) if q > 0 else 1)
            cfg = replace(cfg, split_k=1, block_n=bn)
        return cfg

    def kernel_pdl(self, name: str, t: int) -> int:
        """PDL mode of kernel ``name`` in a T-token step: ``verify_pdl`` for T > 1 and
        ``one_token_pdl`` for T = 1 where they name the kernel, else the step's mode
        (``pdl_by_t``, ``pdl``), raised to 2 (weights before the wait) for the
        ``pdl_prologue`` kernels where that mode is 1 (5 to 6 with ``PDL_LATE``, 9 to 10 with
        ``PDL_AFTER_WAIT``)."""
        if t > 1 and name in self.verify_pdl:
            return self.verify_pdl[name]
        if t == 1 and name in self.one_token_pdl:
            return self.one_token_pdl[name]
        pdl = self.pdl_by_t.get(t, self.pdl)
        return pdl + 1 if pdl % 4 == 1 and name in self.pdl_prologue else pdl

    def attention_tiles(self, t: int) -> tuple[int, int]:
        """(splits of the sequence, keys per block) of the attention in a T-token step."""
        if t > 1 and self.verify_attention is not None:
            return self.verify_attention
        return self.nsplit, self.attn_block_s

    @property
    def n_ctx(self) -> int:
        return self.cache.n_ctx

    # -- public ---------------------------------------------------------------------------

    def logits(
        self, tokens: Sequence[int], start: int, *, last_only: bool = False
    ) -> torch.Tensor:
        """Logits ``[T, V]`` (``[1, V]`` if ``last_only``) float32 on the device; a view of the
        steps' shared output (``shared_scratch``), valid until the next call: clone to keep.
        (Before session 25 each T had its own: 306 MiB of logits a warmed engine.)"""
        n = len(tokens)
        if n == 0 or start < 0 or start + n > self.n_ctx:
            raise ValueError(f"cannot evaluate {n} tokens at {start} in a {self.n_ctx} window")
        if self.kernels == "torch" and not self.graphs:
            return self._eager(tokens, start, last_only)
        if last_only and self._goes_wide(n):
            return self._read_wide(tokens, start, greedy=False)
        if n <= MAX_STEP:
            out = self.step(tokens, start)
            return out[-1:] if last_only else out
        rows = []  # a long prompt: fixed-size steps; keep only the rows asked for
        for i in range(0, n, MAX_STEP):
            out = self.step(tokens[i : i + MAX_STEP], start + i)
            if not last_only or i + MAX_STEP >= n:
                rows.append((out[-1:] if last_only else out).clone())
        return torch.cat(rows)

    def argmax(self, tokens: Sequence[int], start: int, *,
               last_only: bool = False) -> torch.Tensor:
        """Each token's greedy next token, ``[T]`` int64 on the device: the first column of its
        largest logit among the first ``greedy_cols``, as ``logits(...)[:, :greedy_cols]
        .argmax(-1)`` gives, from a step whose output projection writes 8 bytes a token a
        program instead of 4 a vocabulary entry (``kernels.ARGMAX``). A view of a workspace,
        valid until the next greedy call with the same T. ``last_only``: only the last
        token's (``[1]``; the eager CPU path then projects only that row, as ``logits``
        does, and a run read in wide steps takes the argmax of that row's logits)."""
        n = len(tokens)
        if n == 0 or start < 0 or start + n > self.n_ctx:
            raise ValueError(f"cannot evaluate {n} tokens at {start} in a {self.n_ctx} window")
        if self.kernels == "torch" and not self.graphs:  # attends to the live positions only
            out = self._eager(tokens, start, last_only)[:, : self.greedy_cols].argmax(-1)
            return out
        if last_only and self._goes_wide(n):
            return self._read_wide(tokens, start, greedy=True)
        if last_only:
            return self.argmax(tokens, start)[-1:]
        if n <= MAX_STEP:
            return self.step(tokens, start, greedy=True)
        return torch.cat([self.step(tokens[i : i + MAX_STEP], start + i, greedy=True).clone()
                          for i in range(0, n, MAX_STEP)])

    def greedy_tokens(self, tokens: Sequence[int], start: int, *,
                      last_only: bool = False) -> list[int]:
        """``argmax`` on the host, as a list. With ``graph_io`` the step's graph has already
        put them in page-locked memory: one sync, no copy call."""
        if self.graph_io and len(tokens) <= MAX_STEP:
            self.argmax(tokens, start)
            ws = self._greedy_steps[len(tokens)]
            assert ws.replayed is not None and ws.host_ids is not None
            ws.replayed.synchronize()
            ids = [int(x) for x in ws.host_ids.tolist()]
            return ids[-1:] if last_only else ids
        return [int(x) for x in self.host(self.argmax(tokens, start, last_only=last_only)).tolist()]

    def draft(self, token: int, start: int, n: int) -> list[int]:
        """Greedy drafting: ``token`` at ``start``, then each step's greedy token at the next
        position, ``n`` one-token steps in all; their ``n`` tokens (the last is not evaluated).
        With ``graph_io`` on the Triton path, one replay of a graph of the ``n`` steps, each
        step's merge kernel writing its token into the next step's inputs on the GPU: no host
        round trip between draft tokens (captured on first use of each ``n``)."""
        if n < 1 or start < 0 or start + n > self.n_ctx:
            raise ValueError(f"cannot draft {n} tokens at {start} in a {self.n_ctx} window")
        if not self._chained():
            out, tok = [], token
            for j in range(n):
                tok = self.greedy_tokens([tok], start + j)[0]
                out.append(tok)
            return out
        if n > MAX_CHAIN:  # as chains of MAX_CHAIN, each from the last token of the one before
            out = self.draft(token, start, MAX_CHAIN)
            return out + self.draft(out[-1], start + MAX_CHAIN, n - MAX_CHAIN)
        ch = self._chains.get(n) or self._capture_chain(n, token, start)
        ch.replayed.synchronize()  # the replay before has read host_in
        ch.host_in.numpy()[:, 0] = range(start, start + n)
        ch.host_in.numpy()[0, 1] = token
        ch.graph.replay()
        ch.replayed.record(torch.cuda.current_stream(self.device))
        ch.replayed.synchronize()
        return [int(x) for x in ch.host_out.tolist()]

    def warm_chains(self, ns: Sequence[int], start: int) -> None:
        """Capture ``draft``'s graphs of each length in ``ns`` now rather than on first use (a
        drafter's request would wait for them). Writes K/V at ``start`` onwards only: pass
        the first position the cache does not hold."""
        if self._chained():
            for n in ns:
                if n not in self._chains and 1 <= n <= MAX_CHAIN and start + n <= self.n_ctx:
                    self._capture_chain(n, 0, start)

    def _chained(self) -> bool:
        """Whether ``draft`` runs as one graph: the Triton path, captured, its tokens written
        into page-locked memory by the merge kernel."""
        return (self.graph_io and self.host_ids_direct and self.kernels == "triton"
                and self.cuda_step is None and (self.mega is None or self.mega_max_t < 1))

    def _capture_chain(self, n: int, token: int, start: int) -> Chain:
        """Capture ``draft``'s graph of ``n`` steps (warmed up once on a side stream first:
        it writes K/V at ``start``.. ``start + n - 1``, which the replay rewrites)."""
        ws = self._workspace(1, greedy=True)
        if ws.graph is None:  # compile the one-token greedy step's kernels
            self.step([token], start, greedy=True)
        dev = self.device
        host_in = torch.empty(n, 2, dtype=torch.int64, pin_memory=True)
        host_in.numpy()[:, 0] = range(start, start + n)
        host_in.numpy()[:, 1] = token
        host_out = torch.zeros(n, dtype=torch.int64, pin_memory=True)
        dev_in = host_in.to(dev)

        def steps() -> None:
            saved = ws.inputs, ws.host_ids, ws.feed
            try:
                for j in range(n):
                    ws.inputs, ws.host_ids = dev_in[j], host_out[j : j + 1]
                    ws.feed = dev_in[j + 1, 1:] if j + 1 < n else None
                    self._triton_forward(ws)
            finally:
                ws.inputs, ws.host_ids, ws.feed = saved

        def captured() -> None:
            dev_in.copy_(host_in, non_blocking=True)
            steps()

        graph, _ = self._graph(steps, captured, warm_runs=1)
        ch = Chain(host_in, dev_in, host_out, graph,
                   torch.cuda.Event(), ws)  # type: ignore[no-untyped-call]
        ch.replayed.record(torch.cuda.current_stream(self.device))
        self._chains[n] = ch
        return ch

    def step(self, tokens: Sequence[int], start: int, *, greedy: bool = False) -> torch.Tensor:
        """One fixed-shape step of ``len(tokens) <= MAX_STEP``; returns the workspace's logits
        (``greedy``: its token ids, ``argmax``), valid until the next step."""
        ws = self._workspace(len(tokens), greedy)
        if self.graph_io:
            return self._step_graph_io(ws, start, tokens)
        host = torch.tensor([start, *tokens], dtype=torch.int64)
        ws.inputs.copy_(host, non_blocking=False)
        if self.graphs and ws.graph is None:
            self._capture(ws)  # after the inputs: warm-up runs write K/V at this step's positions
        if ws.graph is not None:
            ws.graph.replay()
            return _result(ws)
        return self._run(ws)

    def _step_graph_io(self, ws: Workspace, start: int, tokens: Sequence[int]) -> torch.Tensor:
        """``step`` with ``graph_io``: the inputs written to the workspace's page-locked
        buffer, which the graph's first node copies in."""
        if ws.host_in is None or ws.replayed is None:
            ws.host_in = torch.empty(ws.inputs.shape, dtype=torch.int64, pin_memory=True)
            if ws.greedy:
                ws.host_ids = torch.empty(ws.inputs.shape[0] - 1, dtype=torch.int64,
                                          pin_memory=True)
            ws.replayed = torch.cuda.Event()  # type: ignore[no-untyped-call]
        else:
            ws.replayed.synchronize()  # the replay before has read host_in (and written ids)
        ws.host_in.numpy()[:] = (start, *tokens)
        if ws.graph is None:
            ws.inputs.copy_(ws.host_in)  # the warm-up runs before the capture read them
            self._capture(ws)
        assert ws.graph is not None
        ws.graph.replay()
        ws.replayed.record(torch.cuda.current_stream(self.device))
        return _result(ws)

    def host(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (a step's result) on the host, once every step launched so far is done, in
        memory of its own (on the CPU too: a step's result is a view of buffers every step
        shares, ``shared_scratch``). With
        ``pinned_io``, a result of ``PINNED_MIN_BYTES`` or more is copied straight into
        page-locked memory (PyTorch's caching host allocator keeps such blocks for reuse)
        and synced once, where a pageable copy is staged through a driver buffer: k = 8
        verify logits to numpy 2.70 -> 1.96 ms a call (1.5B @512, session 14 run 138). Token
        ids stay pageable: there the page-locked way cost 0.3 to 3 % more a call."""
        size = x.numel() * x.element_size()
        if not x.is_cuda:  # a view of a step's buffers, which the next step rewrites
            return x.clone()
        if not (self.pinned_io and PINNED_MIN_BYTES <= size <= PINNED_MAX_BYTES):
            return x.cpu()
        out = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        out.copy_(x, non_blocking=True)
        torch.cuda.current_stream(x.device).synchronize()
        return out

    def warmup(self, ts: Sequence[int], *, greedy: bool = False) -> None:
        """Build (and on the GPU compile and capture) the steps of each T now rather than on
        first use (``greedy``: ``argmax``'s). Writes K/V only at positions 0..T-1: call it on
        an empty cache."""
        for t in ts:
            self.step([0] * t, 0, greedy=greedy)

    def replay(self, t: int, *, greedy: bool = False) -> None:
        """Re-run the captured step of ``t`` tokens on whatever inputs it holds (benchmarks)."""
        ws = (self._greedy_steps if greedy else self._steps)[t]
        if ws.graph is not None:
            ws.graph.replay()
            if ws.replayed is not None:  # (``graph_io``: it reads host_in)
                ws.replayed.record(torch.cuda.current_stream(self.device))
        else:
            self._run(ws)

    def warm_wide(self) -> None:
        """Build (on the GPU compile and capture) the wide steps now rather than in the first
        long prompt. Writes K/V only at positions 0..wide-1: call it on an empty cache. A
        window shorter than a step never runs it: nothing to build."""
        for t in self.wide_widths:
            if self._goes_wide(t) and t <= self.n_ctx:
                self._wide_step([0] * t, 0)

    # -- internals ------------------------------------------------------------------------

    def _drop_wide(self) -> None:
        """Forget every wide step built, its graph and the arena of their buffers."""
        self._wides.clear()
        self._wide_arena.clear()
        self._wide = None

    def _goes_wide(self, n: int) -> bool:
        """Whether a run of ``n`` tokens starts with a wide step (``wide_widths``)."""
        widths = self.wide_widths
        return self.kernels == "triton" and bool(widths) and widths[-1] <= n

    def _read_wide(self, tokens: Sequence[int], start: int, *, greedy: bool) -> torch.Tensor:
        """``logits`` / ``argmax`` with ``last_only`` of a run of at least one wide step: wide
        steps of each width (``wide_widths``) while a whole one is left, the rest as
        fixed-size steps; the last token's logits [1, V] (a view, valid until the next call)
        or greedy token [1]."""
        n, i = len(tokens), 0
        for t in self.wide_widths:
            while n - i >= t:
                self._wide_step(tokens[i : i + t], start + i)
                i += t
        if i < n:
            rest, at = tokens[i:], start + i
            return (self.argmax(rest, at, last_only=True) if greedy
                    else self.logits(rest, at, last_only=True))
        return self._wide_last(greedy)

    def _wide_shapes(self, t: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The wide step's buffers for ``t`` tokens: shape and dtype by name (``Wide``)."""
        a, dt, f32 = self.args, self.model.dtype, torch.float32
        ns = wide_nsplit(t)
        return {
            "h": ((t, a.n_embd), f32), "xg": ((t, a.n_embd), dt), "inv": ((t,), f32),
            "qkv": ((t, a.qkv_dim), dt), "q": ((t, a.n_head, a.head_dim), f32),
            "o_part": ((ns, t, a.n_head, a.head_dim), f32), "ml_part": ((ns, t, a.n_head, 2), f32),
            "attn": ((t, a.q_dim), dt), "out": ((t, a.n_embd), dt), "gu": ((t, 2 * a.n_ff), dt),
            "act": ((t, a.n_ff), dt), "row": ((1, a.n_vocab), f32),
        }

    def _wide_ws(self, t: int) -> Wide:
        """The buffers of the wide step of ``t`` tokens: views of one arena sized for every
        width of ``wide_widths`` that fits the window (steps run one at a time on one stream,
        and each writes its buffers before it reads them)."""
        ww = self._wides.get(t)
        if ww is not None:
            return ww
        need: dict[str, int] = {}
        for w in {*(w for w in self.wide_widths if w <= self.n_ctx), t}:  # (what can run)
            for name, (shape, _dt) in self._wide_shapes(w).items():
                need[name] = max(need.get(name, 0), math.prod(shape))
        views: dict[str, torch.Tensor] = {}
        for name, (shape, dt) in self._wide_shapes(t).items():
            buf = self._wide_arena.get(name)
            if buf is None or buf.numel() < math.prod(shape):
                buf = torch.empty(need[name], dtype=dt, device=self.device)
                self._wide_arena[name] = buf  # (a step built on the one before keeps that one)
            views[name] = buf[: math.prod(shape)].view(shape)
        v = views
        ww = Wide(inputs=torch.zeros(1 + t, dtype=torch.int64, device=self.device), h=v["h"],
                  xg=v["xg"], inv=v["inv"], qkv=v["qkv"], q=v["q"], o_part=v["o_part"],
                  ml_part=v["ml_part"], attn=v["attn"], out=v["out"], gu=v["gu"], act=v["act"],
                  row=v["row"])
        self._wides[t] = ww
        return ww

    def _wide_step(self, tokens: Sequence[int], start: int) -> None:
        """One wide step: ``tokens`` (one of ``wide_widths`` of them) at ``start`` into the
        cache, the final residual left in the step's buffers. Captured on first use on the GPU
        (its warm-up run writes the same K/V as the step it precedes)."""
        ww = self._wide_ws(len(tokens))
        ww.inputs.copy_(torch.tensor([start, *tokens], dtype=torch.int64))
        self._wide = ww
        if not self.graphs:
            self._wide_forward(ww)
            return
        if ww.graph is None:
            ww.graph, _ = self._graph(lambda: self._wide_forward(ww),
                                      lambda: self._wide_forward(ww), warm_runs=1)
        ww.graph.replay()

    def _wide_forward(self, ww: Wide) -> None:
        """The layers of the wide step: the four products through cuBLAS on h * g (each row's
        1/RMS is a factor of its product's row, applied after: ``rope_kv``, ``swiglu_rows``),
        each residual add with the next norm's h * g and 1/RMS in one launch
        (``residual_norm``), the attention over splits of the sequence and blocks of the run's
        tokens."""
        from openjarvis.engine.torch import kernels as K

        a, w, c = self.args, self.model.weights, self.cache
        eps = a.rms_eps
        K.embed(ww.tokens, w.tok_emb, ww.h)
        down: torch.Tensor | None = None  # the layer before's down projection, not yet added
        for i, lw in enumerate(w.layers):
            K.residual_norm(ww.h, down, lw.attn_norm, ww.xg, ww.inv, eps)
            torch.mm(ww.xg, lw.wqkv.t(), out=ww.qkv)
            K.rope_kv(ww.qkv, ww.h, lw.bqkv, self.model.rope, ww.start, ww.q, c.k[i], c.v[i],
                      eps, inv=ww.inv, zero=False)
            K.attention_wide(ww.q, c.k[i], c.v[i], ww.start, ww.attn, ww.o_part, ww.ml_part,
                             block_s=WIDE_BLOCK_S)  # (its splits: ``wide_nsplit``)
            torch.mm(ww.attn, lw.wo.t(), out=ww.out)
            K.residual_norm(ww.h, ww.out, lw.ffn_norm, ww.xg, ww.inv, eps)
            torch.mm(ww.xg, lw.w13.t(), out=ww.gu)
            K.swiglu_rows(ww.gu, ww.inv, ww.act)
            torch.mm(ww.act, lw.w2.t(), out=ww.out)
            down = ww.out
        ww.h.add_(ww.out)

    def _wide_last(self, greedy: bool) -> torch.Tensor:
        """The last wide step's last token: its logits [1, V] (the one-token output
        projection's kernel and tile) or its greedy token [1] among ``greedy_cols``."""
        from openjarvis.engine.torch import kernels as K

        ww = self._wide
        assert ww is not None
        w = self.model.weights
        K.linear(ww.h[-1:], w.out, ww.row, norm=w.out_norm, eps=self.args.rms_eps,
                 cfg=self.tiles("out", 1))
        if greedy:
            return torch.argmax(ww.row[:, : self.greedy_cols], dim=-1)
        return ww.row

    def _eager(self, tokens: Sequence[int], start: int, last_only: bool) -> torch.Tensor:
        t = torch.tensor(list(tokens), dtype=torch.int64, device=self.device)
        pos = torch.arange(start, start + len(tokens), device=self.device)
        return self.model.forward(
            t, pos, self.cache, kv_len=start + len(tokens), last_only=last_only
        )

    def _workspace(self, t: int, greedy: bool = False) -> Workspace:
        steps = self._greedy_steps if greedy else self._steps
        ws = steps.get(t)
        if ws is not None:
            return ws
        a, dev, dt = self.args, self.device, self.model.dtype
        f32 = torch.float32
        nsplit = self.attention_tiles(t)[0]
        path: StepPath = self.kernels
        if t == 1 and self.cuda_step is not None:
            path = "cuda_step"
        elif self.mega is not None and t <= self.mega_max_t:
            path = "mega"
        bare = greedy and path == "triton"  # its output projection writes partials instead
        ws = Workspace(
            inputs=torch.zeros(1 + t, dtype=torch.int64, device=dev),
            h=self._scratch("h", t, (t, a.n_embd), f32),
            q=self._scratch("q", t, (t, a.n_head, a.head_dim), f32),
            o_part=self._scratch("o_part", t, (nsplit, t, a.n_head, a.head_dim), f32),
            ml_part=self._scratch("ml_part", t, (nsplit, t, a.n_head, 2), f32),
            attn=self._scratch("attn", t, (t, a.q_dim), dt),
            act=self._scratch("act", t, (t, a.n_ff), dt),
            # (the CUDA step and the single launch write their own; a greedy Triton step none)
            logits=(torch.empty(0, a.n_vocab, dtype=f32, device=dev)
                    if bare or path in ("cuda_step", "mega")
                    else self._scratch("logits", t, (t, a.n_vocab), f32)),
            path=path,
            greedy=greedy,
        )
        if greedy:
            ws.ids = torch.zeros(t, dtype=torch.int64, device=dev)
        if path == "cuda_step":
            assert self.cuda_step is not None
            ws.logits = self.cuda_step.logits
        elif path == "mega":
            from openjarvis.engine.torch.megakernel import scratch

            assert self.mega is not None
            ws.mega = scratch(a, t, self.mega.for_t(t).nsplit, dev)
            ws.logits = ws.mega.logits
        elif bare:
            from openjarvis.engine.torch.kernels import argmax_partials

            if self.screen_out:
                from openjarvis.engine.torch.kernels import screen_buffers

                self.out_screen()  # (built here, never inside a capture)
                # (the bounds, [T, V] float32, as views of the shared scratch like the logits)
                ws.screen = screen_buffers(
                    t, self.greedy_cols, a.n_embd, self._screen_tile(t), dev,
                    up=self._scratch("screen_up", t, (t, self.greedy_cols), f32))
                ws.partials = ws.screen.partials
            else:
                ws.partials = argmax_partials(t, self.greedy_cols, self._out_tile(t), dev)
        steps[t] = ws
        return ws

    def _scratch(self, name: str, t: int, shape: tuple[int, ...],
                 dtype: torch.dtype) -> torch.Tensor:
        """A contiguous ``shape`` view of the scratch buffer ``name``, shared by every step of
        a size not in ``own_scratch_t`` (``shared_scratch``), sized at first use for the largest
        step (``MAX_STEP`` tokens, the attention's splits as ``attention_tiles`` gives them
        then). A step that needs more later (settings changed) gets a larger buffer; the steps
        built before keep the old one alive through their views, so their graphs stay valid."""
        n = math.prod(shape)
        if not self.shared_scratch or t in self.own_scratch_t:
            return torch.empty(shape, dtype=dtype, device=self.device)
        buf = self._arena.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype:
            # rows: the leading dimensions that grow with the step ([splits, T] for the
            # attention's partials, [T] for the rest), at their largest over every step size
            lead = 2 if name in ("o_part", "ml_part") else 1
            most = (max(self.attention_tiles(u)[0] * u for u in range(1, MAX_STEP + 1))
                    if lead == 2 else MAX_STEP)
            buf = torch.empty(max(n, n // math.prod(shape[:lead]) * most), dtype=dtype,
                              device=self.device)
            self._arena[name] = buf
        return buf[:n].view(shape)

    def _run(self, ws: Workspace) -> torch.Tensor:
        """One step on the inputs ``ws`` holds, by the path it was built for; its logits (a
        greedy step: its token ids)."""
        if ws.path == "triton":
            return self._triton_forward(ws)
        if ws.path == "cuda_step":
            assert self.cuda_step is not None  # use_cuda_step drops the step it replaces
            logits = self.cuda_step(ws.inputs)
        elif ws.path == "mega":
            logits = self._mega_forward(ws)
        else:
            logits = self._torch_forward(ws)
        if not ws.greedy:
            return logits
        assert ws.ids is not None  # these paths write the logits: the argmax follows them
        return torch.argmax(logits[:, : self.greedy_cols], dim=-1, out=ws.ids)

    def _capture(self, ws: Workspace) -> None:
        """Warm up (compiles kernels) on a side stream, then capture one step into a graph.

        Warm-up runs the step the inputs hold (a step is idempotent: it rewrites the same K/V
        positions with the same values), so the inputs must be filled first.
        """
        def captured() -> torch.Tensor:
            if ws.host_in is not None:  # graph_io: the inputs' copy is the first node
                ws.inputs.copy_(ws.host_in, non_blocking=True)
            out = self._run(ws)
            if ws.host_ids is not None and not (self.host_ids_direct and ws.path == "triton"):
                ws.host_ids.copy_(out, non_blocking=True)  # a greedy step's tokens: last
            return out

        graph, out = self._graph(lambda: self._run(ws), captured, warm_runs=2)
        if ws.greedy:
            ws.ids = out
        else:
            ws.logits = out
        ws.graph = graph

    def _graph(self, warm: Callable[[], object], body: Callable[[], _R],
               warm_runs: int) -> tuple[torch.cuda.CUDAGraph, _R]:
        """Run ``warm`` ``warm_runs`` times on a side stream (compiles kernels), then capture
        ``body`` into a graph of the Runner's pool; the graph and what ``body`` returned.

        One side stream a Runner: cuBLAS keeps a workspace for every stream it runs on (32 MiB
        on an H200), for as long as the process, and the wide steps' warm-up runs are cuBLAS
        products: a stream a capture held 128 MiB more for the 1.5B's four wide steps
        (scripts/bench_startup.py, runs 329-330).

        No garbage collection inside the capture: one that freed another CUDA graph (a Runner
        dropped whole, a workspace some caller kept in a cycle) would fail it. Off for the
        capture rather than a full collection before each one (~0.1 s a capture, 18 of them
        when an engine loads)."""
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        side = self._side
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warm_runs):
                warm()
        torch.cuda.current_stream().wait_stream(side)
        enabled = gc.isenabled()
        gc.disable()
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = body()
        finally:
            if enabled:
                gc.enable()
        return graph, out

    def _torch_forward(self, ws: Workspace) -> torch.Tensor:
        t = ws.tokens.shape[0]
        pos = ws.start + torch.arange(t, device=self.device)
        out = self.model.forward(ws.tokens, pos, self.cache)
        ws.logits.copy_(out)
        return ws.logits

    def _mega_forward(self, ws: Workspace) -> torch.Tensor:
        from openjarvis.engine.torch import megakernel

        assert ws.mega is not None and self.mega is not None
        stacked = self._stacked
        assert isinstance(stacked, megakernel.Stacked)
        return megakernel.step(self.args, self.model.weights, stacked, self.model.rope,
                               self.cache.k, self.cache.v, ws.inputs, ws.mega, self.mega)

    def _triton_forward(self, ws: Workspace) -> torch.Tensor:
        from openjarvis.engine.torch import kernels as K

        a, w, c = self.args, self.model.weights, self.cache
        t = ws.tokens.shape[0]
        if K.TRACE["buf"] is not None:  # tracing (scripts/trace_step.py): launches from 0
            K.TRACE["next"] = 0

        def lc(name: str) -> K.LinearConfig | None:
            return self.tiles(name, t)

        def pk(name: str) -> int:
            return self.kernel_pdl(name, t)

        floored = not self.deterministic and t <= self.smem_floor_max_t

        def sf(name: str) -> int:
            return self.smem_floor.get((name, t > 1), 0) if floored else 0

        qkv_tiles = self.linear_configs.get(("qkv", t)) or (None, None)
        assert isinstance(qkv_tiles, tuple)
        ev = self.weight_evict
        oev = ev if self.out_evict is None else self.out_evict
        split = self.qkv_split if t > 1 and isinstance(self.qkv_split, K.LinearConfig) else None
        if self.deterministic:
            split = None
        if split is not None and ws.qkv_acc is None:
            ws.qkv_acc = torch.zeros(t, a.qkv_dim, dtype=torch.float32, device=self.device)
        fused = t == 1 and self.fuse_attn_out and not self.deterministic
        hand_bufs = None if fused else self._handoff_buffers(ws)
        wo_cfg = self._wo_tile(t)
        sem = self.atomic_sem
        K.embed(ws.tokens, w.tok_emb, ws.h, pdl=pk("embed"))
        # (verify steps asking the same lost: session 13 run 134, commit d5a7a2a)
        hook = self.ffn_hook if t == 1 and self.device.type == "cuda" else None
        if hook is not None and not hand_bufs:
            raise ValueError("ffn_hook needs the o-projection's norm hand-off (norm_handoff on, "
                             "no fuse_attn_out, an o-projection tile without split-K)")
        self._check_smem_floor(t, split is not None, fused, hook is not None, floored)
        pf = self.l2_prefetch if t == 1 and self.device.type == "cuda" and not hook else None
        if pf is not None and not (pf[0] > 0 and pf[1] > 0 and pf[2] in (0, 1, 2)):
            raise ValueError(f"l2_prefetch {pf}: needs (MiB > 0, programs > 0, after in 0-2)")
        main = torch.cuda.current_stream() if pf or hook else None
        if hook is not None:
            hook.begin(ws)
        forked: torch.cuda.Stream | None = None  # the side stream this step forked, if any

        def prefetch_at(point: int, w13: torch.Tensor) -> None:
            """``l2_prefetch`` where the step has reached ``point`` (its ``after``)."""
            nonlocal forked
            if pf is not None and main is not None and pf[2] == point:
                forked = self._prefetch(w13, pf, main)

        for i, lw in enumerate(w.layers):
            kc, vc = c.k[i], c.v[i]
            prefetch_at(0, lw.w13)
            if hook is not None and main is not None:
                forked = self.side_stream(main)
                forked.wait_stream(main)
                with torch.cuda.stream(forked):
                    hook.fork(i, lw, ws)
            if split is not None:
                assert ws.qkv_acc is not None
                K.qkv_split(ws.h, lw.wqkv, lw.attn_norm, lw.bqkv, self.model.rope, ws.start, ws.q,
                            kc, vc, ws.qkv_acc, a.rms_eps, cfg=split, pdl=pk("qkv"), evict=ev,
                            pdl_rope=pk("rope_kv"), rope_warps=self.rope_warps.get(t, 1),
                            atomic_sem=sem, smem=sf("qkv"), rope_smem=sf("rope"))
            else:
                K.qkv_rope(ws.h, lw.wqkv, lw.attn_norm, lw.bqkv, self.model.rope, ws.start, ws.q,
                           kc, vc, a.rms_eps, block_p=qkv_tiles[0], block_k=qkv_tiles[1],
                           pdl=pk("qkv"), evict=ev, smem=sf("qkv"),
                           num_warps=self.qkv_warps.get(t, 4))
            prefetch_at(1, lw.w13)
            hand = None
            if fused:
                K.attention_out(ws.q, kc, vc, ws.start, lw.wo, ws.h, ws.o_part, ws.ml_part,
                                block_s=self.attn_block_s, block_n=self.attn_out_block_n,
                                pdl=pk("attn"), trim=self.trim_merge, atomic_sem=sem)
                prefetch_at(2, lw.w13)  # (the merge fused with wo)
            else:
                K.attention(ws.q, kc, vc, ws.start, ws.attn, ws.o_part, ws.ml_part,
                            block_s=self.attention_tiles(t)[1], pdl=pk("attn"),
                            num_warps=self.attn_warps.get(t, 4),
                            pdl_combine=pk("combine"), combine_warps=self.combine_warps.get(t, 1),
                            trim=self.trim_merge, combine_cols=self.combine_cols.get(t, 1),
                            combine_smem=sf("combine"))
                prefetch_at(2, lw.w13)
                if hand_bufs is not None:
                    hand = K.NormHandoff(hand_bufs[0], hand_bufs[1], lw.ffn_norm, hand_bufs[2])
                K.linear(ws.attn, lw.wo, ws.h, mode=K.ADD, cfg=wo_cfg, pdl=pk("wo"), evict=ev,
                         hand_out=hand, atomic_sem=sem, smem=sf("wo"))
            if hook is not None and hand is not None:
                hook.gate_up(i, lw, ws, hand)
            elif hand is not None:
                K.linear(hand.xg, lw.w13, ws.act, mode=K.SWIGLU, eps=a.rms_eps, cfg=lc("w13"),
                         pdl=pk("w13"), evict=ev, hand_in=hand, smem=sf("w13"))
            else:
                K.linear(ws.h, lw.w13, ws.act, mode=K.SWIGLU, norm=lw.ffn_norm, eps=a.rms_eps,
                         cfg=lc("w13"), pdl=pk("w13"), evict=ev, smem=sf("w13"))
            K.linear(ws.act, lw.w2, ws.h, mode=K.ADD, cfg=lc("w2"), pdl=pk("w2"), evict=ev,
                     atomic_sem=sem, smem=sf("w2"))
        if main is not None and forked is not None:
            main.wait_stream(forked)  # a captured side stream must join
        if ws.greedy:
            assert ws.partials is not None and ws.ids is not None
            if ws.screen is not None:
                K.screen(ws.h, w.out_norm, self.out_screen(), ws.screen, w.out, eps=a.rms_eps,
                         cfg=self._screen_tile(t), pdl=pk("out"), evict=oev)
            else:
                K.linear(ws.h, w.out[: self.greedy_cols], ws.partials, mode=K.ARGMAX,
                         norm=w.out_norm, eps=a.rms_eps, cfg=self._out_tile(t), pdl=pk("out"),
                         evict=oev)
            return K.argmax_merge(ws.partials, ws.ids, pdl=1 if pk("out") % 4 in (1, 2) else 0,
                                  host=ws.host_ids if self.host_ids_direct else None,
                                  feed=ws.feed)
        K.linear(ws.h, w.out, ws.logits, norm=w.out_norm, eps=a.rms_eps, cfg=lc("out"),
                 pdl=pk("out"), evict=oev)
        return ws.logits

    def _check_smem_floor(self, t: int, split: bool, fused: bool, hooked: bool,
                          floored: bool) -> None:
        """Refuse a ``smem_floor`` entry that this step would drop without a word: a kernel
        it does not launch (a typo; the RoPE kernel, "rope", where qkv is not a split-K
        product; the o-projection and the merge fused into the attention; gate/up replaced by
        ``ffn_hook``). "qkv" floors whichever qkv product the step runs. A step that runs
        unfloored by rule (``floored`` False: deterministic, or longer than
        ``smem_floor_max_t``) drops none, so only the names are checked."""
        for (name, verify), nbytes in self.smem_floor.items():
            if name not in ("qkv", "rope", "combine", "wo", "w13", "w2") or nbytes < 0:
                raise ValueError(f"smem_floor {(name, verify)}: {nbytes}: the kernels are qkv, "
                                 f"rope, combine, wo, w13 and w2, the floors bytes >= 0")
            if verify != (t > 1) or not floored:
                continue
            dropped = ((name == "rope" and not split) or (name in ("wo", "combine") and fused)
                       or (name == "w13" and hooked))
            if dropped and nbytes:
                raise ValueError(f"smem_floor {(name, verify)}: this step does not launch that "
                                 f"kernel (the RoPE kernel without split-K qkv, fused "
                                 f"o-projection or ffn_hook)")

    def _prefetch(self, w13: torch.Tensor, pf: tuple[float, int, int],
                  main: torch.cuda.Stream) -> torch.cuda.Stream:
        """``l2_prefetch``: once everything launched on ``main`` so far is done, ask L2 for
        the last ``pf[0]`` MiB of gate/up's rows, half in each half; the side stream used."""
        from openjarvis.engine.torch import kernels as K

        side = self.side_stream(main)
        n, k = w13.shape[0] // 2, w13.shape[1]
        rows = max(1, min(n, int(pf[0] * 2**20 / 2 / (k * w13.element_size()))))
        side.wait_stream(main)
        with torch.cuda.stream(side):
            K.l2_prefetch(w13, ((n - rows) * k, (2 * n - rows) * k), rows * k, pf[1])
        return side

    def side_stream(self, main: torch.cuda.Stream) -> torch.cuda.Stream:
        """The one-token step's side stream (``l2_prefetch``, ``ffn_hook``): one that is not
        ``main``. PyTorch hands out streams round-robin from a pool that the graph's capture
        stream comes from too: a side stream that is ``main`` would put its work inline in the
        chain."""
        for _ in range(4):
            if self._prefetch_stream is not None and self._prefetch_stream != main:
                break
            self._prefetch_stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        side = self._prefetch_stream
        assert side is not None and side != main
        return side

    def _out_tile(self, t: int) -> LinearConfig:
        """The output projection's tile as its launch resolves it (a greedy step sizes its
        partials by it)."""
        from openjarvis.engine.torch import kernels as K

        a = self.args
        return self.tiles("out", t) or K.default_linear_config(t, a.n_vocab, a.n_embd,
                                                               self.device.type == "cuda")

    def _screen_tile(self, t: int) -> LinearConfig:
        """The screen's tile (``linear_configs[("screen", t)]``, else
        ``kernels.default_screen_config``): its programs' count sizes the step's buffers."""
        from openjarvis.engine.torch import kernels as K

        return self.tiles("screen", t) or K.default_screen_config(t, self.device.type == "cuda")

    def out_screen(self) -> OutScreen:
        """The int8 copy of the output matrix's first ``greedy_cols`` rows that greedy steps
        screen with (``screen_out``), made at first use and again when ``greedy_cols``
        changes."""
        from openjarvis.engine.torch.kernels import screen_weights

        n = self.greedy_cols
        if self._screen is None or self._screen[0] != n:
            self._screen = None  # (the old copy freed before the new one is made)
            self._screen = (n, screen_weights(self.model.weights.out[:n]))
        return self._screen[1]

    def _wo_tile(self, t: int) -> LinearConfig:
        """The o-projection's tile as its launch resolves it: the hand-off's slots are one a
        program of that tile, so both take it from here."""
        from openjarvis.engine.torch import kernels as K

        a = self.args
        return self.tiles("wo", t) or K.default_linear_config(t, a.n_embd, a.q_dim,
                                                              self.device.type == "cuda")

    def _handoff_buffers(
        self, ws: Workspace
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """The buffers (x * g, per-program sums of squares, split-K arrival counts) of the
        o-projection's hand-off of the feed-forward norm to gate/up (``kernels.NormHandoff``;
        every layer reuses them), where it applies: one-token steps with ``norm_handoff`` and
        an o-projection tile without split-K (each program must own whole columns of the new
        residual); verify steps with ``verify_handoff``, serially where the tile splits K.
        Verify steps' x * g is in the weights' dtype, which their gate/up rounds it to anyway."""

        t = ws.tokens.shape[0]
        if not (self.norm_handoff if t == 1 else self.verify_handoff):
            return None
        a = self.args
        cfg = self._wo_tile(t)
        split = cfg.split_k > 1
        if split and t == 1:
            return None
        n_prog = -(-a.n_embd // cfg.block_n)
        dtype = torch.float32 if t == 1 else self.model.dtype
        if (ws.xg is None or ws.ss_part is None or ws.ss_part.shape[1] != n_prog
                or ws.xg.dtype != dtype):
            ws.xg = torch.empty(t, a.n_embd, dtype=dtype, device=self.device)
            ws.ss_part = torch.empty(t, n_prog, dtype=torch.float32, device=self.device)
            ws.hand_count = None
        if split and ws.hand_count is None:
            ws.hand_count = torch.zeros(n_prog, dtype=torch.int32, device=self.device)
        return ws.xg, ws.ss_part, ws.hand_count if split else None


def _result(ws: Workspace) -> torch.Tensor:
    if ws.greedy:
        assert ws.ids is not None
        return ws.ids
    return ws.logits


def _has_triton() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


__all__ = ["MAX_STEP", "NSPLIT", "SLACK", "Runner", "Workspace"]
