"""The operator table (the graph stage classifies ops by it): one place that says what each ONNX op is and how it prints.

Kinds form an ordered lattice (TVM's FuseOps): ELEMENTWISE < BROADCAST < INJECTIVE < REDUCE <
OPAQUE. ELEMENTWISE/BROADCAST ops map to a C expression printer over already-loaded operand
values, in the value's compute type (float32 for float16/bfloat16). REDUCE ops reduce a
run of consecutive axes of their input (the row, trailing or followed by others: a column;
keepdims either way) and are stitched with the
elementwise work around them (schemes/rows); each names its reducer in REDUCERS or its
expansion there. INJECTIVE ops here are the layout ops (LAYOUT): they join a group only as
a tail on one of its outputs, which the kernel then writes reshaped and transposed
(views.py). SLICE ops (Slice, Split) join only at a group's inputs: the kernel reads their
outputs as boxes of their input (slices.py). A CONCAT op (Concat) selects per element among
operands computed in windows of its output (concats.py). OPAQUE ops stay as ONNX Runtime runs them.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Callable, Mapping, Sequence

import numpy as np
from onnx import TensorProto as TP


class OpKind(IntEnum):
    ELEMENTWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCE = 3
    OPAQUE = 4
    SLICE = 5  # Slice/Split: read as boxes of their input by the kernel (slices.py); not in the lattice
    CONCAT = 6  # Concat: its operands computed in windows of its output (concats.py); not in the lattice


FLOATS = frozenset({TP.FLOAT, TP.FLOAT16, TP.BFLOAT16, TP.DOUBLE})
INTS = frozenset({TP.INT8, TP.INT16, TP.INT32, TP.INT64, TP.UINT8, TP.UINT16, TP.UINT32, TP.UINT64})
NUMERIC = FLOATS | INTS
ALL = NUMERIC | {TP.BOOL}

# onnx dtype -> (storage C type, compute C type)
CTYPES: dict[int, tuple[str, str]] = {
    TP.FLOAT: ("float", "float"),
    TP.FLOAT16: ("unsigned short", "float"),  # raw bits; converted with cvt in the prelude
    TP.BFLOAT16: ("unsigned short", "float"),
    TP.DOUBLE: ("double", "double"),
    TP.INT8: ("signed char", "int"),
    TP.INT16: ("short", "int"),
    TP.INT32: ("int", "int"),
    TP.INT64: ("long long", "long long"),
    TP.UINT8: ("unsigned char", "unsigned int"),
    TP.UINT16: ("unsigned short", "unsigned int"),
    TP.UINT32: ("unsigned int", "unsigned int"),
    TP.UINT64: ("unsigned long long", "unsigned long long"),
    TP.BOOL: ("bool", "bool"),
}


@dataclass(frozen=True)
class Arg:
    """An operand as the printer sees it: a C expression, its compute type and onnx dtype."""

    expr: str
    ctype: str
    dtype: int
    value: float | None = None  # a baked scalar's value (the printers may fold it)


def literal(value: float | int | bool, ctype: str) -> str:
    """An exact C literal of `value` in `ctype` (bit patterns for floats: NaN/Inf survive)."""
    if ctype == "bool":
        return "true" if value else "false"
    if ctype == "float":
        bits = struct.unpack("<I", struct.pack("<f", float(value)))[0]
        return f"__int_as_float(0x{bits:08x})"
    if ctype == "double":
        bits = struct.unpack("<Q", struct.pack("<d", float(value)))[0]
        return f"__longlong_as_double(0x{bits:016x}LL)"
    suffix = "ULL" if ctype.startswith("unsigned") else "LL"
    return f"(({ctype}){int(value)}{suffix})"


Printer = Callable[[Sequence[Arg], Mapping[str, object], str], str]


def _c(a: Arg, ctype: str) -> str:
    return a.expr if a.ctype == ctype else f"(({ctype})({a.expr}))"


def _bin(op: str) -> Printer:
    return lambda a, at, t: f"({_c(a[0], t)} {op} {_c(a[1], t)})"


def _fn(name: str) -> Printer:
    return lambda a, at, t: f"{name}({_c(a[0], t)})"


def _minmax(cmp: str) -> Printer:
    # numpy semantics: NaN propagates (fminf/fmaxf would drop it).
    def p(a: Sequence[Arg], at: Mapping[str, object], t: str) -> str:
        acc = _c(a[0], t)
        for b in a[1:]:
            x, y = acc, _c(b, t)
            acc = f"stitch_pick{cmp}({x}, {y})"
        return acc

    return p


def _div(a: Sequence[Arg], at: Mapping[str, object], t: str) -> str:
    if t in ("float", "double") and a[1].value is not None:
        # x / c as x * (1/c): a multiply instead of IEEE division's instruction sequence,
        # exact when c is a power of two and within one rounding of x / c otherwise (as ORT's
        # own BiasGelu multiplies by 1/√2). Only where 1/c is a normal number.
        inv = 1.0 / a[1].value if a[1].value else math.inf
        limit = np.finfo(np.float32 if t == "float" else np.float64)
        if math.isfinite(inv) and float(limit.tiny) <= abs(inv) <= float(limit.max):
            return f"({_c(a[0], t)} * {literal(inv, t)})"
    return f"stitch_div({_c(a[0], t)}, {_c(a[1], t)})"


def _mod(a: Sequence[Arg], at: Mapping[str, object], t: str) -> str:
    x, y = _c(a[0], t), _c(a[1], t)
    if t in ("float", "double"):
        return f"fmod({x}, {y})"
    # Integers: fmod=1 is C's truncating %, fmod=0 takes the divisor's sign like Python.
    return f"({x} % {y})" if at.get("fmod", 0) else f"stitch_pymod({x}, {y})"


def _lit(v: float, t: str) -> str:
    return literal(v, t)


def _attr_f(at: Mapping[str, object], name: str, default: float) -> float:
    return float(at.get(name, default))  # type: ignore[arg-type]


def _leaky(a, at, t):
    x = _c(a[0], t)
    return f"stitch_leaky({x}, {_lit(_attr_f(at, 'alpha', 0.01), t)})"


def _elu(a, at, t):
    return f"stitch_elu({_c(a[0], t)}, {_lit(_attr_f(at, 'alpha', 1.0), t)})"


def _selu(a, at, t):
    alpha = _attr_f(at, "alpha", 1.67326319217681884765625)
    gamma = _attr_f(at, "gamma", 1.05070102214813232421875)
    return f"stitch_selu({_c(a[0], t)}, {_lit(alpha, t)}, {_lit(gamma, t)})"


def _hsig(a, at, t):
    return f"stitch_hardsigmoid({_c(a[0], t)}, {_lit(_attr_f(at, 'alpha', 0.2), t)}, {_lit(_attr_f(at, 'beta', 0.5), t)})"


def _hswish(a, at, t):
    x = _c(a[0], t)
    return f"({x} * stitch_hardsigmoid({x}, {_lit(1.0 / 6.0, t)}, {_lit(0.5, t)}))"


def _gelu(a, at, t):
    approx = at.get("approximate", "none")
    approx = approx.decode() if isinstance(approx, bytes) else approx
    fn = "stitch_gelu_tanh" if approx == "tanh" else "stitch_gelu_erf"
    return f"{fn}({_c(a[0], t)})"


def _clip(a, at, t):
    x = _c(a[0], t)
    lo = _c(a[1], t) if len(a) > 1 and a[1].expr else (_lit(at["min"], t) if "min" in at else None)  # type: ignore[arg-type]
    hi = _c(a[2], t) if len(a) > 2 and a[2].expr else (_lit(at["max"], t) if "max" in at else None)  # type: ignore[arg-type]
    if lo is not None:
        x = f"stitch_clip_lo({x}, {lo})"
    if hi is not None:
        x = f"stitch_clip_hi({x}, {hi})"
    return x


def _where(a, at, t):
    return f"({_c(a[0], 'bool')} ? {_c(a[1], t)} : {_c(a[2], t)})"


def _cmp(op: str) -> Printer:
    def p(a, at, t):
        # Compare in the operands' own compute type, not the bool result type.
        ct = a[0].ctype
        return f"({_c(a[0], ct)} {op} {_c(a[1], ct)})"

    return p


def _cast(a, at, t):
    to = int(at["to"])  # type: ignore[arg-type]
    x = a[0]
    if to == TP.BOOL:
        return f"({x.expr} != 0)"
    if to == TP.FLOAT16 and x.dtype != TP.FLOAT16:
        return f"stitch_round_f16({_c(x, 'float')})"  # the value must carry float16's rounding
    if to == TP.BFLOAT16 and x.dtype != TP.BFLOAT16:
        return f"stitch_round_bf16({_c(x, 'float')})"
    if x.ctype in ("float", "double") and to in INTS:
        return f"stitch_f2i<{t}>({x.expr})"
    if x.dtype in (TP.FLOAT16, TP.BFLOAT16) and to in (TP.FLOAT, TP.DOUBLE):
        # The input is a half-precision tensor: widen the value it holds, not the float32
        # intermediate the kernel kept (ORT would have rounded it when it was written).
        return _c(ops_round(x), t)
    return _c(x, t)


def ops_round(x: Arg) -> Arg:
    """The half-precision value of a float32-computed half tensor."""
    fn = "stitch_round_f16" if x.dtype == TP.FLOAT16 else "stitch_round_bf16"
    return Arg(f"{fn}({x.expr})", "float", x.dtype)


def _isinf(a, at, t):
    neg, pos = int(at.get("detect_negative", 1)), int(at.get("detect_positive", 1))  # type: ignore[arg-type]
    x = a[0].expr
    inf = "__int_as_float(0x7f800000)" if a[0].ctype == "float" else "__longlong_as_double(0x7ff0000000000000LL)"
    terms = ([f"({x} == -{inf})"] if neg else []) + ([f"({x} == {inf})"] if pos else [])
    return "(" + " || ".join(terms) + ")" if terms else "false"


@dataclass(frozen=True)
class OpSpec:
    """What onnxstitch knows of one op: its kind, the dtypes its fused form supports, and the
    printer of its C expression (None: not fusible)."""

    kind: OpKind
    dtypes: frozenset[int]
    printer: Printer | None

    @property
    def fusible(self) -> bool:
        return self.printer is not None or self.kind in (OpKind.REDUCE, OpKind.INJECTIVE, OpKind.SLICE, OpKind.CONCAT)


def _ew(printer: Printer, dtypes: frozenset[int] = NUMERIC) -> OpSpec:
    return OpSpec(OpKind.ELEMENTWISE, dtypes, printer)


def _bc(printer: Printer, dtypes: frozenset[int] = NUMERIC) -> OpSpec:
    return OpSpec(OpKind.BROADCAST, dtypes, printer)


_SIGNED = NUMERIC - {TP.UINT8, TP.UINT16, TP.UINT32, TP.UINT64}


def _pow(a: list[Arg], at: Mapping[str, object], t: str) -> str:
    # A baked exponent of 2 (exporters' square in LayerNorm/RMSNorm) is one multiply, exactly
    # pow's correctly rounded square; anything else is pow's dozens of instructions.
    if a[1].expr == literal(2.0, a[1].ctype) and a[1].ctype in ("float", "double"):
        x = _c(a[0], t)
        return f"({x} * {x})"
    return f"pow({_c(a[0], t)}, {_c(a[1], t)})"

TABLE: dict[str, OpSpec] = {
    "Add": _bc(_bin("+")),
    "Sub": _bc(_bin("-")),
    "Mul": _bc(_bin("*")),
    "Div": _bc(_div),
    "Pow": _bc(_pow, FLOATS),
    "Min": _bc(_minmax("min")),
    "Max": _bc(_minmax("max")),
    "Mod": _bc(_mod),
    "Neg": _ew(lambda a, at, t: f"(-{_c(a[0], t)})", _SIGNED),
    "Abs": _ew(lambda a, at, t: f"stitch_abs({_c(a[0], t)})"),
    "Exp": _ew(_fn("exp"), FLOATS),
    "Log": _ew(_fn("log"), FLOATS),
    "Sqrt": _ew(_fn("sqrt"), FLOATS),
    "Reciprocal": _ew(lambda a, at, t: f"stitch_div({_lit(1.0, t)}, {_c(a[0], t)})", FLOATS),
    "Sigmoid": _ew(_fn("stitch_sigmoid"), FLOATS),
    "Tanh": _ew(_fn("tanh"), FLOATS),
    "Erf": _ew(_fn("erf"), FLOATS),
    "Relu": _ew(_fn("stitch_relu"), _SIGNED),
    "LeakyRelu": _ew(_leaky, FLOATS),
    "Elu": _ew(_elu, FLOATS),
    "Selu": _ew(_selu, FLOATS),
    "HardSigmoid": _ew(_hsig, FLOATS),
    "HardSwish": _ew(_hswish, FLOATS),
    "Softplus": _ew(_fn("stitch_softplus"), FLOATS),
    "Gelu": _ew(_gelu, FLOATS),
    "Clip": _bc(_clip),
    "Where": _bc(_where, ALL),
    # Inference BatchNormalization over inputs (x, s, b) folded by channel_params: x·s + b.
    "BatchNormalization": _bc(lambda a, at, t: f"({_c(a[0], t)} * {_c(a[1], t)} + {_c(a[2], t)})", FLOATS),
    "Equal": _bc(_cmp("=="), ALL),
    "Less": _bc(_cmp("<")),
    "LessOrEqual": _bc(_cmp("<=")),
    "Greater": _bc(_cmp(">")),
    "GreaterOrEqual": _bc(_cmp(">=")),
    "Not": _ew(lambda a, at, t: f"(!{a[0].expr})", frozenset({TP.BOOL})),
    "And": _bc(lambda a, at, t: f"({a[0].expr} && {a[1].expr})", frozenset({TP.BOOL})),
    "Or": _bc(lambda a, at, t: f"({a[0].expr} || {a[1].expr})", frozenset({TP.BOOL})),
    "Xor": _bc(lambda a, at, t: f"({a[0].expr} != {a[1].expr})", frozenset({TP.BOOL})),
    "Cast": _ew(_cast, ALL),
    "Identity": _ew(lambda a, at, t: _c(a[0], t), ALL),
    # Broadcasting is indexing: Expand's value at an element is its input's there. Its shape
    # input is not data (SHAPE_INPUTS); legal only where the group's inputs already carry the
    # expanded shape (candidates: the kernel derives its iteration shape from its inputs).
    "Expand": _bc(lambda a, at, t: _c(a[0], t), ALL),
    "Sin": _ew(_fn("sin"), FLOATS),
    "Cos": _ew(_fn("cos"), FLOATS),
    "Floor": _ew(_fn("floor"), FLOATS),
    "Ceil": _ew(_fn("ceil"), FLOATS),
    "Round": _ew(_fn("rint"), FLOATS),  # round half to even, as ONNX specifies
    "Sign": _ew(_fn("stitch_sign"), NUMERIC),
    "IsNaN": _ew(lambda a, at, t: f"({a[0].expr} != {a[0].expr})", FLOATS),
    "IsInf": _ew(_isinf, FLOATS),
}

@dataclass(frozen=True)
class Reducer:
    """A row reduction: accumulator start, how two partials combine (a C expression over u and
    v), and what the total becomes (over `acc` and the row length `C`)."""

    identity: str  # C expression in the compute type T
    combine: str
    finalize: str = "acc"


REDUCERS: dict[str, Reducer] = {
    "ReduceSum": Reducer("T(0)", "u + v"),
    "ReduceMean": Reducer("T(0)", "u + v", "(C > 0 ? acc / T(C) : T(0))"),  # an empty row: 0, as ORT
    "ReduceMax": Reducer("-stitch_inf<T>()", "stitch_pickmax(u, v)"),
    "ReduceMin": Reducer("stitch_inf<T>()", "stitch_pickmin(u, v)"),
    "ReduceProd": Reducer("T(1)", "u * v"),
    "ReduceSumSquare": Reducer("T(0)", "u + v"),  # the square is taken on the element
    "ReduceL1": Reducer("T(0)", "u + v"),  # likewise the absolute value
    "ReduceL2": Reducer("T(0)", "u + v", "sqrt(acc)"),
}
# Element-side transform before accumulating, for the reducers that need one.
REDUCE_ELEMENT = {"ReduceSumSquare": "({x} * {x})", "ReduceL1": "stitch_abs({x})", "ReduceL2": "({x} * {x})"}
# Index reductions: the row's first (or, with select_last_index, last) extreme, as int64.
ARG_REDUCERS = {"ArgMax": ">", "ArgMin": "<"}
# Pools over every spatial axis, as the reduction they are (keepdims, axes 2..rank-1).
GLOBAL_POOLS = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}
# Ops made of reductions and elementwise steps (schemes/rows expands them).
ROW_COMPOSITES = ("Softmax", "LogSoftmax", "LayerNormalization", "ReduceLogSumExp", "InstanceNormalization")

for _op in list(REDUCERS) + list(ROW_COMPOSITES) + list(GLOBAL_POOLS) + list(ARG_REDUCERS):
    TABLE[_op] = OpSpec(OpKind.REDUCE, FLOATS, None)

# Layout ops: a kernel writes its output through them (views.py). Reshape-likes only relabel
# the shape — ONNX Runtime runs them without a kernel; Transpose moves the data.
RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
LAYOUT = RESHAPES | {"Transpose"}
for _op in LAYOUT:
    TABLE[_op] = OpSpec(OpKind.INJECTIVE, ALL, None)

# Slice/Split: the kernel reads boxes of their input (slices.py).
for _op in ("Slice", "Split"):
    TABLE[_op] = OpSpec(OpKind.SLICE, ALL, None)

# Concat: its operands are evaluated in windows of its output (concats.py).
TABLE["Concat"] = OpSpec(OpKind.CONCAT, ALL, None)

# Ops whose inputs after the first are shapes or axes, not data: the kernel reads none of them.
SHAPE_INPUTS = LAYOUT | {"Expand", "Slice", "Split"}


def data_inputs(op_type: str, domain: str, inputs: Sequence[str]) -> Sequence[str]:
    """The inputs a kernel reads as data (a layout op's or Expand's shape input is not)."""
    return inputs[:1] if op_type in SHAPE_INPUTS and domain in ("", "ai.onnx") else inputs

# Ops whose dtype check must look only at some inputs (the others are conditions or shapes).
_DTYPE_INPUTS: dict[str, slice] = {"Where": slice(1, 3), "Cast": slice(0, 0),
                                   **{r: slice(0, 1) for r in list(REDUCERS) + ["ReduceLogSumExp"] + list(ARG_REDUCERS)
                                      + list(SHAPE_INPUTS)}}

OPAQUE = OpSpec(OpKind.OPAQUE, frozenset(), None)


def spec(op_type: str, domain: str) -> OpSpec:
    """The table entry of an op; OPAQUE for anything onnxstitch does not know."""
    if domain not in ("", "ai.onnx"):
        return OPAQUE
    return TABLE.get(op_type, OPAQUE)


def unsupported_reason(op_type: str, domain: str, input_dtypes: Sequence[int | None],
                       output_dtypes: Sequence[int | None]) -> str | None:
    """Why a node cannot be fused (None when it can): unknown op or an unsupported dtype."""
    s = spec(op_type, domain)
    if not s.fusible:
        return f"{domain + '::' if domain else ''}{op_type} is not an op onnxstitch fuses"
    checked = list(input_dtypes[_DTYPE_INPUTS.get(op_type, slice(None))])
    if op_type == "Cast":
        checked = []
    for d in list(checked) + list(output_dtypes):
        if d is None:
            return "dtype unknown after shape inference"
        if d not in ALL:
            return f"dtype {TP.DataType.Name(d)} is not supported"
    for d in checked[:1]:
        if d not in s.dtypes:
            return f"{op_type} on {TP.DataType.Name(d)} is not supported"
    return None


# Device helpers every kernel may call; kept here beside the printers that use them.
PRELUDE = r"""
__device__ __forceinline__ float stitch_h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short stitch_f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float stitch_bf2f(unsigned short h) { return __int_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ unsigned short stitch_f2bf(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return (unsigned short)(u >> 16);
}
__device__ __forceinline__ float stitch_round_f16(float x) { return stitch_h2f(stitch_f2h(x)); }
__device__ __forceinline__ float stitch_round_bf16(float x) { return stitch_bf2f(stitch_f2bf(x)); }
template <typename T> __device__ __forceinline__ T stitch_pickmax(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> __device__ __forceinline__ T stitch_pickmin(T a, T b) { return (a < b || a != a) ? a : b; }
// float32 has one-instruction forms with the same NaN semantics (sm_80+): max.NaN/min.NaN
// propagate NaN like numpy, abs.f32 keeps NaN. The comparisons above cost three instructions.
__device__ __forceinline__ float stitch_pickmax(float a, float b) { float d; asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d; }
__device__ __forceinline__ float stitch_pickmin(float a, float b) { float d; asm("min.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d; }
__device__ __forceinline__ float stitch_abs(float x) { return fabsf(x); }
__device__ __forceinline__ float stitch_relu(float x) { return stitch_pickmax(x, 0.0f); }
template <typename T> __device__ __forceinline__ T stitch_pymod(T a, T b) { T r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
template <typename T> __device__ __forceinline__ T stitch_abs(T x) { return x < T(0) ? -x : x; }
__device__ __forceinline__ unsigned int stitch_abs(unsigned int x) { return x; }
__device__ __forceinline__ unsigned long long stitch_abs(unsigned long long x) { return x; }
template <typename T> __device__ __forceinline__ T stitch_relu(T x) { return x < T(0) ? T(0) : x; }
// (zero and NaN return x itself; written without a `x < 0 ? -1 : x` select, which a compiler
// may turn into a max that drops NaN)
template <typename T> __device__ __forceinline__ T stitch_sign(T x) { return x == T(0) || x != x ? x : (x > T(0) ? T(1) : T(-1)); }
template <typename T> __device__ __forceinline__ T stitch_div(T a, T b) { return a / b; }
template <typename T> __device__ __forceinline__ T stitch_sigmoid(T x) { return T(1) / (T(1) + exp(-x)); }
template <typename T> __device__ __forceinline__ T stitch_softplus(T x) { return x > T(20) ? x : log1p(exp(x)); }
template <typename T> __device__ __forceinline__ T stitch_leaky(T x, T a) { return x >= T(0) ? x : a * x; }
template <typename T> __device__ __forceinline__ T stitch_elu(T x, T a) { return x >= T(0) ? x : a * expm1(x); }
template <typename T> __device__ __forceinline__ T stitch_selu(T x, T a, T g) { return x > T(0) ? g * x : g * (a * exp(x) - a); }
template <typename T> __device__ __forceinline__ T stitch_hardsigmoid(T x, T a, T b) { T v = a * x + b; return v < T(0) ? T(0) : (v > T(1) ? T(1) : v); }
template <typename T> __device__ __forceinline__ T stitch_gelu_erf(T x) { return T(0.5) * x * (T(1) + erf(x * T(0.70710678118654752440))); }
template <typename T> __device__ __forceinline__ T stitch_gelu_tanh(T x) { return T(0.5) * x * (T(1) + tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x))); }
template <typename T> __device__ __forceinline__ T stitch_clip_lo(T x, T lo) { return x < lo ? lo : x; }
template <typename T> __device__ __forceinline__ T stitch_clip_hi(T x, T hi) { return x > hi ? hi : x; }
// Half-precision groups (every floating value float16/bfloat16) compute in float32 with the
// GPU's approximate instructions: their errors (<= 2 ulp of float32; tanh 2^-11 relative) stay
// below half precision's rounding, NaN/Inf propagate as in the exact forms (non-ftz variants),
// and they cost a fraction of the exact sequences, which otherwise make such kernels
// compute-bound. Brought into scope by using-declarations in those kernels only. ex2 alone
// flushes float32 subnormals (results below 1.2e-38, far under half precision's least
// subnormal, 6e-8; bfloat16's are float32's and become 0): the non-ftz form costs a compare
// and two scaling multiplies per element.
namespace stitch_fast {
__device__ __forceinline__ float ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float lg2(float x) { float y; asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float rcp(float x) { float y; asm("rcp.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float exp(float x) { return ex2(x * 1.44269504088896341f); }
__device__ __forceinline__ float log(float x) { return lg2(x) * 0.693147180559945309f; }
__device__ __forceinline__ float sqrt(float x) { float y; asm("sqrt.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float tanh(float x) { float y; asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float stitch_div(float a, float b) { float y; asm("div.approx.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b)); return y; }
template <typename T> __device__ __forceinline__ T stitch_div(T a, T b) { return a / b; }
__device__ __forceinline__ float stitch_sigmoid(float x) { return rcp(1.0f + exp(-x)); }
// erfc(a) = 2^p(a) on [0, 4.5], p a degree-7 least-squares fit of log2 erfc with p(0) = 0 (fitted
// in float64, evaluated by Horner in float32: erfc's relative error <= 7e-6, erf's absolute
// error <= 4e-6, both far under half precision's 4.9e-4). CUDA's erff is ~25 instructions and
// made the float16 exact-GELU kernels issue-bound; this is ~11. min.NaN keeps NaN.
__device__ __forceinline__ float erfc_pos(float a) {
  float p = -2.0321322e-05f;
  p = fmaf(p, a, 4.8614887e-04f); p = fmaf(p, a, -5.2239881e-03f); p = fmaf(p, a, 3.3911374e-02f);
  p = fmaf(p, a, -1.5243143e-01f); p = fmaf(p, a, -9.1708046e-01f); p = fmaf(p, a, -1.6280634e+00f);
  return ex2(p * a);
}
__device__ __forceinline__ float erf(float x) { return copysignf(1.0f - erfc_pos(stitch_pickmin(fabsf(x), 4.5f)), x); }
// 0.5·x·(1 + erf(x/√2)), with 1 + erf(u) = erfc(−u) taken directly for x < 0 (no cancellation:
// relative accuracy where the result is small); 0 beyond the fit, where erfc < 2e-10.
__device__ __forceinline__ float stitch_gelu_erf(float x) {
  float a = stitch_pickmin(fabsf(x) * 0.70710678118654752f, 4.5f);
  float q = a < 4.5f ? erfc_pos(a) : 0.0f;
  return 0.5f * x * (x >= 0.0f ? 2.0f - q : q);
}
template <typename T> __device__ __forceinline__ T stitch_gelu_erf(T x) { return ::stitch_gelu_erf(x); }
__device__ __forceinline__ float stitch_gelu_tanh(float x) { return 0.5f * x * (1.0f + tanh(0.79788456080286535588f * (x + 0.044715f * x * x * x))); }
template <typename T> __device__ __forceinline__ T stitch_gelu_tanh(T x) { return ::stitch_gelu_tanh(x); }
}
#define STITCH_FAST_HALF using stitch_fast::exp; using stitch_fast::log; using stitch_fast::sqrt; \
  using stitch_fast::tanh; using stitch_fast::stitch_div; using stitch_fast::stitch_sigmoid; \
  using stitch_fast::erf; using stitch_fast::stitch_gelu_erf; using stitch_fast::stitch_gelu_tanh;
template <typename T> __device__ __forceinline__ T stitch_inf() { return T(__int_as_float(0x7f800000)); }
// float -> int as ONNX Runtime's static_cast does; NaN -> 0 instead of undefined behaviour.
template <typename I, typename F> __device__ __forceinline__ I stitch_f2i(F x) { return x != x ? I(0) : (I)x; }
"""

