"""Hypothesis strategies for whole-pipeline fuzzing: random but valid ONNX models of the ops
onnxstitch fuses, mixed with ops it does not, plus seeded feeds for them.

A drawn model is a DAG grown one node at a time over a pool of values. Every value's shape is
a *sub-shape* of one model-wide "full" shape (a suffix of it with some dims replaced by 1), so
any two values broadcast (numpy rules, ranks 0–4: scalars, size-1 dims, a last-dim bias) and
every result is again a sub-shape. Dims may be symbolic ("batch", "seq") or zero.

What a draw covers: unary/binary/variadic elementwise ops from `onnxstitch.ops.TABLE` at the
dtypes both ONNX and ONNX Runtime's CPU EP accept (float32/float16/float64/int32/int64/bool;
same-type operands, Where's bool condition, Cast's `to`, comparisons → bool, Not/And/Or/Xor on
bool, Clip with optional scalar min/max, Mod's fmod, IsInf's flags, activation attributes);
leaves that are graph inputs, scalar constants (baked into kernels), tensor constants (stay
kernel inputs), Constant nodes, and initializers that are also graph inputs (overridable);
fan-out; several graph outputs, including consumed intermediate values and outputs declared
with unknown dims; other ops in between: MatMul with a square weight, a Transpose round trip
and Pow on integers split groups, while Softmax and ReduceSum (keepdims=1, last axis) are row
ops that onnxstitch stitches with their neighbours (codegen_rows).

Values are kept safe by tracking a bound on every value's magnitude (inputs are standard
normal floats and integers in [-20, 20), as `onnxstitch.inputs.random_array` draws them):
integer divisors are nonzero constants, integer results stay far from overflow, float16
values stay finite and small, float → int casts only see finite values in range. float32 and
float64 values may go "wild" (NaN/Inf through Log, Sqrt, Reciprocal, Div, fractional Pow),
on purpose: the NaN must survive stitching too. Each case records which outputs are tame.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from onnxstitch.inputs import random_array, random_feeds

from .tolerances import chain_tolerance

Dim = int | str
Shape = tuple[Dim, ...]

F32, F16, F64, I32, I64, BOOL = TP.FLOAT, TP.FLOAT16, TP.DOUBLE, TP.INT32, TP.INT64, TP.BOOL
FLOATS = (F32, F16, F64)
INTS = (I32, I64)
NUMERIC = FLOATS + INTS
ALL = NUMERIC + (BOOL,)

# Largest value a symbolic dim takes at run time (bounds of ReduceSum results use it).
MAX_RUNTIME_DIM = 5
SYMBOLS = ("batch", "seq")
# Magnitude caps: a tame value never exceeds these, so float16 stays finite (and sums of a
# few stay finite), integers never overflow, float32 stays where chain tolerances hold.
CAP = {F16: 1000.0, F32: 1e6, F64: 1e12, I32: 1e6, I64: 1e12, BOOL: 1.0}
# Bound of the random feeds: standard normal floats (|x| > 6 has probability 2e-9), ints in [-20, 20).
INPUT_MAG = {F16: 6.0, F32: 6.0, F64: 6.0, I32: 20.0, I64: 20.0, BOOL: 1.0}

# Dtypes at which ONNX Runtime's CPU EP (1.31) has a kernel, probed op by op at opsets 17/20/21
# (the original model must run there: it is the reference). Narrower than ops.TABLE in places:
# no int64 Relu, no bool Where, no float64 Erf/Elu/Selu/... .
_F = (F32, F16, F64)
_FH = (F32, F16)
ORT_CPU: dict[str, tuple[int, ...]] = {
    **{op: NUMERIC for op in ("Add", "Sub", "Mul", "Div", "Min", "Max", "Mod", "Neg", "Abs", "Clip", "Sign",
                              "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Where")},
    **{op: _F for op in ("Exp", "Log", "Sqrt", "Reciprocal", "Sigmoid", "Tanh", "Sin", "Cos", "Floor", "Ceil",
                         "Round", "IsNaN", "IsInf")},
    **{op: _FH for op in ("Erf", "Elu", "Selu", "HardSigmoid", "HardSwish", "Softplus", "Gelu", "LeakyRelu")},
    "Pow": _F,  # Pow on ints is drawn as an opaque op (onnxstitch does not fuse it)
    "Relu": (F32, F16, F64, I32),
    "Equal": ALL, "Identity": ALL, "Cast": ALL,
    "Not": (BOOL,), "And": (BOOL,), "Or": (BOOL,), "Xor": (BOOL,),
}


def ort_cpu_dtypes(op: str, opset: int) -> tuple[int, ...]:
    """Dtypes of `op` that ONNX Runtime's CPU EP runs at `opset` (the probed exceptions)."""
    if op == "Gelu" and opset < 20:
        return ()
    if op == "IsInf" and opset < 20:
        return (F32, F64)
    if op == "LeakyRelu" and opset < 20:
        return _F
    return ORT_CPU[op]


UNARY_FLOAT = ["Exp", "Log", "Sqrt", "Reciprocal", "Sigmoid", "Tanh", "Erf", "LeakyRelu", "Elu", "Selu",
               "HardSigmoid", "HardSwish", "Softplus", "Gelu", "Sin", "Cos", "Floor", "Ceil", "Round"]
UNARY_NUM = ["Neg", "Abs", "Relu", "Sign", "Identity"]
BINARY_ARITH = ["Add", "Sub", "Mul", "Div", "Mod", "Pow"]
COMPARE = ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]
BOOL_BINARY = ["And", "Or", "Xor"]
VARIADIC = ["Min", "Max"]
OPAQUE = ["MatMul", "Softmax", "ReduceSum", "Transpose", "IntPow"]
# Ops that make values unbounded or NaN (allowed wild on float32/float64, guarded otherwise).
_BOUNDED_1 = {"Sigmoid", "Tanh", "Erf", "Sin", "Cos", "HardSigmoid"}


@dataclass(frozen=True)
class Value:
    """A tensor of the graph being drawn, with what the strategy knows of its values."""

    name: str
    dtype: int
    shape: Shape
    mag: float  # bound on |x|; math.inf once the value may be huge, Inf or NaN ("wild")
    leaf: str = ""  # "input", "const", "override" (initializer + graph input), "" for node outputs
    const_only: bool = False  # computed from constants alone (no runtime input reaches it)

    @property
    def tame(self) -> bool:
        return self.mag <= CAP[self.dtype]


@dataclass(frozen=True)
class FuzzCase:
    """One drawn model with everything needed to optimize and run it reproducibly."""

    model: onnx.ModelProto
    dims: Mapping[str, int]  # run-time value of every symbolic dim
    plan_shapes: Mapping[str, list[int]]  # `shapes=` for onnxstitch.optimize (planning sizes)
    seed: int  # feeds' seed
    overrides: tuple[str, ...] = ()  # overridable initializers the feeds replace
    tame_outputs: frozenset[str] = frozenset()  # outputs whose values are bounded and NaN-free
    notes: tuple[str, ...] = field(default_factory=tuple)  # what the draw covered, for event()

    def feeds(self, seed: int | None = None) -> dict[str, np.ndarray]:
        """Seeded random feeds: every runtime input, plus the overridden initializers."""
        return case_feeds(self.model, self.dims, self.seed if seed is None else seed, self.overrides)

    @property
    def has_float16(self) -> bool:
        g = self.model.graph
        types = [v.type.tensor_type.elem_type for v in list(g.input) + list(g.output)]
        return F16 in types or any(i.data_type == F16 for i in g.initializer) or any(
            a.name == "to" and a.i == F16 for n in g.node for a in n.attribute)


def case_feeds(model: onnx.ModelProto, dims: Mapping[str, int], seed: int,
               overrides: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """`onnxstitch.inputs.random_feeds` for the runtime inputs, plus fresh values (same
    distribution) for the named initializers that are also graph inputs."""
    # np.asarray: random_array returns a numpy scalar, not an array, for a rank-0 bool input,
    # which ONNX Runtime refuses ("Unable to handle object of type numpy.bool").
    feeds = {k: np.asarray(v) for k, v in random_feeds(model, seed=seed, dim_values=dims).items()}
    rng = np.random.default_rng(seed + 7919)
    inits = {i.name: i for i in model.graph.initializer}
    for name in overrides:
        init = inits[name]
        feeds[name] = np.asarray(random_array(init.data_type, tuple(init.dims), rng))
    return feeds


def _np(dtype: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(dtype))


def _broadcast(*shapes: Shape) -> Shape:
    """Broadcast of sub-shapes of one full shape: per position, the non-1 dim if any."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for pos in range(rank):
        dims = {s[len(s) - rank + pos] for s in shapes if len(s) - rank + pos >= 0}
        big = dims - {1}
        assert len(big) <= 1, shapes
        out.append(big.pop() if big else 1)
    return tuple(out)


def _pow(m: float, e: float) -> float:
    """m ** e for bounds, Inf where Python's float overflows."""
    try:
        return m ** e
    except OverflowError:
        return math.inf


def _runtime_numel_bound(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= MAX_RUNTIME_DIM if isinstance(d, str) else d
    return n


class _Builder:
    """Grows one model. `draw` is hypothesis' draw function; everything random goes through it
    so examples shrink (small indices: recent values, the first op kinds)."""

    def __init__(self, draw: Callable, full: Shape, dtypes: tuple[int, ...], opset: int,
                 avoid: frozenset[str] = frozenset()) -> None:
        self.draw, self.full, self.dtypes, self.opset, self.avoid = draw, full, dtypes, opset, avoid
        self.pool: list[Value] = []
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.overrides: list[str] = []
        self.notes: set[str] = set()
        self.counter = 0

    # -- names and leaves ---------------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def sub_shape(self, static: bool) -> Shape:
        """A suffix of the full shape with some dims set to 1 (symbolic ones too when `static`:
        initializers have fixed shapes)."""
        k = self.draw(st.integers(0, len(self.full)), label="suffix")
        out = []
        for d in self.full[len(self.full) - k:]:
            keep = self.draw(st.booleans(), label="keep dim") if d != 1 else False
            out.append(1 if (not keep or (static and isinstance(d, str))) else d)
        return tuple(out)

    def constant_array(self, dtype: int, shape: Shape, nonzero: bool = False, lo: float = -2.0,
                       hi: float = 2.0) -> np.ndarray:
        """Constant data: a few drawn values tiled (keeps examples small), never zero when
        `nonzero` (divisors), integers for integer dtypes."""
        shape_i = tuple(int(d) for d in shape)
        if dtype == BOOL:
            vals = self.draw(st.lists(st.booleans(), min_size=1, max_size=3), label="bools")
        elif dtype in INTS:
            ints = [v for v in range(int(lo), int(hi) + 1) if v != 0 or not nonzero]
            vals = self.draw(st.lists(st.sampled_from(ints), min_size=1, max_size=3), label="ints")
        else:
            floats = [v for v in (0.5, -1.5, 2.0, 0.25, -0.75, 1.0, 0.0, -2.0, 1.25) if v != 0.0 or not nonzero]
            vals = self.draw(st.lists(st.sampled_from(floats), min_size=1, max_size=3), label="floats")
            vals = [min(max(v, lo), hi) if not nonzero else v for v in vals]
        n = int(np.prod(shape_i, dtype=np.int64))
        flat = np.resize(np.array(vals, dtype=_np(dtype)), n)
        return flat.reshape(shape_i)

    def leaf(self, dtype: int, kind: str | None = None, shape: Shape | None = None,
             nonzero: bool = False) -> Value:
        """A new graph input, constant (initializer or Constant node) or overridable initializer."""
        if kind is None:
            kind = self.draw(st.sampled_from(["input", "input", "const", "const", "constnode", "override"]),
                             label="leaf kind")
        if nonzero and kind in ("input", "override"):
            kind = "const"  # a runtime divisor could be zero: integer division would trap
        static = kind != "input"
        if shape is None:
            shape = self.sub_shape(static)
        if kind == "input":
            name = self.fresh("x")
            self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
            v = Value(name, dtype, shape, INPUT_MAG[dtype], "input")
            self.notes.add("graph input")
        else:
            arr = self.constant_array(dtype, shape, nonzero)
            name = self.fresh("c")
            tensor = numpy_helper.from_array(arr, name)
            mag = float(np.abs(arr.astype(np.float64)).max()) if arr.size else 0.0
            if kind == "constnode":
                self.nodes.append(helper.make_node("Constant", [], [name], value=tensor, name=self.fresh("const")))
                self.notes.add("Constant node")
            else:
                self.inits.append(tensor)
            if kind == "override":
                # Its value may be replaced at run time: bound it like a feed.
                self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
                self.overrides.append(name)
                mag = max(mag, INPUT_MAG[dtype])
                self.notes.add("initializer that is a graph input")
            elif arr.size == 1:
                self.notes.add("baked scalar constant")
            else:
                self.notes.add("tensor constant")
            v = Value(name, dtype, shape, mag, "override" if kind == "override" else "const",
                      const_only=kind != "override")
        if 0 in [d for d in shape if isinstance(d, int)]:
            self.notes.add("zero-size tensor")
        self.pool.append(v)
        return v

    def operand(self, dtype: int, nonzero: bool = False, first: bool = False) -> Value:
        """A value of `dtype`: a recent one from the pool (index 0 = newest: chains and fan-out)
        or a new leaf. `first`: the op's first operand, which reads a runtime input when
        avoiding "const-only" (ops computed from constants alone)."""
        runtime = first and "const-only" in self.avoid
        cands = [v for v in reversed(self.pool) if v.dtype == dtype and not nonzero and not (runtime and v.const_only)]
        if cands and self.draw(st.integers(0, 3), label="reuse?") > 0:
            i = self.draw(st.integers(0, len(cands) - 1), label="pick")
            return cands[i]
        if runtime:
            return self.leaf(dtype, self.draw(st.sampled_from(["input", "override"]), label="leaf kind"))
        return self.leaf(dtype, nonzero=nonzero)

    # -- emitting nodes -------------------------------------------------------------------------

    def emit(self, op: str, ins: Sequence[Value | None], dtype: int, shape: Shape, mag: float,
             **attrs: object) -> Value:
        """A node of `op` and its output value (None operands are omitted optional inputs)."""
        name = self.fresh("v")
        self.nodes.append(helper.make_node(op, ["" if v is None else v.name for v in ins], [name],
                                           name=self.fresh(op.lower() + "_"), **attrs))
        # A bound past what the dtype can hold means "may be Inf/NaN": wild from here on.
        if not mag <= CAP[dtype] and dtype in (F16, I32, I64):
            raise AssertionError(f"{op}: unsafe bound {mag} for {TP.DataType.Name(dtype)}")
        v = Value(name, dtype, shape, mag, const_only=all(x is None or x.const_only for x in ins))
        self.pool.append(v)
        return v

    def pick_dtype(self, allowed: Sequence[int]) -> int | None:
        ok = [d for d in self.dtypes if d in allowed]
        return self.draw(st.sampled_from(ok), label="dtype") if ok else None

    def step(self) -> None:
        """Add one op (or a small pattern) to the graph."""
        kind = self.draw(st.sampled_from(["unary", "binary", "unary_num", "compare", "variadic", "where", "clip",
                                          "cast", "bool", "opaque", "isnan", "unary", "binary", "opaque"]),
                         label="op kind")
        getattr(self, "_" + kind)()

    def scalar(self, dtype: int, value: float) -> Value:
        """A baked scalar constant of an exact value (guards and exponents are not drawn)."""
        name = self.fresh("c")
        self.inits.append(numpy_helper.from_array(np.array(value, dtype=_np(dtype)), name))
        v = Value(name, dtype, (), abs(value), "const", const_only=True)
        self.pool.append(v)
        return v

    def guarded(self, x: Value) -> tuple[Value, float]:
        """Abs(x) + c with c > 0 drawn: a strictly positive operand for Log/Sqrt/Reciprocal/
        fractional Pow, so half precision stays finite. Returns (value, c)."""
        c = self.draw(st.sampled_from([1.0, 0.5, 2.0]), label="guard offset")
        a = self.emit("Abs", [x], x.dtype, x.shape, x.mag)
        return self.emit("Add", [a, self.scalar(x.dtype, c)], x.dtype, x.shape, x.mag + c), c

    def _unary(self) -> None:
        op = self.draw(st.sampled_from(UNARY_FLOAT), label="unary")
        dt = self.pick_dtype(ort_cpu_dtypes(op, self.opset))
        if dt is None:
            return
        x = self.operand(dt, first=True)
        attrs: dict[str, object] = {}
        m = x.mag
        if op in ("Log", "Sqrt", "Reciprocal"):
            # float32/float64 sometimes unguarded on purpose: the NaN/Inf must survive stitching.
            if dt == F16 or self.draw(st.booleans(), label="guard"):
                x, c = self.guarded(x)
                self.notes.add("guarded " + op)
                if x.mag == math.inf:
                    mag = math.inf
                elif op == "Log":
                    mag = max(abs(math.log(c)), math.log(x.mag)) + 1
                elif op == "Sqrt":
                    mag = math.sqrt(x.mag) + 1
                else:
                    mag = 1.0 / c
            else:
                mag = math.inf  # may be NaN, -Inf or huge
        elif op == "Exp":
            mag = math.exp(m) if m < 700 else math.inf
        elif op in _BOUNDED_1:
            mag = 1.0
            if op == "HardSigmoid" and self.draw(st.booleans(), label="attrs"):
                attrs = {"alpha": 0.25, "beta": 0.4}
        elif op == "LeakyRelu":
            if self.draw(st.booleans(), label="attrs"):
                attrs = {"alpha": 0.2}
            mag = m
        elif op == "Elu":
            if self.draw(st.booleans(), label="attrs"):
                attrs = {"alpha": 0.5}
            mag = m + 1
        elif op == "Selu":
            mag = 1.06 * m + 1.8
        elif op == "Gelu":
            if self.draw(st.booleans(), label="attrs"):
                attrs = {"approximate": "tanh"}
            mag = m + 1
        else:  # Floor, Ceil, Round, HardSwish, Softplus
            mag = m + 1
        if dt == F16 and not mag <= CAP[F16]:
            return  # would overflow half precision (guard nodes drawn so far stay: harmless)
        self.emit(op, [x], dt, x.shape, mag, **attrs)
        if not mag <= CAP[dt]:
            self.notes.add("wild value (NaN/Inf possible)")

    def _unary_num(self) -> None:
        op = self.draw(st.sampled_from(UNARY_NUM), label="unary_num")
        dt = self.pick_dtype(ort_cpu_dtypes(op, self.opset))
        if dt is None:
            return
        x = self.operand(dt, first=True)
        self.emit(op, [x], dt, x.shape, 1.0 if op == "Sign" else x.mag)

    def _binary(self) -> None:
        op = self.draw(st.sampled_from(BINARY_ARITH), label="binary")
        dt = self.pick_dtype(ort_cpu_dtypes(op, self.opset) if op != "Pow" else FLOATS)
        if dt is None:
            return
        a = self.operand(dt, first=True)
        attrs: dict[str, object] = {}
        if op in ("Div", "Mod") and (dt in INTS or dt == F16 or self.draw(st.booleans(), label="const divisor")):
            b = self.leaf(dt, "const", shape=self.sub_shape(True), nonzero=True)
            # Drawn nonzero constants are integers (>= 1 in magnitude) or floats >= 0.25.
            mag = (a.mag * (1.0 if dt in INTS else 4.0)) if op == "Div" else b.mag
            self.notes.add(f"{op} by a nonzero constant")
        elif op == "Pow":
            exp = self.draw(st.sampled_from([2.0, 3.0, 0.5, -1.0, 1.5]), label="exponent")
            mag = math.inf
            if exp in (0.5, 1.5, -1.0) and (dt == F16 or self.draw(st.booleans(), label="guard")):
                a, c = self.guarded(a)
                if a.mag != math.inf:
                    mag = _pow(a.mag, exp) if exp > 0 else 1.0 / c
            elif exp in (2.0, 3.0) and a.mag != math.inf:
                mag = _pow(a.mag, exp)
            b = self.scalar(dt, exp)
        else:
            b = self.operand(dt)
            if op == "Mul":
                mag = a.mag * b.mag
            elif op in ("Add", "Sub"):
                mag = a.mag + b.mag
            else:  # Div/Mod by a runtime float: may be Inf/NaN (0 divisors from Relu and friends)
                mag = math.inf
        if op == "Mod":
            int_fmod = "int-fmod" not in self.avoid
            attrs["fmod"] = 1 if dt in FLOATS else self.draw(st.integers(0, int(int_fmod)), label="fmod")
        if dt in (F16, I32, I64) and not mag <= CAP[dt]:
            return  # would overflow: skip (integers wrap, float16 becomes Inf)
        self.emit(op, [a, b], dt, _broadcast(a.shape, b.shape), mag, **attrs)

    def _compare(self) -> None:
        op = self.draw(st.sampled_from(COMPARE), label="compare")
        dt = self.pick_dtype(ort_cpu_dtypes(op, self.opset))
        if dt is None:
            return
        a, b = self.operand(dt, first=True), self.operand(dt)
        self.emit(op, [a, b], BOOL, _broadcast(a.shape, b.shape), 1.0)

    def _isnan(self) -> None:
        op = self.draw(st.sampled_from(["IsNaN", "IsInf"]), label="isnan")
        dt = self.pick_dtype(ort_cpu_dtypes(op, self.opset))
        if dt is None:
            return
        x = self.operand(dt, first=True)
        attrs: dict[str, object] = {}
        if op == "IsInf" and self.draw(st.booleans(), label="attrs"):
            attrs = {"detect_negative": self.draw(st.integers(0, 1)), "detect_positive": self.draw(st.integers(0, 1))}
        self.emit(op, [x], BOOL, x.shape, 1.0, **attrs)

    def _variadic(self) -> None:
        op = self.draw(st.sampled_from(VARIADIC), label="variadic")
        dt = self.pick_dtype(ort_cpu_dtypes(op, self.opset))
        if dt is None:
            return
        ins = [self.operand(dt, first=i == 0) for i in range(self.draw(st.integers(1, 3), label="arity"))]
        self.emit(op, ins, dt, _broadcast(*(v.shape for v in ins)), max(v.mag for v in ins))

    def _where(self) -> None:
        dt = self.pick_dtype(ort_cpu_dtypes("Where", self.opset))
        if dt is None:
            return
        c = self.operand(BOOL) if BOOL in self.dtypes else self.leaf(BOOL)
        a, b = self.operand(dt, first=True), self.operand(dt)
        self.emit("Where", [c, a, b], dt, _broadcast(c.shape, a.shape, b.shape), max(a.mag, b.mag))

    def _clip(self) -> None:
        dt = self.pick_dtype(ort_cpu_dtypes("Clip", self.opset))
        if dt is None:
            return
        x = self.operand(dt, first=True)
        form = self.draw(st.sampled_from(["lo", "hi", "both", "none"]), label="clip form")
        # min/max are scalars: baked constants, or runtime scalar inputs (then lo > hi happens).
        lo = self.leaf(dt, self.draw(st.sampled_from(["const", "input"])), shape=()) if form in ("lo", "both") else None
        hi = self.leaf(dt, self.draw(st.sampled_from(["const", "input"])), shape=()) if form in ("hi", "both") else None
        ins: list[Value | None] = [x, lo, hi]
        while ins and ins[-1] is None:
            ins.pop()
        # min(max(x, lo), hi) is within the largest of the three (lo > hi gives hi).
        mag = max([x.mag] + [v.mag for v in (lo, hi) if v is not None])
        self.notes.add(f"Clip {form}")
        self.emit("Clip", ins, dt, x.shape, mag)

    def _cast(self) -> None:
        src = self.pick_dtype(ALL)
        if src is None:
            return
        x = self.operand(src, first=True)
        to = self.draw(st.sampled_from([d for d in ALL if d != src] + [src]), label="to")
        if to in INTS + (F16,) and src in FLOATS and not x.tame:
            return  # NaN/out-of-range float → int is undefined behaviour; → float16 would be Inf
        if to == F16 and x.mag > CAP[F16]:
            return
        if to in INTS and x.mag > CAP[to]:
            return
        mag = 1.0 if to == BOOL else (x.mag + 1 if src in FLOATS and to in INTS else x.mag)
        if to not in self.dtypes:
            self.dtypes = self.dtypes + (to,)
        self.notes.add("Cast")
        self.emit("Cast", [x], to, x.shape, mag, to=to)

    def _bool(self) -> None:
        op = self.draw(st.sampled_from(["Not"] + BOOL_BINARY), label="bool op")
        a = self.operand(BOOL, first=True)
        ins = [a] if op == "Not" else [a, self.operand(BOOL)]
        self.emit(op, ins, BOOL, _broadcast(*(v.shape for v in ins)), 1.0)

    def _opaque(self) -> None:
        op = self.draw(st.sampled_from(OPAQUE), label="opaque")
        if op == "IntPow":
            dt = self.pick_dtype(INTS)
            if dt is None:
                return
            x = self.operand(dt, first=True)
            if _pow(x.mag, 2) > CAP[dt]:
                return
            e = self.scalar(dt, 2)
            self.emit("Pow", [x, e], dt, x.shape, _pow(x.mag, 2))
            self.notes.add("opaque Pow on ints")
            return
        dt = self.pick_dtype(FLOATS)
        if dt is None:
            return
        x = self.operand(dt, first=True)
        if not x.shape:
            return  # all of these need rank >= 1
        k = x.shape[-1]
        if op == "MatMul" and (not isinstance(k, int) or k == 0):
            op = "Softmax"  # a square weight needs a static, nonzero last dim
        if op == "MatMul":
            rng = np.random.default_rng(self.draw(st.integers(0, 2**16), label="weight seed"))
            w = (rng.standard_normal((k, k)) / math.sqrt(k)).astype(_np(dt))
            name = self.fresh("w")
            self.inits.append(numpy_helper.from_array(w, name))
            colsum = float(np.abs(w.astype(np.float64)).sum(axis=0).max())
            mag = x.mag * colsum
            if dt == F16 and mag > CAP[F16]:
                return
            self.emit("MatMul", [x, Value(name, dt, (k, k), 1.0, "const")], dt, x.shape, mag)
        elif op == "Softmax":
            self.emit("Softmax", [x], dt, x.shape, 1.0 if x.tame else math.inf, axis=-1)
        elif op == "ReduceSum":
            mag = x.mag * (MAX_RUNTIME_DIM if isinstance(k, str) else max(k, 1))
            if dt == F16 and mag > CAP[F16]:
                return
            axes = self.fresh("axes")
            self.inits.append(numpy_helper.from_array(np.array([-1], np.int64), axes))
            self.emit("ReduceSum", [x, Value(axes, I64, (1,), 1.0, "const")], dt, x.shape[:-1] + (1,), mag,
                      keepdims=1)
        else:  # Transpose, a fusible op or two in the permuted layout, Transpose back
            if len(x.shape) < 2:
                return
            perm = list(reversed(range(len(x.shape))))
            t = self.emit("Transpose", [x], dt, tuple(x.shape[p] for p in perm), x.mag, perm=perm)
            self.pool.pop()  # a permuted shape does not broadcast with the rest
            for _ in range(self.draw(st.integers(1, 2), label="inner ops")):
                inner = self.draw(st.sampled_from(["Neg", "Abs", "Relu", "Sigmoid", "Tanh"]), label="inner")
                t = self.emit(inner, [t], dt, t.shape, 1.0 if inner in _BOUNDED_1 else t.mag)
                self.pool.pop()
            self.emit("Transpose", [t], dt, x.shape, t.mag, perm=perm)
        self.notes.add("opaque " + op)


@st.composite
def full_shapes(draw: Callable) -> Shape:
    """The model-wide shape: rank 0–4, small static dims, symbolic dims, sometimes a 0."""
    rank = draw(st.integers(0, 4), label="rank")
    dims: list[Dim] = []
    for _ in range(rank):
        d = draw(st.sampled_from([3, 1, 4, 2, 5, 7, 8, 16, "batch", "seq", 0]), label="dim")
        if isinstance(d, str) and d in dims:
            d = 3
        dims.append(d)
    while _runtime_numel_bound(tuple(dims)) > 4096:
        dims[dims.index(max(d for d in dims if isinstance(d, int)))] = 2
    return tuple(dims)


@st.composite
def cases(draw: Callable, max_steps: int = 10, avoid: frozenset[str] | set[str] = frozenset()) -> FuzzCase:
    """A FuzzCase: a valid model (checker-clean with full_check) that ORT's CPU EP runs, the
    run-time and planning values of its symbolic dims, and a feeds seed.

    `avoid` shapes the draws around known onnxstitch bugs, to look for the next ones behind
    them (the CI test draws everything): "const-only" (no op whose inputs are all constants,
    so no fused group without runtime inputs), "int-fmod" (integer Mod only with fmod=0)."""
    full = draw(full_shapes())
    opset = draw(st.sampled_from([20, 17, 21]), label="opset")
    ir_version = 10 if opset >= 20 else draw(st.sampled_from([8, 10]), label="ir")
    main = draw(st.sampled_from([F32, F16, F64]), label="float dtype")
    extra = draw(st.sets(st.sampled_from([I32, I64, BOOL]), max_size=3), label="other dtypes")
    dtypes = (main,) + tuple(sorted(extra))
    b = _Builder(draw, full, dtypes, opset, frozenset(avoid))
    b.leaf(main, "input", shape=full)  # one input with the full shape: groups iterate over it
    for _ in range(draw(st.integers(1, max_steps), label="steps")):
        b.step()
    produced = [v for v in b.pool if not v.leaf]
    if not produced:
        x = b.pool[0]
        produced = [b.emit("Relu", [x], x.dtype, x.shape, x.mag)]
    used = {t for n in b.nodes for t in n.input}
    outs = [v for v in produced if v.name not in used]
    # Some consumed intermediate values are graph outputs too (fan-out to outside a group).
    outs += [v for v in produced if v.name in used and draw(st.integers(0, 4), label="extra output") == 0]
    if len(outs) < len(produced) and draw(st.booleans(), label="more outputs"):
        outs = list(dict.fromkeys(outs + [draw(st.sampled_from(produced))]))
    outputs = []
    for v in outs:
        shaped = draw(st.integers(0, 5), label="output shape declared") > 0
        # An undeclared output shape (unknown dims) is legal: inference must fill it in.
        outputs.append(helper.make_tensor_value_info(v.name, v.dtype, list(v.shape) if shaped else [None] * len(v.shape)))
        if not shaped:
            b.notes.add("output with unknown dims")
    if any(v.name in used for v in outs):
        b.notes.add("consumed value is a graph output")
    if len(outs) > 1:
        b.notes.add("several outputs")
    used_all = used | {v.name for v in outs}
    dropped = {t.name for t in b.inits} - used_all  # constants only abandoned draws read
    inits = [t for t in b.inits if t.name not in dropped]
    input_names = {t.name for t in inits}
    inputs = [i for i in b.inputs if i.name not in dropped]
    graph = helper.make_graph(b.nodes, "fuzz", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    onnx.checker.check_model(model, full_check=True)  # a strategy bug, not onnxstitch's, if it fails
    symbols = sorted({d for d in full if isinstance(d, str)})
    dims = {s: draw(st.sampled_from([3, 1, 2, 5, 0]), label=f"runtime {s}") for s in symbols}
    plan = {s: [draw(st.sampled_from([64, 1, 4096]), label=f"plan {s}")] for s in symbols}
    if any(isinstance(d, str) for d in full):
        b.notes.add("symbolic dims")
    if 0 in full or 0 in dims.values():
        b.notes.add("zero-size dims")
    overrides = tuple(n for n in b.overrides if n in input_names and draw(st.booleans(), label="override?"))
    tame = frozenset(v.name for v in outs if v.tame)
    return FuzzCase(model, dims, plan, draw(st.integers(0, 2**31 - 1), label="feed seed"), overrides, tame,
                    tuple(sorted(b.notes)))


def graphs(max_steps: int = 10) -> st.SearchStrategy[onnx.ModelProto]:
    """Just the models of `cases()`."""
    return cases(max_steps).map(lambda c: c.model)


KNOWN_BUGS = ("const-only", "int-fmod")


# ---------------------------------------------------------------------------------------------
# Checking a stitched model against its original (shared by tests/test_fuzz.py and
# scripts/fuzz_report.py).

FUSED_DOMAIN, FUSED_OP = "com.onnxstitch", "FusedKernel"


def fused_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The FusedKernel nodes of a stitched model's main graph."""
    return [n for n in model.graph.node if n.domain == FUSED_DOMAIN and n.op_type == FUSED_OP]


def simplified(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` after the exact rewrites of optimize's simplify stage (simplify.py): the nodes a
    stitched model is made of, for `structural_problems`."""
    from onnxstitch import load, shapes, simplify

    m = load.constants_to_initializers(model)
    return simplify.simplify(m, shapes.infer(m)[1]).model


def structural_problems(original: onnx.ModelProto, stitched: onnx.ModelProto,
                        rewritten: onnx.ModelProto | None = None) -> list[str]:
    """What is wrong with the stitched model's structure (empty when nothing); `rewritten`:
    the original after exact rewrites (`simplified`), whose nodes the stitched model must hold
    where it fuses anything (else the original's):

    - graph inputs and outputs keep their names, order and types;
    - every FusedKernel node has its function (domain, name, overload), with the node's arity,
      and every function is used by exactly one node;
    - every original node (Constant nodes aside: they may become initializers, or constants
      inside a function body) is either still in the graph, verbatim, or in exactly one used
      function body, verbatim, and there is no other node;
    - initializers that are graph inputs stay (they are runtime inputs a user may feed).
    """
    problems: list[str] = []
    og, sg = original.graph, stitched.graph

    def sig(vis: Sequence[onnx.ValueInfoProto]) -> list[tuple[str, bytes]]:
        return [(v.name, v.type.SerializeToString(deterministic=True)) for v in vis]

    if sig(og.input) != sig(sg.input):
        problems.append(f"graph inputs changed: {[v.name for v in og.input]} -> {[v.name for v in sg.input]}")
    if sig(og.output) != sig(sg.output):
        problems.append(f"graph outputs changed: {[v.name for v in og.output]} -> {[v.name for v in sg.output]}")
    funcs = {(f.domain, f.name, f.overload): f for f in stitched.functions}
    used: dict[tuple[str, str, str], int] = {}
    for n in fused_nodes(stitched):
        key = (n.domain, n.op_type, n.overload)
        f = funcs.get(key)
        if f is None:
            problems.append(f"fused node {n.name}: no function for overload {n.overload!r}")
            continue
        used[key] = used.get(key, 0) + 1
        if len(f.input) != len(n.input) or len(f.output) != len(n.output):
            problems.append(f"fused node {n.name}: {len(n.input)}→{len(n.output)} but its function is "
                            f"{len(f.input)}→{len(f.output)}")
    for key in funcs:
        if used.get(key, 0) != 1:
            problems.append(f"function {key} is used by {used.get(key, 0)} nodes, not 1")

    def key_of(n: onnx.NodeProto) -> bytes:
        return n.SerializeToString(deterministic=True)

    remaining: dict[bytes, int] = {}
    for n in sg.node:
        # Constant nodes may stay nodes (an unchanged model goes out as it came) or become
        # initializers: they are not counted on either side.
        if not (n.domain == FUSED_DOMAIN and n.op_type == FUSED_OP) and n.op_type != "Constant":
            remaining[key_of(n)] = remaining.get(key_of(n), 0) + 1
    for key, f in funcs.items():
        if key in used:
            for n in f.node:
                # (nodes a scheme puts in the function, source.HELPER_PREFIX: a weight transposed back)
                if n.op_type != "Constant" and not n.name.startswith("onnxstitch~"):
                    remaining[key_of(n)] = remaining.get(key_of(n), 0) + 1
    # (a model nothing fuses goes out as it came in, not in its rewritten form)
    base = rewritten if rewritten is not None and any(True for _ in fused_nodes(stitched)) else original
    for n in base.graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            continue
        k = key_of(n)
        if remaining.get(k, 0) == 0:
            problems.append(f"original node {n.name} ({n.op_type}) is neither in the graph nor in a fused function")
        else:
            remaining[k] -= 1
    extra = sum(remaining.values())
    if extra:
        problems.append(f"{extra} node(s) in the stitched model that the original does not have")
    input_names = {v.name for v in og.input}
    kept = {t.name for t in sg.initializer}
    for t in og.initializer:
        if t.name in input_names and t.name not in kept:
            problems.append(f"initializer {t.name} (a graph input) was dropped")
    return problems


def run_cpu(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs on ONNX Runtime's CPU EP (a stitched model runs its fallback functions there).
    Graph optimizations off: the comparison is of the models, not of ORT's rewrites of them;
    one thread: deterministic reductions and less overhead on small models."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, dict(feeds))


def exact_mismatch(actual: np.ndarray, expected: np.ndarray) -> str | None:
    """None when the two arrays are identical: same shape and dtype, NaN where the other has
    NaN, every other element bit for bit (so -0.0 differs from 0.0); else what differs."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return f"shape {actual.shape} != {expected.shape}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != {expected.dtype}"
    if actual.dtype.kind == "f":
        nan_a, nan_e = np.isnan(actual), np.isnan(expected)
        if (nan_a != nan_e).any():
            return f"NaN at different positions ({int((nan_a != nan_e).sum())} elements)"
        uint = np.dtype(f"u{actual.dtype.itemsize}")
        diff = (actual.view(uint) != expected.view(uint)) & ~nan_a
    else:
        diff = actual != expected
    if diff.any():
        i = tuple(int(x) for x in np.argwhere(diff)[0])
        return f"{int(diff.sum())} of {diff.size} elements differ, first at {i}: {actual[i]!r} != {expected[i]!r}"
    return None


def float32_reference(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every float16 in float32: inputs, outputs, value_info, initializers,
    Constant node values and Cast's `to` — the reference for half-precision kernels, which
    compute in float32 (the tests' as_float32 covers the first four only)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type == F16:
            vi.type.tensor_type.elem_type = F32
    for init in g.initializer:
        if init.data_type == F16:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name))
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i == F16:
                a.i = F32
            if n.op_type == "Constant" and a.name == "value" and a.t.data_type == F16:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float32), a.t.name))
    return m


def float32_feeds(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feeds for `float32_reference`: float16 arrays widened exactly."""
    return {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in feeds.items()}


def tolerant_mismatch(actual: np.ndarray, expected: np.ndarray, half_model: bool) -> str | None:
    """None when a GPU result is close enough to the CPU reference, else what differs.

    - float32/float64: Inf and NaN at the same positions, the rest within
      models.tolerances.chain_tolerance (float32 ~1e-4; float64 1e-12);
    - float16, and every float output of a model with float16 math (`half_model`; reference:
      the float32 model, which never rounds to half): ‖a − b‖ ≤ 1e-2·‖b‖ over finite values;
    - integers and bools: exact, except in models with float16 math (`half_model`), where a
      value computed in float32 inside a kernel may round across a threshold that the float32
      reference does not: at most 1% of the elements (and at least one) may differ.
    """
    a, b = np.asarray(actual), np.asarray(expected)
    if a.shape != b.shape:
        return f"shape {a.shape} != {b.shape}"
    if a.dtype.kind == "f":
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        if a.dtype == np.float16 or half_model:
            if (np.isnan(a64) != np.isnan(b64)).any() or (np.isinf(a64) != np.isinf(b64)).any():
                return "NaN/Inf at different positions"
            fin = np.isfinite(b64)
            err, ref = np.linalg.norm(a64[fin] - b64[fin]), np.linalg.norm(b64[fin])
            return None if err <= 1e-2 * ref or err == 0 else f"relative norm error {err / max(ref, 1e-300):.3g} > 1e-2"
        if a.dtype != b.dtype:
            return f"dtype {a.dtype} != {b.dtype}"
        for what, fn in (("NaN", np.isnan), ("Inf", np.isposinf), ("-Inf", np.isneginf)):
            if (fn(a64) != fn(b64)).any():
                return f"{what} at different positions ({int((fn(a64) != fn(b64)).sum())} elements)"
        fin = np.isfinite(b64)
        rtol, atol = chain_tolerance(a.dtype)
        bad = ~np.isclose(a64[fin], b64[fin], rtol=rtol, atol=atol)
        if bad.any():
            i = int(np.argmax(bad))
            return (f"{int(bad.sum())} of {bad.size} elements beyond rtol={rtol} atol={atol}, "
                    f"e.g. {a64[fin][i]!r} vs {b64[fin][i]!r}")
        return None
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} != {b.dtype}"
    diff = int((a != b).sum())
    allowed = max(1, a.size // 100) if half_model else 0
    return None if diff <= allowed else f"{diff} of {a.size} elements differ (allowed {allowed})"
