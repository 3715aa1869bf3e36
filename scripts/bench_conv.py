#!/usr/bin/env python3
"""Convolution epilogues, the issue's kernel-level criterion: each conv group a model's plan
takes (optimize --epilogues) within 5% of the same cuDNN call without its epilogue.

Per distinct conv node of the stitched model (its attributes and input shapes), two models of
`--copies` nodes each (weights of their own, one X and one R): the node as planned, and its plain
twin — the same convolution, layouts and dtype with no bias, residual or activation (what the
library would run if the epilogue were left to other kernels). Both run through the onnxstitch
library with CUDA graphs, timed together round by round (onnxstitch.bench's loop); µs per node
is the median run over the copies. Beside the issue's criterion, each row also says whether the
epilogue is within 5% of the plain call plus reading its extra operands (residual, bias) at the
device's copy bandwidth: a residual is a tensor more to read, not elementwise work, and the
unfused chain reads it too.

    python3 scripts/bench_conv.py MODEL --shape batch=8 [--out bench_conv.json] [--copies 8]
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxstitch  # noqa: E402
from onnxstitch import bench, load, shapes  # noqa: E402
from onnxstitch import graph as graph_mod  # noqa: E402
from onnxstitch.graph import FusionGraph  # noqa: E402
from onnxstitch.runtime import session as stitch_session  # noqa: E402
from onnxstitch.schemes.conv.layout import nhwc_info  # noqa: E402
from onnxstitch.schemes.conv.spec import ACTIVATIONS  # noqa: E402

WITHIN = 1.05  # the criterion: an epilogue costs at most 5% over the plain call
_EPILOGUE_ATTRS = ("conv_bias", "conv_residual", "conv_activation")


@dataclass(frozen=True)
class Case:
    """One conv node as planned: its attributes and the shapes of X, W, [bias], [R]."""

    node: onnx.NodeProto
    shapes: tuple[tuple[int, ...], ...]
    dtype: int

    @property
    def attrs(self) -> dict:
        return {a.name: helper.get_attribute_value(a) for a in self.node.attribute}

    def describe(self) -> str:
        a = self.attrs
        x, w = self.shapes[:2]
        parts = ["bias"] * a["conv_bias"] + ["residual"] * bool(a["conv_residual"])
        parts += [ACTIVATIONS[a["conv_activation"]]] if a["conv_activation"] else []
        group = f" group {a['conv_group']}" if a["conv_group"] > 1 else ""
        return (f"X {list(x)} W {list(w)}{group} layouts {a['conv_layouts']} "
                f"{'+'.join(parts) or 'no epilogue'}")


def _shape(g: FusionGraph, name: str, dims: dict[str, int]) -> tuple[int, ...]:
    """`name`'s shape with its symbols given (an NHWC name's as the rewrite declares it)."""
    info = g.tensors.get(name) or nhwc_info(g, name)
    if info.shape is None:
        raise SystemExit(f"bench_conv: '{name}' has no inferred shape")
    got = tuple(d if isinstance(d, int) else dims.get(d) for d in info.shape)
    if any(d is None for d in got):
        raise SystemExit(f"bench_conv: '{name}' has dims {info.shape}: give every symbol with --shape")
    return got


def cases(model: str | onnx.ModelProto, stitched: onnx.ModelProto, dims: dict[str, int]) -> list[Case]:
    """Every distinct conv node of `stitched` (optimized from `model`) with its shapes."""
    g = graph_mod.build(*shapes.infer(load.load_detached(model)[0]))
    inits = {t.name: tuple(t.dims) for t in stitched.graph.initializer}
    seen, out = set(), []
    for n in stitched.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if n.domain != "com.onnxstitch" or attrs.get("shape_rule", b"") not in (b"conv", "conv"):
            continue
        ins = [inits[t] if t in inits else _shape(g, t, dims) for t in n.input]
        key = (tuple(sorted((k, str(v)) for k, v in attrs.items() if k.startswith("conv_"))), tuple(ins))
        if key not in seen:
            seen.add(key)
            out.append(Case(n, tuple(ins), attrs["output_dtypes"][0]))
    return out


def plain(case: Case) -> Case:
    """The same convolution with no epilogue: X and W alone, bias, residual and activation off."""
    node = onnx.NodeProto()
    node.CopyFrom(case.node)
    del node.input[2:]
    for a in node.attribute:
        if a.name in _EPILOGUE_ATTRS:
            a.i = 0
        elif a.name == "conv_activation_params":
            a.ints[:] = [0, 0]
        elif a.name == "input_kinds":
            a.ints[:] = a.ints[:2]
    return Case(node, case.shapes[:2], case.dtype)


def node_model(case: Case, copies: int, seed: int = 0) -> onnx.ModelProto:
    """`copies` nodes of `case` over one X (and R), each with weights (and bias) of its own."""
    rng = np.random.default_rng(seed)
    np_dtype = helper.tensor_dtype_to_np_dtype(case.dtype)
    a = case.attrs
    names = ["x", "w", "b", "r"][:2] + (["b"] if a["conv_bias"] else []) + (["r"] if a["conv_residual"] else [])
    x_shape, w_shape = case.shapes[:2]
    inits, nodes = [], []
    for i in range(copies):
        fan_in = int(np.prod(w_shape[1:]))
        inits.append(numpy_helper.from_array((rng.standard_normal(w_shape) / np.sqrt(fan_in)).astype(np_dtype), f"w{i}"))
        if a["conv_bias"]:
            inits.append(numpy_helper.from_array((0.5 * rng.standard_normal(w_shape[0])).astype(np_dtype), f"b{i}"))
        node = onnx.NodeProto()
        node.CopyFrom(case.node)
        node.name = f"conv{i}"
        node.ClearField("overload")  # the stitched model's fallback function is not carried
        node.input[:] = [t if t in ("x", "r") else f"{t}{i}" for t in names]
        node.output[:] = [f"y{i}"]
        nodes.append(node)
    ins = [helper.make_tensor_value_info("x", case.dtype, list(x_shape))]
    if a["conv_residual"]:
        ins.append(helper.make_tensor_value_info("r", case.dtype, list(case.shapes[-1])))
    outs = [helper.make_tensor_value_info(f"y{i}", case.dtype, None) for i in range(copies)]
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.onnxstitch", 1)]
    return helper.make_model(helper.make_graph(nodes, "convs", ins, outs, inits), opset_imports=opsets, ir_version=10)


def extra_bytes(case: Case) -> int:
    """Bytes the epilogue reads beyond the plain call: its bias and residual."""
    itemsize = helper.tensor_dtype_to_np_dtype(case.dtype).itemsize
    return itemsize * sum(int(np.prod(s)) for s in case.shapes[2:])


def measure(case: Case, copies: int, config: bench.BenchConfig, device: str = "") -> dict:
    """The node against its plain twin, timed together."""
    rng = np.random.default_rng(1)
    np_dtype = helper.tensor_dtype_to_np_dtype(case.dtype)
    feeds = {"x": rng.standard_normal(case.shapes[0]).astype(np_dtype)}
    if case.attrs["conv_residual"]:
        feeds["r"] = rng.standard_normal(case.shapes[-1]).astype(np_dtype)
    providers = bench._provider_list(config)
    bounds = {}
    for label, c in (("epilogue", case), ("plain", plain(case))):
        sess = stitch_session(node_model(c, copies).SerializeToString(), providers=providers)
        given = {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}}
        bound = bench._Bound(sess, given, None)
        bound.run()
        bounds[label] = bench._Bound(sess, given, bound.outputs())
    times = bench._time(bounds, config)
    per = {label: float(np.median(t)) * 1e3 / copies for label, t in times.items()}  # µs
    reads = per["plain"] + bench.read_us(extra_bytes(case), device)
    return {"conv": case.describe(), "epilogue_us": per["epilogue"], "plain_us": per["plain"],
            "epilogue_over_plain": per["epilogue"] / per["plain"],
            "within_5pct": per["epilogue"] <= WITHIN * per["plain"],
            "plain_plus_reads_us": reads, "epilogue_over_plain_plus_reads": per["epilogue"] / reads,
            "within_5pct_with_reads": per["epilogue"] <= WITHIN * reads}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--shape", action="append", default=[], help="NAME=VALUE for a symbolic dim (repeat)")
    ap.add_argument("--out", type=Path, default=Path("bench_conv.json"))
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--copies", type=int, default=8, help="nodes per model (amortizes a run's host cost)")
    args = ap.parse_args()
    bench.require_gpu("bench_conv")
    dims = {k: int(v) for k, v in (s.split("=", 1) for s in args.shape)}
    res = onnxstitch.optimize(args.model, shapes={k: [v] for k, v in dims.items()}, epilogues=True)
    config = bench.BenchConfig(warmup=20, iters=args.iters, cuda_graph=True)
    device = bench.gpu_name()
    rows = []
    for case in cases(args.model, res.model, dims):
        if not any(case.attrs[k] for k in _EPILOGUE_ATTRS):
            continue  # no epilogue: nothing to compare
        row = measure(case, args.copies, config, device)
        rows.append(row)
        print(f"{row['epilogue_us']:8.2f} µs against {row['plain_us']:8.2f} µs plain "
              f"({row['epilogue_over_plain']:.3f}×{'' if row['within_5pct'] else ' > 1.05'}; "
              f"{row['epilogue_over_plain_plus_reads']:.3f}× with its reads)  {row['conv']}", flush=True)
    summary = {"convs": len(rows), "within_5pct": sum(r["within_5pct"] for r in rows),
               "worst_epilogue_over_plain": max((r["epilogue_over_plain"] for r in rows), default=float("nan")),
               "within_5pct_with_reads": sum(r["within_5pct_with_reads"] for r in rows)}
    print(f"{summary['within_5pct']} of {summary['convs']} conv epilogues within 5% of the plain cuDNN call "
          f"(worst {summary['worst_epilogue_over_plain']:.3f}×); {summary['within_5pct_with_reads']} with "
          f"their extra reads counted")
    args.out.write_text(json.dumps({"device": device, "driver": bench.driver_version(), "model": args.model,
                                    "shapes": dims, "copies": args.copies, "iters": args.iters, "cuda_graph": True,
                                    "rows": rows, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
