"""Shapes that only running the model tells: the outputs of custom ops.

ONNX's shape inference and onnxruntime's symbolic inference know nothing of an op from a
custom-op library (onnxruntime-extensions, the user's own), so everything after such an op has
no shape and cannot be planned. Given the library, the model runs: the custom ops' outputs are
read at the planning sizes and again with every symbolic dim doubled (doubling keeps the
divisibility a CNN's strides need). A dim equal to one symbolic dim in both runs is that dim; a
dim the same in both runs is that number; any other gets a name of its own
(`<tensor>_dim<i>`) and its planning value. The shapes found are written into the model as
value_info, and inference runs again from them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from .errors import first_line
from .inputs import random_feeds
from .sessions import Runner, library_domains
from .shapes import DEFAULT_SYMBOLIC_DIM, TensorInfo
from .weights import Weights

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Probed:
    """Shapes read off runs of the model: tensor → shape, and the planning values of the dims
    named anew."""

    shapes: Mapping[str, tuple[int | str, ...]]
    dim_values: Mapping[str, int]
    dtypes: Mapping[str, int] = field(default_factory=dict)
    note: str = ""  # why nothing could be probed, when nothing could


def custom_outputs(model: onnx.ModelProto, infos: Mapping[str, TensorInfo]) -> list[str]:
    """Outputs of custom-domain ops (not model-local functions) whose shape inference left
    anything unknown."""
    custom = library_domains(model)  # ONNX Runtime's own ops' shapes come from inference
    out = []
    for n in model.graph.node:
        if n.domain not in custom:
            continue
        for t in n.output:
            info = infos.get(t)
            if t and (info is None or info.shape is None or any(d is None for d in info.shape)):
                out.append(t)
    return out


def probe(model: onnx.ModelProto, tensors: Sequence[str], dim_values: Mapping[str, int],
          libraries: Sequence[str], weights: Weights | None = None) -> Probed:
    """The shapes and dtypes of `tensors` (custom ops' outputs) of `model`, read off two runs on
    ONNX Runtime's CPU EP with the custom-op `libraries` registered (`weights`: the payloads of
    the model's weight stubs)."""
    if not tensors:
        return Probed({}, {})
    symbols = sorted({d.dim_param for vi in model.graph.input for d in vi.type.tensor_type.shape.dim if d.dim_param})
    first = {s: int(dim_values.get(s, DEFAULT_SYMBOLIC_DIM)) for s in symbols}
    second = {s: 2 * v for s, v in first.items()}
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    m.graph.output.extend(onnx.ValueInfoProto(name=t) for t in tensors)  # typeless: ORT finds the types
    runner = Runner(False, weights, tuple(libraries))
    runs = []
    dtypes: dict[str, int] = {}
    for dims in (first, second) if symbols else (first,):
        try:
            got = runner.run(m, False, random_feeds(model, 0, dims))
        except Exception as e:  # the shapes stay unknown: what follows the op is left to ORT
            note = f"the custom ops' output shapes could not be probed ({first_line(e)})"
            log.warning("%s", note)
            return Probed({}, {}, note=note)
        runs.append([np.asarray(got[t]).shape for t in tensors])
        dtypes = {t: helper.np_dtype_to_tensor_dtype(np.asarray(got[t]).dtype) for t in tensors}
    shapes: dict[str, tuple[int | str, ...]] = {}
    named: dict[str, int] = {}
    for k, t in enumerate(tensors):
        a = runs[0][k]
        b = runs[-1][k]
        if len(a) != len(b):
            continue  # rank depends on the sizes: left unknown
        dims_out: list[int | str] = []
        for i, (x, y) in enumerate(zip(a, b)):
            match = [s for s in symbols if first[s] == x and second[s] == y]
            if len(match) == 1:
                dims_out.append(match[0])
            elif x == y and (not symbols or len(runs) == 2):
                dims_out.append(int(x))
            else:
                name = f"{t}_dim{i}"
                named[name] = int(x)
                dims_out.append(name)
        shapes[t] = tuple(dims_out)
    return Probed(shapes, named, dtypes)


def with_shapes(model: onnx.ModelProto, probed: Probed) -> onnx.ModelProto:
    """`model` with the probed shapes and dtypes written as value_info."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {vi.name for vi in m.graph.value_info}
    for t, shape in probed.shapes.items():
        vi = helper.make_tensor_value_info(t, probed.dtypes[t], list(shape))
        if t in have:
            for old in m.graph.value_info:
                if old.name == t:
                    old.CopyFrom(vi)
        else:
            m.graph.value_info.append(vi)
    return m
