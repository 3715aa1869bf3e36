"""One meaning of `--shape` for every command (optimize, bench, check) and for the library's
`shapes=` arguments.

A size is given as `name=value` or `name=DxDx…`. The name is looked up in this order:

1. a graph input: the value is that input's shape (`timestep=2` is the shape of a rank-1 input
   named timestep); the symbolic dims of its shape take their values from it, so every other
   input sharing them (`batch`) gets the same size;
2. a symbolic dim of the graph inputs (`batch=8`), which takes exactly one value; a dynamic dim
   an exporter left unnamed is called `<input>_dim<i>`.

Any other name is an error that lists the valid ones, as are a rank that differs from the
model's, a fixed dim given another value, and one dim given two values. Dims given no value
default to DEFAULT_SYMBOLIC_DIM.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import onnx

from .errors import BadInputError
from .shapes import DEFAULT_SYMBOLIC_DIM, placeholder_dim

Given = Mapping[str, "int | Sequence[int]"]


@dataclass(frozen=True)
class Sizes:
    """Sizes resolved against a model: input shapes given whole, and symbolic dim values (given
    by name, or read off a given input's shape)."""

    inputs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    dims: Mapping[str, int] = field(default_factory=dict)

    def shape_of(self, vi: onnx.ValueInfoProto) -> tuple[int, ...]:
        """The concrete shape of a graph input under these sizes."""
        if vi.name in self.inputs:
            return self.inputs[vi.name]
        return tuple(int(d.dim_value) if _fixed(d) else int(self.dims.get(dim_name(vi.name, i, d), DEFAULT_SYMBOLIC_DIM))
                     for i, d in enumerate(vi.type.tensor_type.shape.dim))


def _fixed(d: onnx.TensorShapeProto.Dimension) -> bool:
    """Whether a graph input's dim is a number (-1, which some exporters write, is dynamic)."""
    return d.HasField("dim_value") and d.dim_value >= 0


def dim_name(input_name: str, index: int, d: onnx.TensorShapeProto.Dimension) -> str:
    """The name a dynamic dim of a graph input goes by: its dim_param, or `<input>_dim<i>` where
    the exporter left it unnamed (resolve_shapes names it so in the model too)."""
    return f"{input_name}_dim{index}" if placeholder_dim(d) else d.dim_param


def parse(values: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """`--shape batch=8,seq=128` or `--shape x=8x128` (repeatable) → name → values, as typed.
    Raises BadInputError for text of another form."""
    out: dict[str, tuple[int, ...]] = {}
    for value in values:
        for item in filter(None, (v.strip() for v in value.split(","))):
            name, sep, dims = item.partition("=")
            name = name.strip()
            try:
                if not sep or not name:
                    raise ValueError
                parsed = tuple(int(d) for d in dims.lower().split("x"))
            except ValueError:
                raise BadInputError(f"--shape {item!r}: expected name=value or input=DxDx...") from None
            if any(d < 0 for d in parsed):
                raise BadInputError(f"--shape {item!r}: dims must be non-negative")
            if name in out and out[name] != parsed:
                raise BadInputError(f"--shape {name}: given twice, as {_text(out[name])} and {_text(parsed)}")
            out[name] = parsed
    return out


def parse_values(values: Iterable[str]) -> dict[str, float]:
    """`--value sr=16000` (repeatable, or comma-separated): input name → the one value it takes
    wherever onnxstitch makes inputs (a sample rate, a flag a model branches on)."""
    out: dict[str, float] = {}
    for value in values:
        for item in filter(None, (v.strip() for v in value.split(","))):
            name, sep, text = item.partition("=")
            word = text.strip().lower()
            try:
                if not sep or not name.strip():
                    raise ValueError
                out[name.strip()] = {"true": 1, "false": 0}[word] if word in ("true", "false") else \
                    (int(word) if word.lstrip("-").isdigit() else float(word))
            except ValueError:
                raise BadInputError(f"--value {item!r}: expected input=NUMBER (or true/false)") from None
    return out


def check_values(model: onnx.ModelProto, values: Mapping[str, float] | None) -> None:
    """Every name of `values` is a graph input of `model`, else BadInputError listing them."""
    names = [vi.name for vi in _runtime_inputs(model)]
    for name in values or {}:
        if name not in names:
            raise BadInputError(f"--value {name}: the model has no graph input of that name (inputs: {', '.join(names)})")


def _text(dims: Sequence[int]) -> str:
    return "x".join(map(str, dims))


def _runtime_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def valid_names(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """The names `--shape` accepts: graph inputs (with their shapes, for the message) and the
    symbolic dims of their shapes."""
    inputs, dims = [], []
    for vi in _runtime_inputs(model):
        shape = vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else None
        if shape is None:
            inputs.append(f"{vi.name} [?]")
            continue
        names = [str(d.dim_value) if _fixed(d) else dim_name(vi.name, i, d)
                 for i, d in enumerate(shape)]
        inputs.append(f"{vi.name} [{', '.join(names)}]")
        dims += [n for n, d in zip(names, shape) if not _fixed(d)]
    return inputs, list(dict.fromkeys(dims))


def resolve(model: onnx.ModelProto, given: Given | None) -> Sizes:
    """`given` (name → value or values, as `parse` returns or a library caller writes) read
    against `model`'s graph inputs by the rules above. Raises BadInputError naming the entry."""
    inputs = {vi.name: vi for vi in _runtime_inputs(model)}
    shapes: dict[str, tuple[int, ...]] = {}
    dims: dict[str, int] = {}
    source: dict[str, str] = {}

    def set_dim(dim: str, value: int, why: str) -> None:
        if dim in dims and dims[dim] != value:
            raise BadInputError(f"--shape: dim {dim!r} is {dims[dim]} by {source[dim]} and {value} by {why}")
        dims[dim], source[dim] = value, why

    named: list[tuple[str, int]] = []
    for name, raw in (given or {}).items():
        values = (int(raw),) if isinstance(raw, int) else tuple(int(v) for v in raw)
        if name in inputs:
            shapes[name] = _input_shape(inputs[name], values, set_dim)
        else:
            named.append((name, values))
    known = set(valid_names(model)[1])
    for name, values in named:
        if name not in known:
            ins, ds = valid_names(model)
            raise BadInputError(f"--shape {name}: the model has no graph input or symbolic dim of that name "
                                f"(inputs: {'; '.join(ins) or 'none'}; dims: {', '.join(ds) or 'none'})")
        if len(values) != 1:
            raise BadInputError(f"--shape {name}={_text(values)}: {name!r} is a symbolic dim and takes one value")
        set_dim(name, values[0], f"{name}={values[0]}")
    return Sizes(shapes, dims)


def _input_shape(vi: onnx.ValueInfoProto, values: tuple[int, ...], set_dim) -> tuple[int, ...]:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):  # rank unknown: the shape given is taken as it is
        return values
    dims = tt.shape.dim
    if len(dims) != len(values):
        raise BadInputError(f"--shape {vi.name}={_text(values)}: rank {len(values)} given, the model's input "
                            f"{vi.name} has rank {len(dims)}")
    for i, (d, v) in enumerate(zip(dims, values)):
        if _fixed(d):
            if d.dim_value != v:
                raise BadInputError(f"--shape {vi.name}: dim {i} is fixed at {d.dim_value} in the model, {v} given")
            continue
        set_dim(dim_name(vi.name, i, d), v, f"{vi.name}={_text(values)}")
    return values


def applicable(model: onnx.ModelProto, given: Given | None) -> dict[str, "int | Sequence[int]"]:
    """The entries of `given` that name a graph input or a symbolic dim of `model`: for a caller
    that sizes several models with one set of names (a benchmark sweep, the tests), where
    `resolve` holds every name to the model."""
    inputs = {vi.name for vi in _runtime_inputs(model)}
    dims = set(valid_names(model)[1])
    return {k: v for k, v in (given or {}).items() if k in inputs or k in dims}


def resolve_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> tuple[onnx.ModelProto, dict[str, int]]:
    """Planning values for symbolic dims, `shapes` read as sizes.py says (graph inputs first,
    then symbolic dims; anything else is an error). The model keeps its dynamic dims (the
    stitched model must run at any size); unnamed dynamic input dims get a name so they can
    carry a value, and an input declared without a shape gets one of named dims where a shape
    is given for it. Returns (model, symbolic dim → value)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    _name_dynamic_dims(model.graph)
    given = resolve(model, shapes)
    values = dict(given.dims)
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        if vi.name in given.inputs and not tt.HasField("shape"):
            for i, v in enumerate(given.inputs[vi.name]):
                tt.shape.dim.add().dim_param = f"{vi.name}_dim{i}"
                values[f"{vi.name}_dim{i}"] = int(v)
    return model, values


def _name_dynamic_dims(graph: onnx.GraphProto) -> None:
    """Exporters such as paddle2onnx write a dynamic dim as dim_value -1 or "?", and some leave
    input dims unnamed (`placeholder_dim`): a graph input's such dim gets a name of its own
    (`<input>_dim<i>`, as inputs.input_shapes reads it) so that --shape can size it, two of them
    are not taken for one size, and the stitched model stays dynamic there; elsewhere such a dim
    becomes an unknown dim."""
    inits = {t.name for t in graph.initializer}
    for vi in (vi for vi in graph.input if vi.name not in inits):
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            if placeholder_dim(d):
                d.dim_param = f"{vi.name}_dim{i}"
    for vi in list(graph.output) + list(graph.value_info):
        for d in vi.type.tensor_type.shape.dim:
            if placeholder_dim(d):
                d.Clear()
