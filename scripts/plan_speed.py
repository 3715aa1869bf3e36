"""Planning-speed benchmark: enumerate + plan 1,000-node graphs, print JSON.

Two float32 [8192, 4096] graphs:
- "blocks": repeated blocks of a chain with fan-out (two branches that rejoin) and per-block
  broadcast constants ([4096] bias, scalar scale), so the maximal groups hit the kernel's
  input limit;
- "lanes": four chains that read each other, directly and through opaque Hardmax nodes
  (about one node in twelve), with broadcast constants: many candidates conflict, and the
  ILP has to break cycles.

    python3 scripts/plan_speed.py [--nodes 1000]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from onnxstitch import graph as fgraph  # noqa: E402
from onnxstitch import shapes  # noqa: E402
from onnxstitch.candidates import enumerate_candidates  # noqa: E402
from onnxstitch.plan import make_plan  # noqa: E402

ROWS, COLS = 8192, 4096
BLOCK = ("bias", "relu", "sigmoid", "rejoin", "scale")  # five nodes per block


def _block(k: int, x: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    """One block: x + bias_k → (relu, sigmoid) → add → * scale_k. Returns nodes, inits, output."""
    p = f"b{k}_"
    inits = [numpy_helper.from_array(np.zeros(COLS, np.float32), p + "bias"),
             numpy_helper.from_array(np.array(1.5, np.float32), p + "scale")]
    nodes = [helper.make_node("Add", [x, p + "bias"], [p + "t"]),
             helper.make_node("Relu", [p + "t"], [p + "r"]),
             helper.make_node("Sigmoid", [p + "t"], [p + "s"]),
             helper.make_node("Add", [p + "r", p + "s"], [p + "j"]),
             helper.make_node("Mul", [p + "j", p + "scale"], [p + "y"])]
    return nodes, inits, p + "y"


def _model(nodes, inits, outputs) -> onnx.ModelProto:
    vi = [helper.make_tensor_value_info(o, TensorProto.FLOAT, [ROWS, COLS]) for o in outputs]
    g = helper.make_graph(nodes, "plan_speed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, COLS])],
                          vi, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def build_lanes(num_nodes: int, seed: int = 0) -> onnx.ModelProto:
    """Four lanes of elementwise nodes reading each other's recent values, some through a
    Hardmax; a [4096] bias every few nodes; every lane's end is a graph output."""
    rnd = random.Random(seed)
    heads = ["x"] * 4
    seen: list[str] = ["x"]
    nodes: list[onnx.NodeProto] = []
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    while len(nodes) < num_nodes:
        k, out = rnd.randrange(4), f"t{len(nodes)}"
        roll = rnd.random()
        if roll < 0.3:
            nodes.append(helper.make_node(rnd.choice(["Relu", "Sigmoid", "Tanh"]), [heads[k]], [out]))
        elif roll < 0.45:
            bias = f"bias{len(inits)}"
            inits.append(numpy_helper.from_array(np.zeros(COLS, np.float32), bias))
            nodes.append(helper.make_node("Add", [heads[k], bias], [out]))
        elif roll < 0.55:
            nodes.append(helper.make_node("Mul", [heads[k], "half"], [out]))
        else:
            other = rnd.choice(seen[-12:])  # a recent value of any lane
            if roll < 0.63:
                soft = f"s{len(nodes)}"
                nodes.append(helper.make_node("Hardmax", [other], [soft]))
                other = soft
            nodes.append(helper.make_node(rnd.choice(["Add", "Mul", "Max"]), [heads[k], other], [out]))
        heads[k] = out
        seen.append(out)
    outputs = list(dict.fromkeys(h for h in heads if h != "x"))
    return _model(nodes, inits, outputs)


def build_blocks(num_nodes: int) -> onnx.ModelProto:
    """A DAG of `num_nodes` (rounded to whole blocks) elementwise nodes; every 40th block's
    output is also a graph output (fan-out to the graph boundary)."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    outputs = []
    x = "x"
    for k in range(num_nodes // len(BLOCK)):
        n, i, x = _block(k, x)
        nodes += n
        inits += i
        if k % 40 == 39:
            outputs.append(x)
    if x not in outputs:
        outputs.append(x)
    return _model(nodes, inits, outputs)


def measure(model: onnx.ModelProto) -> dict:
    """Times of building the FusionGraph, enumerating candidates and planning, with the plan's
    headline numbers."""
    t0 = time.perf_counter()
    inferred, tensors = shapes.infer(model)
    g = fgraph.build(inferred, tensors)
    t1 = time.perf_counter()
    cands = enumerate_candidates(g)
    t2 = time.perf_counter()
    plan = make_plan(g, candidates=cands)
    t3 = time.perf_counter()
    return {
        "nodes": len(g.nodes), "fusible": sum(n.fusible for n in g.nodes),
        "build_s": round(t1 - t0, 3), "enumerate_s": round(t2 - t1, 3),
        "plan_s": round(t3 - t2, 3), "solve_s": round(plan.solve_seconds, 3),
        "enumerate_plus_plan_s": round(t3 - t1, 3),
        "candidates": plan.num_candidates, "conflicts": plan.conflicts, "cuts": plan.cuts,
        "rounds": plan.rounds, "status": plan.status,
        "kernels": [plan.kernels_before, plan.kernels_after],
        "predicted_us": [round(plan.predicted_us_before, 1), round(plan.predicted_us_after, 1)],
        "bytes": [plan.bytes_before, plan.bytes_after], "rejections": len(plan.rejections),
    }


def main() -> None:
    """Time graph building, enumeration and planning; print the numbers as JSON."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=1000)
    args = ap.parse_args()
    print(json.dumps({"blocks": measure(build_blocks(args.nodes)),
                      "lanes": measure(build_lanes(args.nodes))}, indent=1))

if __name__ == "__main__":
    main()
