"""Row groups before printing: a group with reductions as micro-steps (each node, composites
expanded into reductions and elementwise steps), whether each tensor varies along the row or
is constant per row, and how a row maps onto threads (RowGeometry). schemes/rows/codegen.py prints the
CUDA from these.

The planner reads the same facts (a low-level module below the stages and the rows scheme alike):
legality of long rows (candidates.py: split_factor, splittable), the bytes a row kernel moves
when its rows do not fit the registers and the bandwidth share of a column reduction (cost.py:
loop_passes, column_share), and whether a group holds a row reduction at all (has_rows).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Union

from onnx import TensorProto as TP

from . import ops
from .graph import FusionGraph, reduced_shape, row_run
from .shapes import Shape, TensorInfo, dtype_size

Operand = Union[str, float]  # a tensor name, or a literal in the step's compute type
MAX_CHUNKS = 8  # register chunks per thread and per-element input (16 bytes each)


@dataclass(frozen=True)
class Step:
    """One micro-operation: an elementwise op of the table, or a row reduction."""

    out: str
    dtype: int
    op: str
    inputs: tuple[Operand, ...]
    attrs: Mapping[str, object] = field(default_factory=dict)

    @property
    def reduces(self) -> bool:
        return self.op in ops.REDUCERS or self.op in ops.ARG_REDUCERS


@dataclass(frozen=True)
class RowGeometry:
    """How a row maps onto threads: `threads` per row, `block` per block (a multiple), and
    `chunks` register chunks of `vec` elements per thread (0: the row never fits; loop only)."""

    span: int
    threads: int
    block: int
    chunks: int
    vec: int

    @property
    def capacity(self) -> int:
        return self.threads * self.chunks * self.vec


# Elements each thread of a row holds, by element width: measured on H200 over LayerNorm rows
# of 768 and Softmax rows of 128 and 512 (scripts/bench_rows.py --sweep): 16 for 4-byte
# elements, 8 for 2-byte ones (docs/perf-notes.md).
ELEMENTS_PER_THREAD = {4: 16, 2: 8, 8: 8}
# With this many rows the GPU is full either way, and a row of one warp (shuffles only) beats
# a row of two warps (a barrier per reduction) for the same row: ncu on H200, float16 Softmax
# over [8, 12, 512, 512], 58.6 us at 32 threads per row against 80.9 at 64 (issue-bound).
MANY_ROWS = 16384
# Few rows leave too few threads to keep the loads in flight: BERT's residual LayerNorm at 1024
# rows of 768 float32 took 3.51 µs at 16 elements a thread (64 threads a row) and 2.97 µs at 8
# (96 threads), hand-written forms in CUDA graphs on H200 (scripts/bench_layernorm.py); float16
# (8 a thread) gained nothing at 4. Below this many threads in all, a thread takes 8 elements.
FEW_ROWS_THREADS = 65536


def has_rows(graph: FusionGraph, nodes: Iterable[int]) -> bool:
    """True when a group needs the rows scheme (it contains a REDUCE-kind node)."""
    return any(graph.nodes[i].kind == ops.OpKind.REDUCE for i in nodes)


def choose_geometry(cols: int, vec: int, span: int, threads: int | None = None,
                    rows: int | None = None, inputs: int = 1) -> RowGeometry:
    """Threads per row for rows of about `cols` elements (`rows` of them, where the plan
    knows): enough to give each thread ELEMENTS_PER_THREAD elements (8 where rows are few:
    FEW_ROWS_THREADS; a power of two up to 32, whole warps beyond), up to 1024; one
    warp instead of two when rows are many; rows longer than 1024 × MAX_CHUNKS chunks take
    the loop path only, and so do rows whose register path would not fit the launch's register
    bound with `inputs` per-element inputs. `threads` forces the threads per row (benchmarks
    sweep it)."""
    units = max(1, math.ceil(cols / vec))
    if threads is None:
        per_thread = ELEMENTS_PER_THREAD.get(16 // vec, 16)
        if rows is not None and per_thread > 8 and rows * math.ceil(cols / per_thread) < FEW_ROWS_THREADS:
            per_thread = 8
        want = max(1, math.ceil(cols / per_thread))
        # Up to a warp, a power of two (lanes of a row share shuffles); beyond, whole warps, so
        # a row of 96 vectors (float16 × 768) gets 96 threads rather than 128 with 32 idle.
        threads = 1 << (want - 1).bit_length() if want <= 32 else min(1024, 32 * math.ceil(want / 32))
        if threads == 64 and rows is not None and rows >= MANY_ROWS:
            threads = 32
    chunks = math.ceil(units / threads)
    # T <= 32: 4 warps of rows per block; T > 32: one row per block (the reduction uses the block).
    block = 128 if threads <= 32 else threads
    # The register path holds V floats per chunk for the whole row, and ptxas hoists every
    # chunk's loads of each further per-element input (4 registers per 16-byte chunk, V once
    # 2-byte elements are widened: 16 float16 inputs × 2 chunks spilled 340 bytes at 128
    # threads); past the launch's register bound that spills, and the loop path (re-reading
    # the row from L2) is the better deal.
    fits = chunks <= MAX_CHUNKS and fits_registers(vec, chunks, block, max(4, vec) * chunks * max(0, inputs - 1))
    return RowGeometry(span, threads, block, chunks if fits else 0, vec)


# What a register-path row kernel takes besides its cached row and loads, in registers per
# thread: ptxas on sm_90 fits 16 cached floats at 1024 threads (64 registers) with at most a
# few bytes of spills, and spills hundreds of bytes at 32 (float32 × 32768, float16 × 32768
# and 65536 columns); 8 float32 inputs × 8192 columns at 512 threads spilled 316 bytes.
BASE_REGISTERS = 48


def register_bound(block: int) -> int:
    """Registers per thread a launch of `block` threads may use (65536 per SM, at most 255)."""
    return min(255, 65536 // block)


def fits_registers(vec: int, chunks: int, block: int, extra: int) -> bool:
    """Whether a register-path thread holding its cached row (`vec` floats per chunk) and
    `extra` more registers stays within the launch's register bound."""
    return vec * chunks + extra + BASE_REGISTERS <= register_bound(block)


# Column reductions (a run of axes followed by `inner` others): one thread per column, so
# that neighbouring threads read neighbouring addresses; each holds up to this many elements
# of its column in registers (longer columns re-read them, from L1/L2).
COLUMN_BLOCK, COLUMN_CHUNKS = 256, 16

# A column kernel's threads each walk one column (or a slice of it), holding up to
# COLUMN_UNROLL of its elements in flight: few columns cannot keep the memory system busy. A device needs about this many
# bytes in flight to reach its copy bandwidth (bandwidth × latency: ~3 TB/s × ~0.6 µs), so a
# column kernel's share of the bandwidth is its bytes in flight over this. ConvNeXt V2's GRN
# (an L2 norm over 56 × 56 of NHWC activations, 768 columns at batch 8) planned at full
# bandwidth ran 0.45× of stock ORT (H200): about 2% of it by this rule.
COLUMN_IN_FLIGHT_BYTES = 2 << 20


def column_share(plan: "RowPlan", elem_bytes: int) -> float:
    """The share of the copy bandwidth a rows kernel reaches: 1 for trailing rows; for a column
    reduction, its columns' bytes in flight (each column split across `split` blocks, each
    block's slice COLUMN_UNROLL elements in flight at most) over COLUMN_IN_FLIGHT_BYTES, and
    its blocks over SPLIT_TARGET_BLOCKS (an SM reads a share of the bandwidth), the lesser."""
    if not plan.inner or plan.rows is None:
        return 1.0
    blocks = _ceil_div(plan.rows, plan.geometry.block) * plan.split
    return min(1.0, _column_in_flight(plan.rows, plan.cols, plan.split, elem_bytes) / COLUMN_IN_FLIGHT_BYTES,
               blocks / SPLIT_TARGET_BLOCKS)


def column_block(columns: int | None, split: int) -> int:
    """Threads per block of a column kernel (a column each): COLUMN_BLOCK, halved down to a
    warp while the blocks (`split` per block's worth of columns) fill less than
    SPLIT_TARGET_BLOCKS: an SM reads a share of the bandwidth, so few blocks leave most of it
    unused (a warp's 32 neighbouring columns are still one 128-byte line per step)."""
    block = COLUMN_BLOCK
    while columns and block > 32 and _ceil_div(columns, block) * split < SPLIT_TARGET_BLOCKS:
        block //= 2
    return block


def _column_in_flight(columns: int, length: int, split: int, elem_bytes: int) -> int:
    return columns * split * min(_ceil_div(length, split), COLUMN_UNROLL) * elem_bytes


# Steps of a column's loop unrolled, so that as many loads are in flight per thread (one
# register each: a column's thread loads one element a step).
COLUMN_UNROLL = 32

# Registers a column kernel's loop path may take per thread, through its launch bound's blocks
# per SM: left to itself ptxas held a 128-thread column kernel to 32 registers (full occupancy,
# which these launches of few blocks never reach) and issued 13 of a step's 32 loads before
# their first use (float16 split GRN 8×56×56×384, NVRTC 13.0, sm_90); bounded so, it takes 44–90
# and issues all 32. A bound of 64 spilled 8–120 bytes in multi-pass column kernels (Softmax
# over axis 1).
COLUMN_REGISTERS = 128


def column_min_blocks(block: int) -> int:
    """The blocks per SM a column kernel's launch bound names (COLUMN_REGISTERS each thread)."""
    return max(1, 65536 // (block * COLUMN_REGISTERS))


# Split columns: few long columns (GRN's L2 norm over H × W of NHWC activations) are each split
# across a thread-block cluster of up to MAX_SPLIT blocks — every block of the cluster takes the
# same columns, a slice of their length each; partial results meet through distributed shared
# memory — until the bytes in flight reach COLUMN_IN_FLIGHT_BYTES, each slice at least
# COLUMN_MIN_SLICE elements (a loop of whole unrolled steps).
COLUMN_MIN_SLICE = 64


def column_split_factor(length: int, columns: int | None, elem_bytes: int) -> int:
    """Blocks per column for a column reduction of `columns` columns of `length` elements (a
    power of two, 1 when not split)."""
    if not columns or columns <= 0:
        return 1
    split = 1
    while (split < MAX_SPLIT and _ceil_div(length, 2 * split) >= COLUMN_MIN_SLICE
           and _column_in_flight(columns, length, split, elem_bytes) < COLUMN_IN_FLIGHT_BYTES):
        split *= 2
    return split


# Split rows (FusionStitching's split reductions), for few long rows: on sm_90 a row belongs to
# a thread-block cluster of `split` blocks, each holding a slice of it in registers; partial
# reductions meet through distributed shared memory. A row is split when one block cannot hold
# it in registers and the rows give fewer than SPLIT_TARGET_BLOCKS blocks: then into enough
# blocks for about SPLIT_TARGET_BLOCKS in all — one wave of large blocks — up to MAX_SPLIT (the
# portable cluster size), each slice at least SPLIT_MIN_SLICE elements. Measured on H200
# (bench_rows.py --split-sweep): a UNet group norm (64 rows of 40 960) is fastest split in 2
# (12.4 µs against 15.2 unsplit; 22–29 µs in 4 or 8, more blocks than one wave), a vocabulary
# softmax (8 rows of 50 257) in 8 (7.4 µs against 21.5); rows one block holds (64 of 10 240)
# are fastest unsplit.
SPLIT_TARGET_BLOCKS, MAX_SPLIT, SPLIT_MIN_SLICE = 128, 8, 4096
# Elements per thread of a slice held in registers (fewer, wider blocks than
# ELEMENTS_PER_THREAD: a 20 480-element slice of a group norm in 640 threads took 12.4 µs, in
# 1024 threads — past their register bound, so the loop path — 13.9). Slices whose inputs
# would not fit that way take the loop path with the unsplit rule's threads.
SPLIT_ELEMENTS_PER_THREAD = 32


def split_factor(cols: int, rows: int | None) -> int:
    """Blocks per row for rows too long for one block's registers (a power of two, 1 when
    not split): about SPLIT_TARGET_BLOCKS blocks in all, within MAX_SPLIT, each slice ≥
    SPLIT_MIN_SLICE elements."""
    if rows is None or rows <= 0 or rows >= SPLIT_TARGET_BLOCKS or cols < 2 * SPLIT_MIN_SLICE:
        return 1
    want = 1 << math.ceil(math.log2(SPLIT_TARGET_BLOCKS / rows))
    room = 1 << int(math.log2(cols // SPLIT_MIN_SLICE))
    return max(1, min(MAX_SPLIT, want, room))


@dataclass(frozen=True)
class RowPlan:
    """A row group's shape at planning sizes: its iteration shape, the `span` axes that form
    a row and the `inner` axes after them (0: the row is trailing; else a column reduction),
    the row length `cols`, the number of rows (None when not known) and the geometry.
    `static`: the row length is fixed in the model and fits the registers (the kernel then
    has no loop path). `split`: blocks per row on GPUs with thread-block clusters (sm_90+),
    the geometry then being a slice's; elsewhere one block per row walks the whole row."""

    shape: Shape
    span: int
    cols: int
    rows: int | None
    geometry: RowGeometry
    static: bool
    inner: int = 0
    split: int = 1

    @property
    def run(self) -> tuple[int, int]:
        """The row's axes: [start, stop) of the iteration shape."""
        start = len(self.shape) - self.span - self.inner
        return start, start + self.span

    @property
    def in_registers(self) -> bool:
        """Whether a row of the planned length is held in registers (read once) rather than
        re-read by every pass of the loop path."""
        return self.geometry.chunks > 0 and self.cols <= self.geometry.capacity * self.split

    @property
    def slice(self) -> int:
        """Elements of the row each block of a split row takes (whole vectors, as the kernel
        computes `Cs`; the row when not split)."""
        if self.split == 1:
            return self.cols
        vec = self.geometry.vec
        return -(-_ceil_div(self.cols, self.split) // vec) * vec


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def aligned(shape: Shape | None, rank: int) -> tuple:
    """An input's dims against a rank-`rank` iteration space, right-aligned as broadcasting
    aligns them: missing dims are 1; an unknown rank gives None everywhere (any axis may vary)."""
    return (None,) * rank if shape is None else (1,) * (rank - len(shape)) + tuple(shape)


def row_tail(shape: Shape | None, rank: int, start: int, stop: int) -> tuple:
    """An input's dims along the row's axes [start, stop) of a rank-`rank` iteration space."""
    return aligned(shape, rank)[start:stop]


def splittable(graph: FusionGraph, nodes: Iterable[int]) -> bool:
    """Whether a row group may be split across blocks: the targets have thread-block clusters
    and no ArgMax/ArgMin carries positions (trailing rows by split_factor, columns by
    column_split_factor)."""
    return graph.clusters and not any(graph.nodes[i].op_type in ops.ARG_REDUCERS for i in nodes)


def split_geometry(whole: RowGeometry, cols: int, rows: int | None, vec: int, span: int, per_element: int,
                   varying: int) -> tuple[int, RowGeometry] | None:
    """(blocks per row, a slice's geometry) when rows of `cols` elements are split, else None:
    only rows one block cannot hold in registers (`whole`, the unsplit geometry; split_factor).
    A slice is held in registers at SPLIT_ELEMENTS_PER_THREAD where its `varying` inputs (every
    input that varies along the row: at 32 elements per thread a LayerNorm's scale and bias,
    hoisted, spilled 176 bytes in float16 × 32768) fit the register bound, else walked by the
    loop path at the unsplit rule's threads."""
    split = split_factor(cols, rows)
    if split == 1 or (whole.chunks and whole.capacity >= cols):
        return None
    piece = _ceil_div(cols, split)
    want = max(64, 32 * _ceil_div(_ceil_div(piece, SPLIT_ELEMENTS_PER_THREAD), 32))
    geo = choose_geometry(piece, vec, span, min(1024, want), None, max(per_element, varying))
    return split, geo if geo.chunks else choose_geometry(piece, vec, span, None, None, per_element)


def row_plan(graph: FusionGraph, nodes: tuple[int, ...] | frozenset[int], threads: int | None = None) -> RowPlan:
    """The row plan of a legal group with reductions (`threads` forces threads per row)."""
    members = frozenset(nodes)
    shape = graph.iteration_shape(members)
    assert shape, "a rows kernel needs an iteration shape of rank >= 1"
    start, stop = row_run(graph, next(i for i in sorted(members) if graph.nodes[i].kind == ops.OpKind.REDUCE))
    span, inner = stop - start, len(shape) - stop
    inputs, outputs = graph.boundary(members)
    run = tuple(shape[start:stop])
    cols = TensorInfo("row", TP.FLOAT, run).numel(graph.dim_values) or 1
    # 16-byte chunks of the widest per-element tensor.
    widest = max([dtype_size(graph.tensors[t].dtype) for t in inputs + outputs
                  if graph.tensors[t].shape == shape] or [4])
    rows = TensorInfo("rows", TP.FLOAT, reduced_shape(tuple(shape), start, stop, False)).numel(graph.dim_values)
    per_element = sum(graph.tensors[t].shape == shape for t in inputs)
    vec = max(1, 16 // widest)
    varying = sum(any(d != 1 for d in row_tail(graph.tensors[t].shape, len(shape), start, stop)) for t in inputs)
    if inner:
        # (columns split across a cluster where the targets have clusters: column_split_factor)
        split = column_split_factor(cols, rows, widest) if threads is None and splittable(graph, members) else 1
        piece = _ceil_div(cols, split)
        geo = RowGeometry(span, 1, column_block(rows, split), piece if piece <= COLUMN_CHUNKS else 0, 1)
    else:
        geo = choose_geometry(cols, vec, span, threads, rows, per_element)
        # (a forced threads per row is a benchmark's sweep of the unsplit geometry)
        splits = split_geometry(geo, cols, rows, vec, span, per_element, varying) \
            if threads is None and splittable(graph, members) else None
        split, geo = splits if splits else (1, geo)
    # A split kernel's one-block-per-row entry (GPUs without clusters) keeps the loop path.
    static = split == 1 and all(isinstance(d, int) for d in run) and math.prod(run) <= geo.capacity  # type: ignore[arg-type]
    return RowPlan(tuple(shape), span, cols, rows, geo, static, inner, split)


def loop_passes(graph: FusionGraph, nodes: tuple[int, ...] | frozenset[int]) -> int:
    """How many times the loop path reads a row: once per reduction, and once more for the
    per-element outputs (the register path reads it once)."""
    members = sorted(nodes)
    steps = [s for i in members for s in expand(graph, i)]
    inputs, outputs = graph.boundary(frozenset(members))
    shape = graph.iteration_shape(frozenset(members))
    level = levels(steps, {t: "elem" if graph.tensors[t].shape == shape else "row" for t in inputs})
    return sum(s.reduces for s in steps) + any(level.get(t) == "elem" for t in outputs)


def expand(graph: FusionGraph, i: int) -> list[Step]:
    """A node as steps; Softmax, LogSoftmax, LayerNormalization and ReduceLogSumExp become
    reductions plus elementwise steps (synthetic tensors are named after the node's output)."""
    n = graph.nodes[i]
    out = n.outputs[0]
    d = graph.tensors[out].dtype
    if n.op_type in ops.ARG_REDUCERS:
        return [Step(out, d, n.op_type, (n.inputs[0],), n.attrs)]
    if n.op_type in ops.REDUCERS or n.op_type in ops.GLOBAL_POOLS:
        return [Step(out, d, ops.GLOBAL_POOLS.get(n.op_type, n.op_type), (n.inputs[0],))]
    if n.op_type in ("Softmax", "LogSoftmax", "ReduceLogSumExp"):
        x = n.inputs[0]
        steps = [Step(f"{out}~max", d, "ReduceMax", (x,)), Step(f"{out}~shift", d, "Sub", (x, f"{out}~max")),
                 Step(f"{out}~exp", d, "Exp", (f"{out}~shift",)), Step(f"{out}~sum", d, "ReduceSum", (f"{out}~exp",))]
        if n.op_type == "Softmax":
            return steps + [Step(out, d, "Div", (f"{out}~exp", f"{out}~sum"))]
        log = Step(f"{out}~log", d, "Log", (f"{out}~sum",))
        if n.op_type == "LogSoftmax":
            return steps + [log, Step(out, d, "Sub", (f"{out}~shift", f"{out}~log"))]
        return steps + [log, Step(out, d, "Add", (f"{out}~log", f"{out}~max"))]
    if n.op_type in ("LayerNormalization", "InstanceNormalization"):
        # InstanceNormalization's scale and bias arrive as [C, 1, …] constants (channel_params).
        x, scale = n.inputs[0], n.inputs[1]
        bias = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
        eps = float(n.attrs.get("epsilon", 1e-5))  # type: ignore[arg-type]
        steps = [Step(f"{out}~mean", d, "ReduceMean", (x,)), Step(f"{out}~dev", d, "Sub", (x, f"{out}~mean")),
                 Step(f"{out}~sq", d, "Mul", (f"{out}~dev", f"{out}~dev")),
                 Step(f"{out}~var", d, "ReduceMean", (f"{out}~sq",)), Step(f"{out}~veps", d, "Add", (f"{out}~var", eps)),
                 Step(f"{out}~std", d, "Sqrt", (f"{out}~veps",)),
                 Step(f"{out}~norm", d, "Div", (f"{out}~dev", f"{out}~std")),
                 Step(out if bias is None else f"{out}~scaled", d, "Mul", (f"{out}~norm", scale))]
        return steps + ([Step(out, d, "Add", (f"{out}~scaled", bias))] if bias else [])
    return [Step(t, graph.tensors[t].dtype, n.op_type, tuple(n.inputs), n.attrs) for t in n.outputs if t]


def levels(steps: list[Step], inputs: Mapping[str, str]) -> dict[str, str]:
    """'elem' or 'row' for every tensor: reductions and steps over per-row values are per row."""
    level = dict(inputs)
    for s in steps:
        elem = any(isinstance(x, str) and level.get(x) == "elem" for x in s.inputs)
        level[s.out] = "row" if s.reduces or not elem else "elem"
    return level


def reciprocals(steps: list[Step], level: dict[str, str]) -> list[Step]:
    """Division of a per-element float by a per-row value becomes one reciprocal per row and a
    multiply per element (LayerNorm's and Softmax's divisions; within 1.5 ulp of the quotient)."""
    out: list[Step] = []
    for s in steps:
        if s.op == "Div" and s.dtype in ops.FLOATS and isinstance(s.inputs[1], str) and level.get(s.inputs[1]) == "row" \
                and level.get(s.out) == "elem":
            rcp = f"{s.out}~rcp"
            level[rcp] = "row"
            out += [Step(rcp, s.dtype, "Reciprocal", (s.inputs[1],)), Step(s.out, s.dtype, "Mul", (s.inputs[0], rcp))]
        else:
            out.append(s)
    return out
