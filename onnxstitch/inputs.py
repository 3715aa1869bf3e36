"""Seeded random feeds for a model's graph inputs (bench, checks and tests share them)."""
from __future__ import annotations

from typing import Collection, Mapping, MutableMapping

import numpy as np
import onnx
from onnx import helper

from .sizes import Sizes


def input_shapes(model: onnx.ModelProto, dim_values: Mapping[str, int] | None = None,
                 overrides: Mapping[str, tuple[int, ...]] | None = None) -> dict[str, tuple[int, ...]]:
    """Concrete shape of every runtime input: overrides by input name, then symbolic dims
    from `dim_values` (sizes.py names them), else DEFAULT_SYMBOLIC_DIM."""
    inits = {i.name for i in model.graph.initializer}
    sizes = Sizes({k: tuple(v) for k, v in (overrides or {}).items()}, dict(dim_values or {}))
    return {vi.name: sizes.shape_of(vi) for vi in model.graph.input if vi.name not in inits}


# Ops that pass integer values through unchanged in meaning (so an index stays an index).
_PASS_THROUGH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Identity", "Transpose"}
# Arithmetic that makes positions of a mask, through any operand: OPT's position ids are
# cumsum(mask) · mask − 1 (+ an offset), rows of its position table only for a mask of 0s and 1s.
_ARITHMETIC = {"CumSum", "Add", "Sub", "Mul"}
_INDEX_USERS = {"Gather", "GatherElements", "GatherND"}


def index_inputs(model: onnx.ModelProto) -> set[str]:
    """Integer graph inputs used as Gather indices (token ids, token types), directly or through
    a mask's running sum (positions): they must be valid rows of whatever table they index, so
    feeds draw them from {0, 1}."""
    users: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for t in n.input:
            users.setdefault(t, []).append(n)
    found = set()
    for vi in model.graph.input:
        stack, seen = [vi.name], set()
        while stack:
            t = stack.pop()
            for n in users.get(t, []):
                if n.op_type in _INDEX_USERS and len(n.input) > 1 and n.input[1] == t:
                    found.add(vi.name)
                elif (n.op_type in _PASS_THROUGH and n.input and n.input[0] == t) or \
                        (n.op_type in _ARITHMETIC and t in n.input[:2]):
                    stack += [o for o in n.output if o not in seen]
                    seen.update(n.output)
    return found


def random_array(dtype: int, shape: tuple[int, ...], rng: np.random.Generator, index: bool = False) -> np.ndarray:
    """Fresh random data of an onnx dtype: normal floats, small integers, random bools. Always
    an ndarray, rank 0 included (numpy hands back scalars there, which ORT refuses)."""
    if index:
        return rng.integers(0, 2, size=shape).astype(helper.tensor_dtype_to_np_dtype(dtype))
    return np.asarray(_draw(dtype, shape, rng))


def _draw(dtype: int, shape: tuple[int, ...], rng: np.random.Generator):
    if dtype == onnx.TensorProto.BFLOAT16:
        import ml_dtypes

        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    np_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(dtype))
    if np_dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(np_dtype, np.integer):
        lo = 0 if np.issubdtype(np_dtype, np.unsignedinteger) else -20
        return rng.integers(lo, 20, size=shape).astype(np_dtype)
    return rng.standard_normal(shape).astype(np_dtype)


def random_feeds(model: onnx.ModelProto, seed: int = 0, dim_values: Mapping[str, int] | None = None,
                 overrides: Mapping[str, tuple[int, ...]] | None = None,
                 values: Mapping[str, float] | None = None, only: Collection[str] | None = None,
                 drawn: int | None = None, pool: MutableMapping[int, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Seeded random feeds for every runtime input of `model` (those named in `only`, where
    given; Gather indices drawn from {0, 1}); an input named in `values` is that value
    everywhere (`--value sr=16000`: a sample rate, a flag a model branches on), in the input's
    dtype. `drawn`: at most that many values drawn per dtype, repeated, the inputs views of one
    buffer (for timing, where values do not matter and drawing a network's activations in full
    took seconds). `pool`: those buffers by dtype, the caller's, shared by every call given it
    (grown twofold where one is too small): feeds for many models then hold one buffer, not one
    each (MobileViT V2's measured groups held 9.9 GB of them)."""
    rng = np.random.default_rng(seed)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    indices = index_inputs(model)
    shapes = {name: shape for name, shape in input_shapes(model, dim_values, overrides).items()
              if only is None or name in only}
    if drawn is None:
        out = {name: random_array(types[name], shape, rng, name in indices) for name, shape in shapes.items()}
    else:  # for timing: one buffer per dtype, `drawn` values repeated, each input a view of it
        sizes = {name: int(np.prod(shape)) if shape else 1 for name, shape in shapes.items()}
        bases = {} if pool is None else pool
        for dtype in {types[n] for n in shapes if n not in indices}:
            most = max(sizes[n] for n in shapes if types[n] == dtype and n not in indices)
            have = bases.get(dtype)
            if have is None or have.size < most:
                size = most if have is None else max(most, 2 * have.size)  # (views of the old one stay valid)
                bases[dtype] = np.resize(np.asarray(_draw(dtype, (min(size, drawn),), rng)), size)
        out = {name: random_array(types[name], shape, rng, True) if name in indices
               else bases[types[name]][:sizes[name]].reshape(shape) for name, shape in shapes.items()}
    for name, value in (values or {}).items():
        if name in out:
            out[name] = np.full(out[name].shape, value, dtype=out[name].dtype)
    return out
