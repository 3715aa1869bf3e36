"""Small models of the chains the gemm scheme matches (schemes/gemm/match.py), as exporters write
them, and their float64 references: MatMul or Gemm by a constant weight, its bias, a residual,
ReLU, GELU (the op, its tanh form written out two ways, the exact form)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto as TP, helper, numpy_helper

ACTIVATIONS = ("", "relu", "gelu_op", "gelu_tanh_pow", "gelu_tanh_cube", "gelu_erf", "gelu_erf_op")


@dataclass(frozen=True)
class Chain:
    """A product and what follows it. `lead`: A's dims before K (a symbol or a number each)."""

    lead: tuple = (2, 5)
    k: int = 16
    n: int = 24
    dtype: int = TP.FLOAT
    activation: str = ""  # one of ACTIVATIONS
    residual: str = ""  # "", "before" (act(AB + b + r)) or "after" (act(AB + b) + r)
    gemm: bool = False  # Gemm(A, Bᵀ, C) with transB=1 and its own bias
    bias_shape: tuple | None = None  # the bias's shape ([n] when None)
    biased: bool = True  # False: no bias (LLaMA's projections; an exporter's dropped zero bias)
    # The product on rows flattened by a Reshape and unflattened after, as HF's Conv1D (GPT-2) and
    # dynamo's decomposed Linear write it (simplify.py turns it back into one MatMul over A).
    flattened: bool = False

    @property
    def id(self) -> str:
        parts = ["gemm" if self.gemm else "matmul", "x".join(map(str, self.lead)), f"k{self.k}n{self.n}",
                 "f16" if self.dtype == TP.FLOAT16 else "f32", self.activation or "bias"]
        parts += ["nobias"] if not self.biased else []
        parts += ["flattened"] if self.flattened else []
        return "-".join(parts + ([f"residual-{self.residual}"] if self.residual else []))


def _const(name: str, value: float | np.ndarray, dtype: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, helper.tensor_dtype_to_np_dtype(dtype)), name)


def activation_nodes(kind: str, x: str, y: str, dtype: int) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes computing y = kind(x), and their scalar constants."""
    c = {"half": 0.5, "one": 1.0, "three": 3.0, "cubic": 0.044715, "root": math.sqrt(2 / math.pi),
         "sqrt2": math.sqrt(2.0)}
    consts = [_const(f"{y}_{k}", v, dtype) for k, v in c.items()]
    k = {name: f"{y}_{name}" for name in c}
    mk = helper.make_node
    if kind == "relu":
        return [mk("Relu", [x], [y])], []
    if kind == "gelu_op":
        return [mk("Gelu", [x], [y], approximate="tanh")], []
    if kind == "gelu_erf_op":
        return [mk("Gelu", [x], [y])], []
    if kind == "gelu_tanh_pow":  # transformers' NewGELU as torch.onnx writes it
        nodes = [mk("Pow", [x, k["three"]], [f"{y}_p"]), mk("Mul", [k["cubic"], f"{y}_p"], [f"{y}_c"]),
                 mk("Add", [x, f"{y}_c"], [f"{y}_s"]), mk("Mul", [k["root"], f"{y}_s"], [f"{y}_r"]),
                 mk("Tanh", [f"{y}_r"], [f"{y}_t"]), mk("Add", [k["one"], f"{y}_t"], [f"{y}_o"]),
                 mk("Mul", [k["half"], x], [f"{y}_h"]), mk("Mul", [f"{y}_h", f"{y}_o"], [y])]
    elif kind == "gelu_tanh_cube":  # x·x·x, the half applied last
        nodes = [mk("Mul", [x, x], [f"{y}_q"]), mk("Mul", [f"{y}_q", x], [f"{y}_p"]),
                 mk("Mul", [f"{y}_p", k["cubic"]], [f"{y}_c"]), mk("Add", [f"{y}_c", x], [f"{y}_s"]),
                 mk("Mul", [f"{y}_s", k["root"]], [f"{y}_r"]), mk("Tanh", [f"{y}_r"], [f"{y}_t"]),
                 mk("Add", [f"{y}_t", k["one"]], [f"{y}_o"]), mk("Mul", [x, f"{y}_o"], [f"{y}_m"]),
                 mk("Mul", [f"{y}_m", k["half"]], [y])]
    elif kind == "gelu_erf":  # BERT's exact GELU as exported
        nodes = [mk("Div", [x, k["sqrt2"]], [f"{y}_d"]), mk("Erf", [f"{y}_d"], [f"{y}_e"]),
                 mk("Add", [f"{y}_e", k["one"]], [f"{y}_o"]), mk("Mul", [x, f"{y}_o"], [f"{y}_m"]),
                 mk("Mul", [f"{y}_m", k["half"]], [y])]
    else:
        raise ValueError(kind)
    used = {t for n in nodes for t in n.input}
    return nodes, [t for t in consts if t.name in used]


def chain_model(c: Chain, seed: int = 0) -> onnx.ModelProto:
    """The chain as a model: inputs a (and r), weights w and b as initializers, output y."""
    rng = np.random.default_rng(seed)
    np_dtype = helper.tensor_dtype_to_np_dtype(c.dtype)
    w = rng.standard_normal((c.n, c.k) if c.gemm else (c.k, c.n)) / math.sqrt(c.k)
    b = rng.standard_normal(c.bias_shape or (c.n,)) * 0.5
    inits = [numpy_helper.from_array(w.astype(np_dtype), "w")]
    inits += [numpy_helper.from_array(b.astype(np_dtype), "b")] if c.biased else []
    mk = helper.make_node
    a, nodes = "a", []
    if c.flattened:  # Reshape(a → [-1, K]) → product → Reshape(→ a's leading dims + [N])
        inits.append(numpy_helper.from_array(np.array([-1, c.k], np.int64), "rows"))
        nodes.append(mk("Reshape", ["a", "rows"], ["a2"], name="flatten"))
        a = "a2"
    lin = "lin2" if c.flattened else "lin"
    if c.gemm:
        nodes += [mk("Gemm", [a, "w"] + (["b"] if c.biased else []), [lin], name="product", transB=1)]
    elif c.biased and not c.flattened:
        nodes += [mk("MatMul", [a, "w"], ["prod"], name="product"), mk("Add", ["prod", "b"], [lin], name="bias")]
    elif c.biased:  # flattened: the bias after the unflattening, as a Linear exported by TorchScript
        nodes += [mk("MatMul", [a, "w"], [lin], name="product")]
    else:
        nodes += [mk("MatMul", [a, "w"], [lin], name="product")]
    if c.flattened:
        # Reshape's 0 copies a dim by position: only from a flat A of the same rank; the lead
        # is written out through Shape where it is longer.
        inits.append(numpy_helper.from_array(np.array([c.n], np.int64), "n"))
        nodes += [mk("Shape", ["a"], ["ashape"], start=0, end=len(c.lead)),
                  mk("Concat", ["ashape", "n"], ["yshape"], axis=0),
                  mk("Reshape", [lin, "yshape"], ["lin3" if c.biased and not c.gemm else "lin"], name="unflatten")]
        if c.biased and not c.gemm:
            nodes.append(mk("Add", ["lin3", "b"], ["lin"], name="bias"))
    x = "lin"
    if c.residual == "before":
        nodes.append(mk("Add", [x, "r"], ["res"], name="residual"))
        x = "res"
    if c.activation:
        act, consts = activation_nodes(c.activation, x, "act", c.dtype)
        nodes += act
        inits += consts
        x = "act"
    if c.residual == "after":
        nodes.append(mk("Add", ["r", x], ["res"], name="residual"))
        x = "res"
    for n in nodes:  # the chain's last tensor is the graph's output
        n.output[:] = ["y" if t == x else t for t in n.output]
        n.input[:] = ["y" if t == x else t for t in n.input]
    shape = list(c.lead) + [c.k]
    ins = [helper.make_tensor_value_info("a", c.dtype, shape)]
    if c.residual:
        ins.append(helper.make_tensor_value_info("r", c.dtype, list(c.lead) + [c.n]))
    g = helper.make_graph(nodes, "chain", ins, [helper.make_tensor_value_info("y", c.dtype, list(c.lead) + [c.n])],
                          inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    onnx.checker.check_model(model)
    return model


def feeds(c: Chain, lead: tuple[int, ...], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random inputs at `lead` (numbers for A's dims before K)."""
    np_dtype = helper.tensor_dtype_to_np_dtype(c.dtype)
    out = {"a": rng.standard_normal(lead + (c.k,)).astype(np_dtype)}
    if c.residual:
        out["r"] = rng.standard_normal(lead + (c.n,)).astype(np_dtype)
    return out


def reference(c: Chain, model: onnx.ModelProto, given: dict[str, np.ndarray]) -> np.ndarray:
    """The chain in float64 from the model's weights (the inputs as given, not re-rounded)."""
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    a = given["a"].astype(np.float64)
    y = a @ (w["w"].T if c.gemm else w["w"]) + (w["b"] if c.biased else 0.0)
    if c.residual == "before":
        y = y + given["r"].astype(np.float64)
    if c.activation == "relu":
        y = np.maximum(y, 0)
    elif c.activation.startswith("gelu_tanh") or c.activation == "gelu_op":
        y = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    elif c.activation.startswith("gelu_erf"):
        y = 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))
    if c.residual == "after":
        y = y + given["r"].astype(np.float64)
    return y
