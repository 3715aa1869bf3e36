"""Run generated kernels on the CPU: the CUDA source, with its few PTX instructions swapped for
host code, compiled by g++ against tests/host_cuda.h (threads per CUDA thread, barriers for
__syncthreads and shuffles) and launched as docs/abi.md says ONNX Runtime's custom op does
(iteration shape, strides, entry choice), with a small grid so grid-stride loops are walked.
Numerical tests compare what it computes with independent references, so the index
arithmetic, views, tiles, packing and row reductions are checked without a GPU."""
from __future__ import annotations

import ctypes
import hashlib
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from onnxstitch import graph as graph_mod
from onnxstitch.schemes.source import KernelSource
from onnxstitch.graph import MAX_INPUTS, MAX_OUTPUTS, MAX_RANK

HERE = Path(__file__).resolve().parent
HAVE_GXX = shutil.which("g++") is not None

# PTX instruction → host expression over its operands (%1, %2).
_PTX = {"cvt.f32.f16": "stitch_host::h2f({a})", "cvt.rn.f16.f32": "stitch_host::f2h({a})",
        "max.NaN.f32": "stitch_host::max_nan({a}, {b})", "min.NaN.f32": "stitch_host::min_nan({a}, {b})",
        "ex2.approx.ftz.f32": "stitch_host::ftz(exp2f({a}))", "lg2.approx.f32": "log2f({a})", "rcp.approx.f32": "(1.0f / {a})",
        "sqrt.approx.f32": "sqrtf({a})", "tanh.approx.f32": "tanhf({a})", "div.approx.f32": "({a} / {b})"}
_ASM = re.compile(r'asm\("([\w.]+) %0, %1(?:, %2)?;" : "=\w"\((\w+)\) : "\w"\((\w+)\)(?:, "\w"\((\w+)\))?\);')


# Device-only blocks (thread-block clusters, tensor-core products): tests/host_cuda.h has their
# host forms.
_DEVICE_ONLY = re.compile(r"#if defined\(__CUDA_ARCH__\)[^\n]*\n.*?#endif\n", re.S)
_SHARED = re.compile(r"__shared__ ([\w ]+?) (\w+)((?:\[[^\]]+\])+);")
# Dynamic shared memory (attention kernels): its size is the launch's, AttentionSpec.shared_bytes.
_DYNAMIC = re.compile(r"extern __shared__ __align__\(\d+\) ([\w ]+?) (\w+)\[\];")


def host_source(src: KernelSource) -> str:
    """The kernel's CUDA source as host C++ with a launcher for its entries (a split kernel's
    cluster entries when `clusters` is set)."""
    def swap(m: re.Match) -> str:
        op, out, a, b = m.groups()
        return f"{out} = {_PTX[op].format(a=a, b=b)};"

    ids = iter(range(1 << 20))
    body = _ASM.sub(swap, _DEVICE_ONLY.sub("", src.source))
    # Shared memory per block (host_cuda.h): the blocks of a cluster run at the same time.
    body = _SHARED.sub(lambda m: f"auto& {m[2]} = stitch_host::shared<{m[1]}{m[3]}>({next(ids)});", body)
    if src.shape_rule == "attention":
        # The tiled kernel's dynamic shared memory, then the decode kernel's (decode.py).
        sizes = iter((src.spec.shared_bytes, src.spec.decode_shared_bytes))
        body = _DYNAMIC.sub(lambda m: f"{m[1]}* {m[2]} = reinterpret_cast<{m[1]}*>(stitch_host::block->storage("
                            f"{next(ids)}, {next(sizes)}));", body)
    assert "asm(" not in body and "__shared__" not in body, "a device construct without a host form"
    if src.shape_rule == "attention":
        # `wide` picks the entry: 0 the tiled kernel, 1 the decode kernel, 2 its merge.
        (entry,) = src.entries
        run = f"stitch_host_launch({entry}, *a, grid, threads);"
        if src.spec.decode_rows:
            run = (f"if (wide == 1) stitch_host_launch({entry}_decode, *a, grid, threads);\n"
                   f"  else if (wide == 2) stitch_host_launch({entry}_merge, *a, grid, threads);\n  else {run}")
        return (f'#include "host_cuda.h"\n{body}\n'
                f'extern "C" void stitch_host_run(const StitchArgs* a, int grid, int threads, int wide, int clusters) {{\n'
                f'  (void)wide; (void)clusters;\n  {run}\n}}\n')
    fast, wide = src.entries
    plain = f"if (wide) stitch_host_launch({wide}, *a, grid, threads); else stitch_host_launch({fast}, *a, grid, threads);"
    if src.shape_rule == "rows" and src.spec.row_split > 1:
        ks = src.spec.row_split
        plain = (f"if (clusters && wide) stitch_host_launch_clusters({wide}_cl, *a, grid, threads, {ks});\n"
                 f"  else if (clusters) stitch_host_launch_clusters({fast}_cl, *a, grid, threads, {ks});\n  else {plain}")
    return (f'#include "host_cuda.h"\n{body}\n'
            f'extern "C" void stitch_host_run(const StitchArgs* a, int grid, int threads, int wide, int clusters) {{\n'
            f'  (void)clusters;\n  {plain}\n}}\n')


_FLAGS = ["-std=c++20", "-O1", "-fPIC", "-pthread", "-fno-strict-aliasing", "-Wno-unknown-pragmas"]


def _header(folder: Path) -> None:
    """host_cuda.h and its precompiled form in `folder` (the standard headers dominate a
    kernel's compile time: 1.7 s without, 0.65 s with)."""
    header = folder / "host_cuda.h"
    text = (HERE / "host_cuda.h").read_text()
    if header.exists() and header.read_text() == text and (folder / "host_cuda.h.gch").exists():
        return
    header.write_text(text)
    subprocess.run(["g++", *_FLAGS, "-x", "c++-header", "-o", str(folder / "host_cuda.h.gch"), str(header)],
                   check=True, capture_output=True, text=True)


def _library(src: KernelSource, folder: Path) -> ctypes.CDLL:
    code = host_source(src)
    key = hashlib.sha256((code + (HERE / "host_cuda.h").read_text()).encode()).hexdigest()[:16]
    lib = folder / f"k{key}.so"
    if not lib.exists():
        _header(folder)
        cc = folder / f"k{key}.cc"
        cc.write_text(code)
        subprocess.run(["g++", *_FLAGS, "-shared", f"-I{folder}", "-o", str(lib), str(cc)], check=True,
                       capture_output=True, text=True)
    return ctypes.CDLL(str(lib))


class _Args(ctypes.Structure):
    _fields_ = [("inp", ctypes.c_void_p * MAX_INPUTS), ("out", ctypes.c_void_p * MAX_OUTPUTS),
                ("n", ctypes.c_longlong), ("rank", ctypes.c_int), ("pad_", ctypes.c_int),
                ("dims", ctypes.c_longlong * MAX_RANK), ("strides", (ctypes.c_longlong * MAX_RANK) * MAX_INPUTS)]


def boxed(src: KernelSource, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The arrays bound to a kernel's inputs as it reads them: a boxed input (a folded
    Slice/Split) is a view of the box, its tensor's strides kept (docs/abi.md, input_boxes)."""
    out = list(inputs)
    for k, b in enumerate(src.input_boxes):
        if b is not None:
            out[k] = out[k][(slice(None),) * b.axis + (slice(b.start, b.stop),)]
    return out


def lifted(src: KernelSource, inputs: Sequence[np.ndarray]) -> list[tuple[int, ...]]:
    """Each bound array's shape as the iteration counts it: a windowed input (concats.py) at the
    Concat's size along its axis (docs/abi.md, input_windows)."""
    shapes = [tuple(x.shape) for x in inputs]
    for k, w in enumerate(src.input_windows):
        if w is not None:
            shapes[k] = shapes[k][:w.axis] + (w.total,) + shapes[k][w.axis + 1:]
    return shapes


def launch(src: KernelSource, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray], folder: Path, *,
           grid_cap: int = 3, wide: bool | None = None, clusters: bool = True, sm_count: int = 132) -> None:
    """Run `src` on the host over `inputs`, writing `outputs` (preallocated, contiguous), as
    the runtime launches it; `wide` forces the 64-bit entry (default: the runtime's choice);
    `clusters`: a split kernel's cluster entries (as on sm_90), else one block per row;
    `sm_count`: the GPU's multiprocessors an attention decode launch splits its keys for."""
    inputs = boxed(src, [np.ascontiguousarray(x) if x.ndim else x.reshape(()) for x in inputs])
    if src.shape_rule == "attention":
        _launch_attention(src, inputs, outputs, folder, sm_count)
        return
    counted = lifted(src, inputs)
    shape = np.broadcast_shapes(*counted) if inputs else ()
    n = math.prod(shape)
    rows = 0
    if src.shape_rule == "rows":
        stop = len(shape) - src.spec.row_inner  # the row's axes are [stop - row_axes, stop)
        rows = math.prod(shape[:stop - src.spec.row_axes]) * math.prod(shape[stop:])
    # Nothing to launch for empty outputs, except row-shaped outputs of empty rows (docs/abi.md).
    if n == 0 and not (src.shape_rule == "rows" and rows > 0 and any(k != 0 for k in src.spec.output_kinds)):
        return
    a = _Args()
    a.n, a.rank = n, len(shape)
    for d, v in enumerate(shape):
        a.dims[d] = v
    windows = src.input_windows or (None,) * len(inputs)
    for k, (x, own, w) in enumerate(zip(inputs, counted, windows)):
        # A windowed input starts `origin` elements before its first one along the axis.
        a.inp[k] = x.ctypes.data - (w.origin * x.strides[w.axis] if w is not None and x.size else 0)
        lead = len(shape) - len(own)
        for d in range(len(shape)):
            j = d - lead
            a.strides[k][d] = 0 if j < 0 or shape[d] == 1 or own[j] == 1 else x.strides[j] // x.itemsize
    for k, y in enumerate(outputs):
        assert y.flags.c_contiguous
        a.out[k] = y.ctypes.data
    if src.shape_rule == "rows":
        threads = src.spec.block_threads
        grid = max(1, min(math.ceil(rows / (threads // src.spec.row_threads)), grid_cap))
        if clusters and src.spec.row_split > 1:
            grid *= src.spec.row_split  # whole clusters, rows grid-strided by cluster
        use_wide = n >= 2 ** 30 if wide is None else wide
    else:
        aligned = all(x.ctypes.data % 16 == 0 for x, kind in zip(inputs, src.input_kinds) if kind == 0) and \
            all(y.ctypes.data % 16 == 0 for y in outputs)
        use_wide = not (n % src.vec_width == 0 and n < 2 ** 30 and aligned) if wide is None else wide
        work = n if use_wide else n // src.vec_width
        threads = 256
        grid = max(1, min(math.ceil(work / threads), grid_cap))
    _library(src, folder).stitch_host_run(ctypes.byref(a), grid, threads, int(use_wide), int(clusters))


def _aligned(x: np.ndarray) -> np.ndarray:
    """`x`, or a copy of it at a 16-byte aligned address (device allocations are; the attention
    kernel loads kᵀ and v 16 bytes at a time)."""
    if x.ctypes.data % 16 == 0:
        return x
    raw = np.empty(x.nbytes + 16, np.uint8)
    start = -raw.ctypes.data % 16
    y = raw[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
    y[...] = x
    return y


def attention_args(src: KernelSource, shapes: Sequence[tuple[int, ...]], pointers: Sequence[int],
                   out_shape: tuple[int, ...], out: int) -> tuple[_Args, int]:
    """(StitchArgs, grid) of an attention kernel's launch, as the attention scheme's launch fills
    them (attention_dims.h's AttentionDims), for row-major inputs of `shapes` at `pointers` (q, kᵀ, v,
    or xq, xk, xv and their biases, then the masks) and the output of `out_shape` at `out`: dims
    [B, H, Sq, Sk] (B = 1 for rank-3 operands), mask k's element strides over them
    (right-aligned, 0 where it broadcasts) in strides[first mask + k], the projections' widths in
    strides[0..2][0], n = B·H·Sq·D; a block of `spec.threads` threads per (batch, head, tile of
    `spec.queries` queries). Host launches and scripts/bench_attention.py share it."""
    spec = src.spec
    head, queries, masks, transposed, projected = spec.head_size, spec.queries, spec.masks, spec.transposed, spec.projected
    values = spec.value_size or head  # V's and the context's head width
    first = 6 if projected and spec.biases else 3
    assert len(shapes) == len(pointers) == first + masks, "q, kᵀ, v (or xq, xk, xv and biases) and the masks"
    qs, ks, vs = shapes[:3]
    a = _Args()
    if projected:
        # xq [b, Sq, Wq], xk and xv [b, Sk, W]: head j at columns offset + j·D; widths in strides[i][0].
        heads, offsets = spec.heads, spec.column_offsets
        assert all(len(x) == 3 and x[0] == qs[0] and x[2] % 4 == 0 and o + heads * head <= x[2]
                   for x, o in zip((qs, ks, vs), offsets)) and ks[1] == vs[1]
        assert all(tuple(x) == (heads * head,) for x in shapes[3:first])
        scores, r = (qs[0], heads, qs[1], ks[1]), 4
        for i, x in enumerate((qs, ks, vs)):
            a.strides[i][0] = x[2]
    elif spec.kv_group > 1:
        # Grouped KV heads: K and V [b, H / g, Sk, D] (K as rows).
        r, g = 4, spec.kv_group
        assert len(qs) == len(ks) == len(vs) == 4 and ks == vs and ks[0] == qs[0] and ks[1] * g == qs[1]
        assert qs[-1] == head and ks[-1] == head
        scores = (qs[0], qs[1], qs[2], ks[2])
    else:
        r = len(qs)
        assert 3 <= r <= 4 and len(ks) == r and len(vs) == r and (r == 4 or not transposed)
        assert qs[-1] == head and ks[-2] == head and vs[-1] == values and ks[-1] == vs[-2]
        assert qs[:-2] == ks[:-2] == vs[:-2]
        scores = (qs[0] if r == 4 else 1, qs[r - 3], qs[-2], ks[-1])
    a.rank, a.n = 4, math.prod(scores[:3]) * values
    for d, s in enumerate(scores):
        a.dims[d] = s
    for k, p in enumerate(pointers):
        a.inp[k] = p
    for k, ms in enumerate(shapes[first:]):
        assert len(ms) <= r, "the mask has a higher rank than the scores"
        for j, m in enumerate(ms):
            d = 4 - len(ms) + j
            assert m in (1, scores[d]), f"the mask {ms} does not broadcast to the scores {scores}"
            a.strides[first + k][d] = 0 if m == 1 and scores[d] != 1 else math.prod(ms[j + 1:])
    if projected:
        want = (scores[0], scores[2], scores[1], head) if transposed else (*scores[:3], head)
    else:
        want = (scores[0], scores[2], scores[1], values) if transposed else (*qs[:-1], values)
    assert tuple(out_shape) == want, f"the context is {want}, not {tuple(out_shape)}"
    a.out[0] = out
    return a, scores[0] * scores[1] * math.ceil(scores[2] / queries)


# The decode launch's constants (the attention scheme's launch.cc).
DECODE_THREADS, DECODE_BLOCKS_PER_SM = 128, 4


def decode_splits(spec, dims: Sequence[int], sm_count: int) -> tuple[int, int]:
    """(keys a split, splits) of a decode launch over dims [B, H, Sq, Sk], as launch.cc sets
    them for a GPU of `sm_count` multiprocessors."""
    b, h, _, sk = dims
    kt, base = spec.decode_keys, b * (h // spec.kv_group)
    tiles = -(-sk // kt)
    splits = max(1, min(-(-(DECODE_BLOCKS_PER_SM * sm_count) // base), tiles))
    chunk = max(kt, -(-tiles // splits) * kt)
    return chunk, (-(-sk // chunk) if sk > 0 else 1)


def _launch_attention(src: KernelSource, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                      folder: Path, sm_count: int = 132) -> None:
    """An attention kernel's launch on the host (attention_args), inputs at 16-byte aligned
    addresses as device allocations are; the context of the spec's type. A node with decode
    entries takes them where the runtime does (kv_group · Sq ≤ decode_rows): the splits for a
    GPU of `sm_count` multiprocessors, their partials in a scratch array, then the merge."""
    inputs = [_aligned(x) for x in inputs]
    (y,) = outputs
    want = onnx.helper.tensor_dtype_to_np_dtype(src.output_dtypes[0])
    assert y.flags.c_contiguous and y.dtype == want, f"the context is {np.dtype(want).name}, not {y.dtype}"
    a, grid = attention_args(src, [x.shape for x in inputs], [x.ctypes.data for x in inputs], y.shape, y.ctypes.data)
    if a.n == 0:
        return  # nothing to compute, as the runtime
    lib = _library(src, folder)
    spec = src.spec
    if not (spec.decode_rows and spec.kv_group * a.dims[2] <= spec.decode_rows):
        lib.stitch_host_run(ctypes.byref(a), grid, spec.threads, 0, 0)
        return
    dims = [a.dims[d] for d in range(4)]
    chunk, splits = decode_splits(spec, dims, sm_count)
    a.dims[4], a.dims[5] = chunk, splits
    rows = dims[0] * dims[1] * dims[2]
    scratch = np.full(rows * splits * (spec.head_size + 2), np.nan, np.float32) if splits > 1 else None
    a.out[1] = scratch.ctypes.data if scratch is not None else None
    lib.stitch_host_run(ctypes.byref(a), dims[0] * (dims[1] // spec.kv_group) * splits, DECODE_THREADS, 1, 0)
    if splits > 1:
        lib.stitch_host_run(ctypes.byref(a), rows, DECODE_THREADS, 2, 0)


def group_inputs(graph: graph_mod.FusionGraph, model: onnx.ModelProto, names: Sequence[str],
                 feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The arrays a group reads: graph inputs from `feeds`, the rest from the model's constants."""
    inits = {t.name: t for t in model.graph.initializer} | dict(graph.constants)
    missing = [t for t in names if t not in feeds and t not in inits]
    assert not missing, f"computed outside the fused groups (by ONNX Runtime): {missing}"
    return [feeds[t] if t in feeds else numpy_helper.to_array(inits[t]) for t in names]


def plan_sources(model: onnx.ModelProto, dims: Mapping[str, Sequence[int]]):
    """(normalized model, graph, groups, kernel sources) as `optimize` plans them at `dims`."""
    from onnxstitch import load, normalize, pack, plan, shapes, siblings, sizes
    from onnxstitch.cost import CostModel
    from onnxstitch.pipeline import generate_kernel

    m = load.constants_to_initializers(load.load(model))
    m, dim_values = sizes.resolve_shapes(m, sizes.applicable(m, dims))
    _, infos = shapes.infer(m)
    merged = siblings.merge(m, infos)
    m, infos = merged.model, merged.tensors
    normal = normalize.normalize(m, infos)
    m, infos = normal.model, normal.tensors
    g = graph_mod.build(m, infos, dim_values, True)
    # Columns at full bandwidth: small column kernels are what these tests run (cost.column_share).
    free = CostModel(column_share=False)
    groups = pack.pack(g, plan.make_plan(g, free), free).groups
    return m, g, groups, [generate_kernel(g, f"stitch_h{k}", grp) for k, grp in enumerate(groups)]


def run_model(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], out_like: Mapping[str, np.ndarray],
              dims: Mapping[str, Sequence[int]], folder: Path, *, wide: bool | None = None,
              clusters: bool = True) -> dict[str, np.ndarray]:
    """Every group of a model run on the host in node order (the groups may read only graph
    inputs, constants, earlier groups' outputs and views of them: Shape and Reshape nodes are
    evaluated here); graph outputs are allocated like `out_like` (poisoned), intermediates over
    their iteration shape."""
    m, g, groups, srcs = plan_sources(model, dims)
    values = dict(feeds)
    first = {min(grp.nodes): src for grp, src in zip(groups, srcs)}
    grouped = {i for grp in groups for i in grp.nodes}
    for i, node in enumerate(g.nodes):
        if i in grouped and i not in first:
            continue
        if i not in grouped:
            _view(node, values, m)
            continue
        src = first[i]
        ins = group_inputs(g, m, src.bound_inputs, values)
        shape = np.broadcast_shapes(*lifted(src, boxed(src, ins)))
        outs = []
        for t in src.outputs:
            like = out_like.get(t)
            dtype = like.dtype if like is not None else onnx.helper.tensor_dtype_to_np_dtype(g.tensors[t].dtype)
            outs.append(np.full(like.shape if like is not None else shape, np.nan if dtype.kind == "f" or
                                dtype.name == "bfloat16" else 77, dtype))
        launch(src, ins, outs, folder, wide=wide, clusters=clusters)
        values.update(zip(src.outputs, outs))
    return {t: values[t] for t in out_like}


def _view(node, values: dict, model: onnx.ModelProto) -> None:
    """A node outside the groups: Shape and Reshape (views in ONNX Runtime) of known values
    are evaluated, and MatMul (ONNX Runtime's GEMM, in numpy: a merged sibling GEMM's product
    feeds the kernels reading its Slices); anything else a group reads fails in group_inputs."""
    inits = {t.name: t for t in model.graph.initializer}
    if node.op_type not in ("Shape", "Reshape", "MatMul") or not (node.inputs[0] in values or node.inputs[0] in inits):
        return
    x = values[node.inputs[0]] if node.inputs[0] in values else numpy_helper.to_array(inits[node.inputs[0]])
    if node.op_type == "MatMul":
        w = values[node.inputs[1]] if node.inputs[1] in values else numpy_helper.to_array(inits[node.inputs[1]])
        values[node.outputs[0]] = np.matmul(x.astype(np.float32), w.astype(np.float32)).astype(x.dtype)
        return
    if node.op_type == "Shape":
        values[node.outputs[0]] = np.array(x.shape, np.int64)
        return
    wanted = model.graph.node[node.index].input[1]  # (the graph keeps only a Reshape's data input)
    if wanted not in values and wanted not in inits:
        return
    shape = values[wanted] if wanted in values else numpy_helper.to_array(inits[wanted])
    target = [x.shape[k] if d == 0 else int(d) for k, d in enumerate(shape)]
    values[node.outputs[0]] = x.reshape(target)
