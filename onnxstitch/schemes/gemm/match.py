"""GEMM epilogues: a product by a constant weight and the elementwise work after it as one
cuBLASLt call.

Design note
-----------
Stock ONNX Runtime runs MatMul → Add(bias) → GELU as a GEMM writing its product and a kernel
reading it back (onnxstitch's elementwise group at best). cuBLASLt computes
D = act(α·op(A)·op(B) + β·C + bias) in one call: the bias, a ReLU or the tanh-form GELU and a
residual added through β·C cost the GEMM almost nothing, and one write and one read of the
product and one launch are saved.

Legal chains (`find`): a MatMul (A of rank 2 or 3, rows flattened) or a Gemm (alpha 1; its C a
1-D constant bias with beta 1, or absent) whose B is a constant 2-D weight, float32 or float16
throughout, followed by

- its bias: an Add of a tensor [N] (Gemm's own C counts): a constant as exporters write it (or an
  initializer also listed as an input: cuBLASLt reads it at every call);
- a residual: an Add of a tensor of the product's shape (cuBLASLt's C with β = 1);
- optionally an activation: Relu; Gelu(approximate="tanh"); or GELU's tanh form as exporters
  write it, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) in any arrangement of its nodes,
  recognised by evaluating the nodes between x and their one output (`_activation`, through
  schemes/written.py).

A chain needs at least one of them. Without a bias (LLaMA's projections; a zero bias an exporter
dropped) cuBLASLt runs the plain product, RELU or GELU epilogue, a residual still through C.

cuBLASLt's epilogue adds C before its activation, so a residual after the activation is
refused, and so is the exact GELU (erf): it stays a stitched kernel. Each product is proposed
with every legal prefix of its chain (bias; bias + residual; ... + activation), all sharing its
nodes: the plan takes at most one, or none.

Price (`group_of`): the roofline of the GEMM — its flops at the tensor rate of its dtype
against the bytes it moves at the device's bandwidth (cost.py's) — with the epilogue's extra
reads (bias, residual) and no second write, plus the measured slowdown of cuBLASLt's epilogue
kernels over its plain ones (EPILOGUE_OVERHEAD: up to +30% in float16 at BERT's shapes; unpriced,
it made BERT-base float16 8% slower with every epilogue it could take). The plan prices ORT's own
GEMM by its bytes only (cost.node_us: the same in every plan), so the group is priced as that
GEMM plus what the epilogue adds to the roofline: compute-bound GEMMs hide their epilogue,
memory-bound ones pay for the residual's read. The ILP weighs it against ORT's GEMM with the
elementwise or rows kernel over the same nodes.

Float32 chains read their weight K-major ([N, K]): a transposed copy made by the weights store
where it is read (`Weights.transposed`; the fused node's function transposes it back), as
cuBLASLt's TF32 kernels run faster so (`_kmajor`).

Generated GEMMs (generated.py, issue 38): where `find` is given a `Generating` whose targets are
all sm_90 (nvcc and CUTLASS here), float32 chains ending in the exact (erf) GELU, which cuBLASLt
cannot run, become CUTLASS kernels with the GELU inside (they run only on compute capability
9.0). Measured on an H200 (scripts/bench_generated_gemm.py): 0.86-0.99× of cuBLASLt's bias
epilogue plus the stitched GELU at BERT's and a LLaMA layer's shapes in float32; in float16 they
lost at two of BERT's four (1.08-1.16×), so they are not offered there. With `beside`
(--generated-gemms all), the chains cuBLASLt runs carry a CUTLASS kernel too, in either dtype
(float16 on the weight as stored): the runtime times both, as CUDA graphs, at a shape's first
call and keeps the faster, so neither can make a node slower. Not by default: on an H200 it
moved BERT-base 1.786× → 1.793× in float32 and 1.935× → 1.915× in float16, a LLaMA layer's
prefill 2.33× → 2.36× (bench/results/nvidia-h200/wave3l), for more nvcc builds. (Its stream-K
scheduler was measured too, for tiles too few for the multiprocessors, and was no faster than
the persistent one at any of the eight shapes: `generated.Config.stream_k`.)

Legality only here; taking a chain is the plan's choice, and an untaken one is reported with why
(`chosen`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto as TP, helper

from ...cost import CostModel, node_us
from ...graph import FusionGraph
from ...planned import Group, Plan
from .. import GEMM, written
from . import generated
from .spec import DTYPES, GemmSpec

# Dense tensor-core peaks of H100 SXM (NVIDIA's datasheet; H200 has the same SMs), TFLOP/s.
TF32_TFLOPS = 494.7
FP16_TFLOPS = 989.4
FP32_TFLOPS = 66.9  # float32 without TF32 (CUDA cores)
# ONNX Runtime's CUDA EP runs float32 GEMMs in TF32 unless a session passes use_tf32=0
# (CUDAExecutionProviderInfo::use_tf32 defaults to true); the epilogue GEMM does as it does.
TF32 = True
# What cuBLASLt's epilogue adds to the same GEMM without one, as a fraction of its time: the mean
# over BERT-base's four shapes (M 1024; K×N 768×768, 768×3072, 3072×768, 768×2304) measured by
# scripts/bench_gemm.py on the H200, each node with the fastest of the heuristic's first 16
# algorithms timed at its first call (bench/results/nvidia-h200/gemm/bench_gemm.json; negative
# means read as 0). cuBLASLt's epilogue kernels are slower ones in float16 (+2–30%); in float32
# only GELU and the residual cost anything.
EPILOGUE_OVERHEAD = {
    (TP.FLOAT, "bias"): 0.0, (TP.FLOAT, "relu"): 0.0, (TP.FLOAT, "gelu"): 0.19, (TP.FLOAT, "residual"): 0.03,
    (TP.FLOAT16, "bias"): 0.04, (TP.FLOAT16, "relu"): 0.07, (TP.FLOAT16, "gelu"): 0.13, (TP.FLOAT16, "residual"): 0.20,
    # The generated GEMM with the exact GELU inside against cuBLAS's plain product, the mean over
    # BERT-base's four shapes (scripts/cutlass_gemm.cu, bench/results/nvidia-h200/wave3b-cutlass).
    (TP.FLOAT, "gelu_erf"): 0.18, (TP.FLOAT16, "gelu_erf"): 0.69,
}
EXACT_GELU = "cuBLASLt's GELU epilogue is the tanh form"
# Elements a generated GEMM's rows (K) and columns (N) come in: 16 bytes, for its TMA loads.
GENERATED_ALIGN = {TP.FLOAT: 4, TP.FLOAT16: 8}


@dataclass(frozen=True)
class Generating:
    """What `find` may offer as generated GEMMs: with `exact` (every target sm_90) the
    exact-GELU chains as generated GEMMs alone; with `beside`, chains cuBLASLt runs with a
    CUTLASS kernel beside it (module docstring). `sm_count`: the GPU's multiprocessors, for the
    tile (generated.tile_n)."""

    exact: bool
    sm_count: int = 132
    beside: bool = False


@dataclass(frozen=True)
class Match:
    """One product and the epilogue cuBLASLt runs after it."""

    nodes: tuple[int, ...]  # the product, its Adds, the activation's nodes (topological)
    a: str  # [.., M, K] ([K, M] when trans_a)
    b: str  # the constant weight
    bias: str | None
    residual: str | None
    output: str
    activation: str  # "", "relu", "gelu" (tanh form) or "gelu_erf" (generated only)
    dtype: int
    k: int
    n: int
    trans_a: bool = False
    trans_b: bool = False
    product: str = ""  # the MatMul/Gemm's name, for reports
    # The generated GEMM the node carries too (or alone, for the exact GELU), and the weight as
    # it reads it then: [N, K], a transposed copy (None where B is stored so already).
    generated: generated.Config | None = None
    kmajor: Any = None  # onnx.TensorProto

    @property
    def weight(self) -> str:
        """The weight the node reads."""
        return self.kmajor.name if self.kmajor is not None else self.b

    @property
    def inputs(self) -> tuple[str, ...]:
        """The group's inputs, the graph's tensors: A, B, [the bias], [R]."""
        return (self.a, self.b) + ((self.bias,) if self.bias else ()) + ((self.residual,) if self.residual else ())

    @property
    def node_inputs(self) -> tuple[str, ...]:
        """The node's inputs (docs/abi.md): `inputs` with the weight as the node reads it."""
        return (self.a, self.weight) + self.inputs[2:]

    @property
    def spec(self) -> GemmSpec:
        epilogue = ({"": "bias", "relu": "relu_bias", "gelu": "gelu_bias", "gelu_erf": "gelu_erf_bias"} if self.bias else
                    {"": "none", "relu": "relu", "gelu": "gelu", "gelu_erf": "gelu_erf"})[self.activation]
        return GemmSpec(epilogue, self.residual is not None, self.dtype, TF32 and self.dtype == TP.FLOAT,
                        self.trans_a, self.trans_b or self.kmajor is not None, generated=self.generated)

    def describe(self) -> str:
        """One line for reports."""
        parts = [f"+ bias '{self.bias}'"] if self.bias else []
        if self.residual:
            parts.append(f"+ '{self.residual}'")
        if self.activation:
            parts.append({"relu": "→ ReLU", "gelu": "→ GELU (tanh)", "gelu_erf": "→ GELU (exact)"}[self.activation])
        dtype = TP.DataType.Name(self.dtype).lower()
        how = f", generated ({self.generated.name})" if self.generated else ""
        return (f"GEMM epilogue at '{self.product}': '{self.a}' · '{self.b}' [K {self.k}, N {self.n}] "
                f"{' '.join(parts)} → '{self.output}', {dtype}{' (TF32)' if self.spec.tf32 else ''}{how}")


@dataclass(frozen=True)
class Found:
    """The chains cuBLASLt can run (every legal prefix of each), and the refusals with why."""

    matches: tuple[Match, ...] = ()
    refusals: tuple[str, ...] = ()


def _dtype_name(g: FusionGraph, t: str) -> str:
    info = g.tensors.get(t)
    return "of unknown type" if info is None else TP.DataType.Name(info.dtype).lower()


def library_operands(g: FusionGraph, operands: tuple[str, ...], weight: str) -> str | None:
    """Why a library call (cuBLASLt GEMM, cuDNN convolution) cannot take these `operands` — each
    float32 or float16, all of one type, `weight` a constant — or None."""
    for t in operands:
        info = g.tensors.get(t)
        if info is None or info.dtype not in DTYPES:
            return f"'{t}' is {_dtype_name(g, t)}: float32 or float16 only"
    if len({g.tensors[t].dtype for t in operands}) != 1:
        return "its operands' types differ"
    if weight not in g.constants:
        return f"its weight '{weight}' is not a constant"
    return None


def _same_shape(g: FusionGraph, x: str, y: str) -> bool:
    """Shapes known and equal dim by dim (the same number or the same symbol)."""
    sx, sy = g.shape(x), g.shape(y)
    return sx is not None and sy is not None and len(sx) == len(sy) and \
        all(a is not None and a == b for a, b in zip(sx, sy))


def _is_bias(g: FusionGraph, t: str, n: int, dtype: int) -> bool:
    """`t` is a bias [n] of the product's type. A constant as exporters write it, or an
    initializer the model also lists as an input (TorchScript exports of IR < 4): cuBLASLt reads
    the bias through its pointer at every call, so it need not be fixed."""
    info = g.tensors.get(t)
    return info is not None and g.shape(t) == (n,) and info.dtype == dtype


@dataclass(frozen=True)
class _Product:
    """A product node's operands as cuBLASLt takes them."""

    a: str
    b: str
    bias: str | None  # a Gemm's own C
    trans_a: bool
    trans_b: bool
    k: int
    n: int


@dataclass(frozen=True)
class _Activation:
    """An activation after the product (or its Adds): its kind, its nodes, its output."""

    kind: str  # "relu" or "gelu" (tanh form)
    nodes: tuple[int, ...]
    output: str


def _product(g: FusionGraph, i: int) -> _Product | str:
    """Product node `i`'s operands, or why it is no epilogue GEMM."""
    n = g.nodes[i]
    a, b = n.inputs[:2]
    out = n.outputs[0]
    why = library_operands(g, (a, b, out), b)
    if why:
        return why
    sa, sb = g.shape(a), g.shape(b)
    if sb is None or len(sb) != 2:
        return f"its weight '{b}' is not 2-D"
    trans_a = trans_b = False
    bias = None
    if n.op_type == "Gemm":
        trans_a, trans_b = bool(n.attrs.get("transA", 0)), bool(n.attrs.get("transB", 0))
        if float(n.attrs.get("alpha", 1.0)) != 1.0:
            return "Gemm's alpha is not 1"
        c = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
        if c is not None:
            nn = sb[0] if trans_b else sb[1]
            if float(n.attrs.get("beta", 1.0)) != 1.0 or not isinstance(nn, int) or \
                    not _is_bias(g, c, nn, g.tensors[out].dtype):
                return f"Gemm's C '{c}' is not a bias [N] added with beta 1"
            bias = c
    if sa is None or not 2 <= len(sa) <= 3 or (trans_a and len(sa) != 2):
        return f"A '{a}' of shape {None if sa is None else list(sa)}: rank 2 or 3 (rows flattened)"
    k, kb = (sa[0] if trans_a else sa[-1]), (sb[1] if trans_b else sb[0])
    n_dim = sb[0] if trans_b else sb[1]
    if not isinstance(k, int) or k != kb or not isinstance(n_dim, int):
        return f"A {list(sa)} and B {list(sb)}: K and N must be fixed and agree"
    return _Product(a, b, bias, trans_a, trans_b, k, n_dim)


def residual_add(g: FusionGraph, t: str) -> tuple[int, str] | None:
    """(the Add, the other operand) when `t`'s one reader adds a runtime tensor of its shape."""
    at = g.only_reader(t)
    if at is None or g.nodes[at].op_type != "Add":
        return None
    x, y = g.nodes[at].inputs[:2]
    other = y if x == t else x
    if other in g.constants or other == t or not _same_shape(g, other, t) or \
            g.tensors[other].dtype != g.tensors[t].dtype or not _same_shape(g, g.nodes[at].outputs[0], t):
        return None
    return at, other


def _activation(g: FusionGraph, t: str, exact: bool = False) -> _Activation | str | None:
    """The activation applied to `t`, why it cannot be the epilogue's (the exact GELU, unless
    `exact`: then "gelu_erf", for a generated GEMM), or None when `t` is not read by one."""
    readers = g.consumers.get(t, ())
    if not readers or t in g.graph_outputs:
        return None
    n = g.nodes[readers[0]]
    at = n.index
    if len(readers) == 1 and n.op_type == "Relu" and n.domain in ("", "ai.onnx"):
        return _Activation("relu", (at,), n.outputs[0])
    if len(readers) == 1 and n.op_type == "Gelu" and n.domain in ("", "ai.onnx"):
        if n.attrs.get("approximate", "none") in ("tanh", b"tanh"):
            return _Activation("gelu", (at,), n.outputs[0])
        if exact:
            return _Activation("gelu_erf", (at,), n.outputs[0])
        return f"the exact GELU '{n.name or n.outputs[0]}' stays a stitched kernel: {EXACT_GELU}"
    for nodes, y in reversed(written.regions(g, t)):
        form = written.identify(g, t, nodes, y, frozenset({"gelu_tanh", "gelu"}))
        if form is not None and form[0] == "gelu_tanh":
            return _Activation("gelu", tuple(nodes), y)
        if form is not None and exact:
            return _Activation("gelu_erf", tuple(nodes), y)
        if form is not None:
            return f"the exact (erf) GELU into '{y}' stays a stitched kernel: {EXACT_GELU}"
    return None


def _chain(g: FusionGraph, i: int, exact: bool = False) -> tuple[list[Match], list[str]]:
    """Every legal epilogue chain of product `i` (its prefixes) and why it stops where it does;
    with `exact`, chains ending in the exact GELU too (activation "gelu_erf": generated only)."""
    n = g.nodes[i]
    name = f"GEMM epilogue at '{n.name or n.outputs[0]}'"
    got = _product(g, i)
    if isinstance(got, str):
        return [], [f"{name}: {got}"]
    bias = got.bias  # a Gemm's own C, else found among the Adds below
    dtype = g.tensors[n.outputs[0]].dtype
    t, nodes, residual = n.outputs[0], [i], None
    found: list[Match] = []
    why: list[str] = []

    def take(activation: str = "", out: str | None = None) -> None:
        found.append(Match(tuple(sorted(nodes)), got.a, got.b, bias, residual, out or t, activation, dtype, got.k,
                           got.n, got.trans_a, got.trans_b, n.name or n.outputs[0]))

    # The bias and the residual, in either order.
    for _ in range(2):
        at = g.only_reader(t)
        if at is None or g.nodes[at].op_type != "Add":
            break
        x, y = g.nodes[at].inputs[:2]
        other = y if x == t else x
        if bias is None and _is_bias(g, other, got.n, dtype):
            bias = other
        elif residual is None and residual_add(g, t) is not None:
            residual = other
        else:
            break
        nodes.append(at)
        t = g.nodes[at].outputs[0]
        take()
    act = _activation(g, t, exact)
    if isinstance(act, str):
        why.append(f"{name}: {act}")
    elif act is not None:
        nodes.extend(act.nodes)
        take(act.kind, act.output)
        if residual_add(g, act.output) is not None:
            why.append(f"{name}: the Add after its activation stays apart (cuBLASLt adds C before the activation)")
    if not found and not why:  # nothing after the product (or after a Gemm's own bias)
        readers = [g.nodes[c].op_type for c in g.consumers.get(t, ())]
        what = "the product is a graph output" if t in g.graph_outputs else \
            f"it is read by {len(readers)} nodes: {', '.join(sorted(readers))}" if len(readers) > 1 else \
            f"read by {readers[0] if readers else 'no node'}"
        after = "its own bias" if bias is not None else "it"
        why.append(f"{name}: no bias, residual or activation after {after} for an epilogue ({what})")
    return found, why


def _rows(g: FusionGraph, m: Match) -> int:
    """M: the product's rows at the planning sizes."""
    return g.tensor_bytes(m.output) // (np.dtype(helper.tensor_dtype_to_np_dtype(m.dtype)).itemsize * m.n)


def _generated(g: FusionGraph, m: Match, weights: Any, gen: Generating, kmajor: dict[str, Any]) -> Match | str:
    """The chain `m` as a node that carries a generated GEMM (a float32 one's weight K-major, a
    half one's as stored), or why it cannot."""
    align = GENERATED_ALIGN[m.dtype]
    if m.trans_a or len(g.shape(m.a) or ()) not in (2, 3):
        return "a generated GEMM reads A as [.., M, K] rows"
    if m.k % align or m.n % align:
        return f"K {m.k} and N {m.n} must be multiples of {align} for a generated GEMM"
    half = m.dtype == TP.FLOAT16
    if half and m.trans_b:
        return "a half generated GEMM reads its weight as stored, [K, N]"
    m = _kmajor(g, m, weights, kmajor)
    if not half and not m.trans_b and m.kmajor is None:
        return "no weights store to transpose its weight in"
    config = generated.Config(m.dtype, m.activation, m.bias is not None, m.residual is not None,
                              generated.tile_n(_rows(g, m), m.n, gen.sm_count), b_kmajor=not half)
    return dataclasses.replace(m, generated=config)


def _kmajor(g: FusionGraph, m: Match, weights: Any, kmajor: dict[str, Any]) -> Match:
    """A float32 chain `m` reading its weight K-major ([N, K], a copy the store transposes) where
    `weights` is given: cuBLASLt's TF32 kernels are faster so (TN), 2-18% at BERT's and a LLaMA
    layer's 16 shapes and epilogues (bench/results/nvidia-h200/wave3k: its `cublaslt` column against
    `off`), as Hopper's TF32 wgmma reads both operands K-major."""
    if weights is None or m.dtype != TP.FLOAT or m.trans_b or m.trans_a:
        return m
    if m.b not in kmajor:
        kmajor[m.b] = weights.transposed(g.constants[m.b], f"{m.b}~kmajor")
    return dataclasses.replace(m, kmajor=kmajor[m.b])


def find(g: FusionGraph, weights: Any = None, gen: Generating | None = None) -> Found:
    """Every MatMul/Gemm chain of `g` cuBLASLt can run with an epilogue, and the refusals; with
    `weights` (the store transposed weights are made in), float32 chains read their weight
    K-major (`_kmajor`). With `gen` (`gen.exact`: every target sm_90), exact-GELU chains too, as
    generated GEMMs, and (`gen.beside`) chains with a generated GEMM beside cuBLASLt (module
    docstring)."""
    matches: list[Match] = []
    refusals: list[str] = []
    kmajor: dict[str, Any] = {}  # one transposed copy per weight
    for n in g.nodes:
        if n.op_type not in ("MatMul", "Gemm") or n.domain not in ("", "ai.onnx"):
            continue
        got, why = _chain(g, n.index, exact=gen is not None and gen.exact)
        for m in got:
            if m.activation != "gelu_erf":
                beside = _generated(g, m, weights, gen, kmajor) if gen is not None and gen.beside else None
                # (where none can be built the chain is cuBLASLt's alone: nothing is refused)
                matches.append(beside if isinstance(beside, Match) else _kmajor(g, m, weights, kmajor))
                continue
            assert gen is not None  # (only asked for with it)
            if m.dtype != TP.FLOAT:
                refusals.append(f"GEMM epilogue at '{m.product}': the exact GELU stays a stitched kernel: "
                                "generated GEMMs lost to cuBLASLt and the GELU kernel in float16")
                continue
            made = _generated(g, m, weights, gen, kmajor)
            if isinstance(made, Match):
                matches.append(made)
            else:
                refusals.append(f"GEMM epilogue at '{m.product}': the exact GELU stays a stitched kernel: {made}")
        refusals += why
    return Found(tuple(matches), tuple(refusals))


def _tflops(dtype: int) -> float:
    if dtype == TP.FLOAT16:
        return FP16_TFLOPS
    return TF32_TFLOPS if TF32 else FP32_TFLOPS


def roofline_us(g: FusionGraph, cost: CostModel, m: Match, epilogue: bool = True) -> float:
    """The GEMM's roofline in µs (no launch): 2·M·K·N flops at the tensor rate of its dtype
    against A, B and Y (and with `epilogue` the bias and residual) at cost's bandwidth."""
    flops = 2.0 * _rows(g, m) * m.k * m.n
    moved = [m.a, m.b, m.output] + ([m.bias] + ([m.residual] if m.residual else []) if epilogue else [])
    nbytes = sum(g.tensor_bytes(t) for t in moved)
    return max(flops / (_tflops(m.dtype) * 1e6), nbytes / (cost.bandwidth_gbs * 1e3))


def overhead(m: Match) -> float:
    """The measured slowdown of chain `m`'s GEMM over the same call without epilogue, as a
    fraction (EPILOGUE_OVERHEAD: the costliest of its parts)."""
    parts = (["bias"] if m.bias else []) + ([m.activation] if m.activation else []) + \
        (["residual"] if m.residual else [])
    return max((EPILOGUE_OVERHEAD.get((m.dtype, p), 0.0) for p in parts), default=0.0)


def group_of(g: FusionGraph, cost: CostModel, name: str, m: Match) -> Group:
    """The plan's group for chain `m`: ORT's GEMM as the plan prices it, plus what the epilogue
    adds to the GEMM's roofline and the measured slowdown of cuBLASLt's epilogue kernels
    (`overhead`; module docstring)."""
    plain = roofline_us(g, cost, m, epilogue=False)
    extra = roofline_us(g, cost, m) - plain + overhead(m) * plain
    moved = sum(g.tensor_bytes(t) for t in dict.fromkeys(m.inputs + (m.output,)))
    return Group(name, m.nodes, m.inputs, (m.output,), None, moved, node_us(g, cost, m.nodes[0]) + max(extra, 0.0),
                 tuple(g.nodes[i].label for i in m.nodes), tf32=m.spec.tf32, scheme=GEMM, payload=m)


def chosen(found: Found, plan: Plan) -> Found:
    """`found` as the plan left it: the chains it runs through cuBLASLt, and for each product
    with none taken, why (among the refusals)."""
    taken = [grp.payload for grp in plan.groups if grp.scheme == GEMM]
    kept = tuple(m for m in found.matches if any(m is t for t in taken))
    done = {m.product for m in kept}
    longest: dict[str, Match] = {}
    for m in found.matches:
        if m.product not in done:
            longest[m.product] = m  # prefixes come shortest first
    passed = tuple(f"{m.describe()}: the plan found other kernels over these nodes cheaper" for m in longest.values())
    return Found(kept, found.refusals + passed)

