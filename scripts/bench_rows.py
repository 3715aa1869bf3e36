#!/usr/bin/env python3
"""Benchmark: stitched row kernels — LayerNorm over [B·S, 768], attention Softmax over
[B, 12, S, S] (B=8, S=512), a UNet's GroupNorm + SiLU and a language model's Softmax over its
vocabulary, float32 and float16 — against the device-to-device copy bandwidth,
plus stock ORT vs stitched end to end. Kernels are launched from their embedded cubins and
timed with CUDA events; bytes = every input read once + every output written once. Split rows
(few long rows, a cluster of blocks per row) are also timed unsplit, in the same run.

    python scripts/bench_rows.py --out rows.json
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxstitch  # noqa: E402
from onnxstitch import bench  # noqa: E402
from onnxstitch.cost import CostModel  # noqa: E402
from onnxstitch.schemes.rows import printer as rows_printer  # noqa: E402
from onnxstitch import rowplan as rows_mod  # noqa: E402
from onnxstitch.inputs import random_feeds  # noqa: E402
from scripts.bench_elementwise import _Args, copy_bandwidth, launch_ms, node_image  # noqa: E402

B, S, HIDDEN, HEADS = 8, 512, 768, 12


def layernorm(dtype: int, decomposed: bool) -> onnx.ModelProto:
    """Residual add + LayerNorm over [B·S, 768], as an op or as exporters decompose it."""
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(npd), "g"),
             numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(npd), "b")]
    if decomposed:
        inits += [numpy_helper.from_array(np.array([-1], np.int64), "axes"),
                  numpy_helper.from_array(np.array(2.0, npd), "two"), numpy_helper.from_array(np.array(1e-5, npd), "eps")]
        nodes = [helper.make_node("Add", ["x", "r"], ["h"]), helper.make_node("ReduceMean", ["h", "axes"], ["mu"]),
                 helper.make_node("Sub", ["h", "mu"], ["d"]), helper.make_node("Pow", ["d", "two"], ["d2"]),
                 helper.make_node("ReduceMean", ["d2", "axes"], ["var"]), helper.make_node("Add", ["var", "eps"], ["ve"]),
                 helper.make_node("Sqrt", ["ve"], ["sd"]), helper.make_node("Div", ["d", "sd"], ["n"]),
                 helper.make_node("Mul", ["n", "g"], ["ng"]), helper.make_node("Add", ["ng", "b"], ["y"])]
    else:
        nodes = [helper.make_node("Add", ["x", "r"], ["h"]),
                 helper.make_node("LayerNormalization", ["h", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
    ins = [helper.make_tensor_value_info(n, dtype, ["rows", HIDDEN]) for n in ("x", "r")]
    g = helper.make_graph(nodes, "ln", ins, [helper.make_tensor_value_info("y", dtype, ["rows", HIDDEN])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def softmax(dtype: int, s: int = S) -> onnx.ModelProto:
    """Attention scores: scale, add the [B, 1, 1, S] mask, Softmax over the last axis."""
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    nodes = [helper.make_node("Mul", ["s", "k"], ["a"]), helper.make_node("Add", ["a", "m"], ["b"]),
             helper.make_node("Softmax", ["b"], ["p"], axis=-1)]
    ins = [helper.make_tensor_value_info("s", dtype, ["batch", HEADS, s, s]),
           helper.make_tensor_value_info("m", dtype, ["batch", 1, 1, s])]
    g = helper.make_graph(nodes, "sm", ins, [helper.make_tensor_value_info("p", dtype, ["batch", HEADS, s, s])],
                          [numpy_helper.from_array(np.array(0.125, npd), "k")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def group_norm(dtype: int, channels: int, side: int, groups: int = 32) -> onnx.ModelProto:
    """GroupNorm + SiLU over [2, C, side, side] as torch.onnx exports it (a diffusion UNet's
    ResNet block): Reshape → InstanceNormalization → Reshape(Shape(x)) → Mul → Add → SiLU."""
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array([0, groups, -1], np.int64), "grouped"),
             numpy_helper.from_array(np.ones(groups, npd), "ones"), numpy_helper.from_array(np.zeros(groups, npd), "zeros"),
             numpy_helper.from_array(rng.standard_normal((channels, 1, 1)).astype(npd), "gamma"),
             numpy_helper.from_array(rng.standard_normal((channels, 1, 1)).astype(npd), "beta")]
    nodes = [helper.make_node("Reshape", ["x", "grouped"], ["r"]),
             helper.make_node("InstanceNormalization", ["r", "ones", "zeros"], ["inorm"], epsilon=1e-5),
             helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Reshape", ["inorm", "xs"], ["back"]),
             helper.make_node("Mul", ["back", "gamma"], ["m"]), helper.make_node("Add", ["m", "beta"], ["gn"]),
             helper.make_node("Sigmoid", ["gn"], ["sg"]), helper.make_node("Mul", ["gn", "sg"], ["y"])]
    dims = ["batch", channels, side, side]
    g = helper.make_graph(nodes, "gn", [helper.make_tensor_value_info("x", dtype, dims)],
                          [helper.make_tensor_value_info("y", dtype, dims)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def dfl(dtype: int, bins: int = 16, anchors: int = 8400) -> onnx.ModelProto:
    """YOLOv8's distribution focal loss decode over [batch, 4, bins, anchors]: Softmax over the
    bins (axis 2), weighted by the bin positions, summed away — a column reduction."""
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    inits = [numpy_helper.from_array(np.arange(bins, dtype=npd).reshape(bins, 1), "bins"),
             numpy_helper.from_array(np.array([2], np.int64), "axes")]
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=2), helper.make_node("Mul", ["p", "bins"], ["t"]),
             helper.make_node("ReduceSum", ["t", "axes"], ["y"], keepdims=0)]
    g = helper.make_graph(nodes, "dfl", [helper.make_tensor_value_info("x", dtype, ["batch", 4, bins, anchors])],
                          [helper.make_tensor_value_info("y", dtype, ["batch", 4, anchors])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def logits_softmax(dtype: int, vocab: int = 50257) -> onnx.ModelProto:
    """Softmax over a language model's vocabulary, scaled by a temperature: few long rows."""
    x = helper.make_tensor_value_info("x", dtype, ["batch", vocab])
    y = helper.make_tensor_value_info("y", dtype, ["batch", vocab])
    nodes = [helper.make_node("Mul", ["x", "t"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    npd = helper.tensor_dtype_to_np_dtype(dtype)
    g = helper.make_graph(nodes, "logits", [x], [y], [numpy_helper.from_array(np.array(1.25, npd), "t")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def grn_norm(dtype: int, side: int, channels: int) -> onnx.ModelProto:
    """ConvNeXt V2's GRN norm as the dynamo exporter writes it: ‖x‖₂ over H × W of NHWC x
    (x², ReduceSum over axes 1 and 2, Sqrt) — few long columns, split across a cluster."""
    axes = numpy_helper.from_array(np.array([1, 2], np.int64), "hw")
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("ReduceSum", ["sq", "hw"], ["ss"], keepdims=1),
             helper.make_node("Sqrt", ["ss"], ["y"])]
    g = helper.make_graph(nodes, "grn", [helper.make_tensor_value_info("x", dtype, ["batch", side, side, channels])],
                          [helper.make_tensor_value_info("y", dtype, ["batch", 1, 1, channels])], [axes])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


# ConvNeXt V2-tiny's four stages (side, channels), and its first stage at V2-base-like widths.
GRN_STAGES = ((56, 96), (28, 192), (14, 384), (7, 768), (56, 384))


def strides(shape: tuple[int, ...], full: tuple[int, ...]) -> list[int]:
    """docs/abi.md strides of a contiguous input against the iteration shape."""
    out, own = [0] * len(full), 1
    for j in range(len(shape) - 1, -1, -1):
        d = len(full) - len(shape) + j
        out[d] = 0 if shape[j] == 1 and full[d] != 1 else own
        own *= shape[j]
    return out


def rows_kernel_ms(node: onnx.NodeProto, arrays: list, outs: list, reps: int = 50) -> float:
    """Milliseconds per launch of a rows kernel, launched as the runtime would."""
    launch = rows_launcher(node, arrays, outs)
    return launch_ms(lambda: launch(None), reps)


def rows_launcher(node: onnx.NodeProto, arrays: list, outs: list):
    """A function launching the rows kernel of `node` on a stream (a CUstream handle, None for
    the default one) as the runtime would: its grid and block, its StitchArgs; checked by five
    launches first."""
    import cupy as cp

    image, name, _ = node_image(node)
    cuda = ctypes.CDLL("libcuda.so.1")

    def check(r: int, what: str) -> None:
        if r != 0:
            text = ctypes.c_char_p()
            cuda.cuGetErrorName(r, ctypes.byref(text))
            raise RuntimeError(f"{what}: {text.value.decode() if text.value else r}")

    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(image)), f"cuModuleLoadData({name})")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    span, threads, block, *after = attrs.get("row_geometry", [1, 256, 256])
    split = after[1] if len(after) > 1 else 1  # a split row: its cluster entry (sm_90), as the runtime
    entry = name + ("_rows_cl" if split > 1 else "_rows")
    check(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, entry.encode()), f"cuModuleGetFunction({entry})")
    full = tuple(int(d) for d in np.broadcast_shapes(*[a.shape for a in arrays]))
    args = _Args()
    for k, a in enumerate(arrays):
        args.inp[k] = a.data.ptr
        for d, st in enumerate(strides(a.shape, full)):
            args.strides[k][d] = st
    for k, o in enumerate(outs):
        args.out[k] = o.data.ptr
    args.n, args.rank = int(np.prod(full)), len(full)
    for d, v in enumerate(full):
        args.dims[d] = v
    stop = len(full) - (after[0] if after else 0)  # the row's axes: [stop - span, stop)
    rows = int(np.prod(full[:stop - span])) * int(np.prod(full[stop:]))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    per_block = block // threads  # as the runtime launches (docs/abi.md): one wave of resident blocks
    resident = ctypes.c_int(0)
    if cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(resident), fn, block, ctypes.c_size_t(0)) != 0:
        resident.value = 2048 // block
    grid = max(1, min(-(-rows // per_block), resident.value * sms))
    if split > 1:  # whole clusters, one wave, one per block's worth of rows (launch.cc): a split
        # column kernel's cluster takes `per_block` columns (it read `rows` clusters, ~90 % idle)
        grid = max(1, min(-(-rows // per_block), resident.value * sms // split)) * split
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(args), ctypes.c_void_p))
    for _ in range(5):
        check(cuda.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, None, params, None), f"cuLaunchKernel({entry}, {grid})")
    check(cuda.cuCtxSynchronize(), f"{entry} (grid {grid}, block {block})")

    def launch(stream) -> int:
        return cuda.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, ctypes.c_void_p(stream), params, None)

    launch.keep = (args, params, mod)  # what the launches point at lives as long as they may run
    return launch


def kernel_alone(model: onnx.ModelProto, dims: dict, copy_gbs: float,
                 threads: int | None = None, unsplit: bool = False, split: tuple | None = None
                 ) -> tuple[onnx.ModelProto, dict]:
    """The stitched model and its one rows kernel's time alone (threads per row forced when
    given, as choose_geometry takes it; `unsplit`: one block per row, as before split rows;
    `split`: (blocks per row, elements per thread, prefetch) forced for a split row)."""
    import cupy as cp

    if unsplit or split:
        saved = (rows_mod.split_factor, rows_mod.SPLIT_ELEMENTS_PER_THREAD, rows_printer.SPLIT_PREFETCH,
                 rows_mod.column_split_factor)
        k, per_thread, prefetch = split or (1, saved[1], saved[2])
        rows_mod.split_factor = lambda cols, n: k
        rows_mod.column_split_factor = lambda cols, n, b: k
        rows_mod.SPLIT_ELEMENTS_PER_THREAD, rows_printer.SPLIT_PREFETCH = per_thread, prefetch
        try:
            res = onnxstitch.optimize(model, shapes={k: [v] for k, v in dims.items()}, reductions=True, verify=False,
                                      archs=("sm_90",), gate=False, cost=CostModel(column_share=False))
        finally:
            (rows_mod.split_factor, rows_mod.SPLIT_ELEMENTS_PER_THREAD, rows_printer.SPLIT_PREFETCH,
             rows_mod.column_split_factor) = saved
    elif threads is None:  # (columns priced at full bandwidth: the kernel is what is timed)
        res = onnxstitch.optimize(model, shapes={k: [v] for k, v in dims.items()}, reductions=True, verify=False,
                                  gate=False, cost=CostModel(column_share=False))
    else:  # a sweep: the planner's kernel regenerated with other threads per row
        # (rows.row_plan looks choose_geometry up in its module at each call)
        original = rows_mod.choose_geometry
        rows_mod.choose_geometry = lambda cols, vec, span, _t=None, n=None, inputs=1: original(cols, vec, span, threads,
                                                                                               n, inputs)
        try:
            res = onnxstitch.optimize(model, shapes={k: [v] for k, v in dims.items()}, reductions=True, verify=False)
        finally:
            rows_mod.choose_geometry = original
    fused = [n for n in res.model.graph.node if n.op_type == "FusedKernel" and
             any(a.name == "shape_rule" and a.s == b"rows" for a in n.attribute)]
    if not fused:
        return res.model, {"kernels_stitched": 0}
    feeds = random_feeds(model, 0, dims)
    inputs = [cp.asarray(a) for a in kernel_inputs(res.model, feeds, list(fused[0].input))]
    full = np.broadcast_shapes(*[a.shape for a in inputs])
    # outputs at the graph's shapes (a reduction's output is smaller than the iteration space)
    shapes = {o.name: [d.dim_value or dims.get(d.dim_param, 1) for d in o.type.tensor_type.shape.dim]
              for o in res.model.graph.output}
    outs = [cp.empty(shapes.get(t, full), dtype=inputs[0].dtype) for t in fused[0].output]
    ms = rows_kernel_ms(fused[0], inputs, outs)
    moved = sum(a.nbytes for a in inputs) + sum(o.nbytes for o in outs)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in fused[0].attribute}
    # A copy of the same bytes too: small kernels (BERT's rows, float16) cannot reach the
    # steady rate of a 100 MB copy, and neither can a copy of their size.
    same_gbs = copy_bandwidth(max(moved // 2, 4))
    return res.model, {"kernels_stitched": len(fused), "row_geometry": list(attrs.get("row_geometry", [])),
                       "kernel_ms": ms, "kernel_gbs": moved / (ms * 1e-3) / 1e9,
                       "fraction_of_copy": moved / (ms * 1e-3) / 1e9 / copy_gbs,
                       "same_size_copy_gbs": same_gbs,
                       "fraction_of_same_size_copy": moved / (ms * 1e-3) / 1e9 / same_gbs}


def kernel_inputs(stitched: onnx.ModelProto, feeds: dict, names: list[str]) -> list[np.ndarray]:
    """The arrays a kernel reads: feeds, initializers, or tensors the model computes before it
    (a group norm's grouped view of x), from ORT CPU running the stitched model's fallback."""
    inits = {i.name: numpy_helper.to_array(i) for i in stitched.graph.initializer}
    computed = [t for t in names if t not in feeds and t not in inits]
    if computed:
        import onnxruntime as ort

        m = onnx.ModelProto()
        m.CopyFrom(stitched)
        del m.graph.output[:]
        m.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in computed)
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = {**feeds, **dict(zip(computed, sess.run(computed, feeds)))}
    return [feeds[t] if t in feeds else inits[t] for t in names]


def measure(label: str, model: onnx.ModelProto, dims: dict, copy_gbs: float, iters: int) -> dict:
    stitched, alone = kernel_alone(model, dims, copy_gbs)
    row = {"case": label, "nodes_before": len(model.graph.node), **alone}
    geometry = alone.get("row_geometry", [])
    if len(geometry) == 5 and geometry[4] > 1:  # the same group unsplit, in the same run
        try:
            _, one = kernel_alone(model, dims, copy_gbs, unsplit=True)
        except Exception as e:  # reported, not fatal: the split kernel's figures stand
            one = {"error": str(e)[:300]}
            print(f"{label}: unsplit kernel failed: {e}")
        row["unsplit"] = one
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "m.onnx", Path(tmp) / "m.stitched.onnx"
        onnx.save(model, src)
        onnx.save(stitched, dst)
        b = bench.run(src, dst, config=bench.BenchConfig(warmup=10, iters=iters, cuda_graph=True), shapes=dims)
    row.update(stock_ms=b.stock.median_ms, stitched_ms=b.stitched.median_ms, speedup=b.speedup,
               max_abs_err=b.max_abs_err, launches_stock=b.stock.launches_per_run)
    return row


def split_sweep(out: Path, copy_gbs: float) -> int:
    """Kernel time of few-long-rows cases under every split choice, unsplit included."""
    cases = [(f"GroupNorm float {c}x{side}", group_norm(TP.FLOAT, c, side), {"batch": 2}) for c, side in
             ((320, 64), (1280, 16), (320, 128))]
    cases += [("GroupNorm float16 320x64", group_norm(TP.FLOAT16, 320, 64), {"batch": 2}),
              ("Softmax logits float [8,50257]", logits_softmax(TP.FLOAT), {"batch": 8})]
    results = []
    for label, model, dims in cases:
        choices = [None] + [(k, e, p) for k in (2, 4, 8) for e in (16, 32) for p in (True, False)]
        for choice in choices:
            try:
                _, alone = kernel_alone(model, dims, copy_gbs, unsplit=choice is None, split=choice)
            except Exception as e:  # a choice the kernel cannot take is reported, not fatal
                alone = {"error": str(e)[:200]}
            results.append({"case": label, "split": choice, **alone})
            ms = alone.get("kernel_ms")
            print(f"{label:32} {str(choice):20} " + (f"{ms * 1e3:8.2f} µs {alone['fraction_of_copy']:7.1%} "
                                                      f"{alone['row_geometry']}" if ms else str(alone)[:120]))
    out.write_text(json.dumps({"gpu": bench.gpu_name(), "copy_gbs": copy_gbs, "split_sweep": results}, indent=2))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench_rows.json"))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--sweep", action="store_true", help="also time every threads-per-row choice on BERT shapes")
    ap.add_argument("--columns", action="store_true",
                    help="only the GRN column reductions (ConvNeXt V2 stages), split and unsplit")
    ap.add_argument("--split-sweep", action="store_true",
                    help="only time split rows under each blocks per row, elements per thread and prefetch choice")
    args = ap.parse_args()
    copy_gbs = copy_bandwidth(B * HEADS * S * S * 4)
    if args.split_sweep:
        return split_sweep(args.out, copy_gbs)
    rows = []
    for dt in (TP.FLOAT, TP.FLOAT16):
        name = TP.DataType.Name(dt).lower()
        for side, c in GRN_STAGES:  # few long columns (issue 36: at least 80% of the copy)
            rows.append(measure(f"GRN norm {name} 8x{side}x{side}x{c}", grn_norm(dt, side, c), {"batch": 8}, copy_gbs,
                                args.iters))
        if args.columns:
            continue
        rows.append(measure(f"LayerNorm op {name}", layernorm(dt, False), {"rows": B * S}, copy_gbs, args.iters))
        rows.append(measure(f"LayerNorm decomposed {name}", layernorm(dt, True), {"rows": B * S}, copy_gbs, args.iters))
        rows.append(measure(f"Softmax {name}", softmax(dt), {"batch": B}, copy_gbs, args.iters))
        # BERT-base at sequence 128: far fewer rows, the sizes the model runs
        rows.append(measure(f"LayerNorm op {name} S=128", layernorm(dt, False), {"rows": B * 128}, copy_gbs, args.iters))
        rows.append(measure(f"Softmax {name} S=128", softmax(dt, 128), {"batch": B}, copy_gbs, args.iters))
        rows.append(measure(f"DFL decode {name} [8,4,16,8400]", dfl(dt), {"batch": 8}, copy_gbs, args.iters))
        # GroupNorm + SiLU of a diffusion UNet (normalize.py): 64 rows of C/32·side² elements
        for c, side in ((320, 64), (640, 32), (1280, 16), (320, 128)):
            rows.append(measure(f"GroupNorm {name} {c}x{side}", group_norm(dt, c, side), {"batch": 2}, copy_gbs,
                                args.iters))
        rows.append(measure(f"Softmax logits {name} [8,50257]", logits_softmax(dt), {"batch": 8}, copy_gbs, args.iters))
    sweep = []
    if args.sweep:
        for dt in (TP.FLOAT, TP.FLOAT16):
            name = TP.DataType.Name(dt).lower()
            for label, model, dims in ((f"LayerNorm {name} [{B * 128}, 768]", layernorm(dt, False), {"rows": B * 128}),
                                       (f"LayerNorm {name} [{B * S}, 768]", layernorm(dt, False), {"rows": B * S}),
                                       (f"Softmax {name} S=128", softmax(dt, 128), {"batch": B}),
                                       (f"Softmax {name} S=512", softmax(dt), {"batch": B})):
                for t in (4, 8, 16, 32, 64, 128, 256):
                    try:
                        _, alone = kernel_alone(model, dims, copy_gbs, threads=t)
                    except Exception as e:  # a geometry the kernel cannot take is reported, not fatal
                        sweep.append({"case": label, "threads": t, "error": str(e)[:200]})
                        continue
                    sweep.append({"case": label, "threads": t, **alone})
                    print(f"sweep {label:32} T={t:4d} {alone['kernel_ms'] * 1e3:8.2f} µs {alone['fraction_of_copy']:7.1%}")
    args.out.write_text(json.dumps({"gpu": bench.gpu_name(), "copy_gbs": copy_gbs, "cases": rows, "sweep": sweep},
                                   indent=2))
    print(f"GPU {bench.gpu_name()}: device-to-device copy {copy_gbs:.0f} GB/s (CUDA graphs for end to end)")
    print(f"{'case':28} {'kernel ms':>9} {'GB/s':>6} {'of copy':>8} {'same-size':>9} {'stock ms':>9} {'stitched ms':>11} "
          f"{'speedup':>8} {'nodes':>5}")
    for r in rows:
        if "kernel_ms" not in r:
            print(f"{r['case']:28} {'(not stitched)':>26} {r['stock_ms']:9.4f} {r['stitched_ms']:11.4f}")
            continue
        print(f"{r['case']:28} {r['kernel_ms']:9.4f} {r['kernel_gbs']:6.0f} {r['fraction_of_copy']:8.1%} "
              f"{r['fraction_of_same_size_copy']:9.1%} {r['stock_ms']:9.4f} {r['stitched_ms']:11.4f} {r['speedup']:8.2f} {r['nodes_before']:5d}")
        if "kernel_ms" in r.get("unsplit", {}):
            u = r["unsplit"]
            print(f"{'  unsplit (one block per row)':28} {u['kernel_ms']:9.4f} {u['kernel_gbs']:6.0f} {u['fraction_of_copy']:8.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
