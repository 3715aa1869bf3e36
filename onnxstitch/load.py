"""The load stage: load and validate a model; normalize Constant nodes into initializers.

Every failure here is the user's input: a BadInputError with one line naming the file.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from . import wire
from .errors import BadInputError, first_line
from .weights import Weights


# Protobuf cannot serialize a message over 2 GiB; past this size models travel as files with
# external data (checked, inferred and run from a path).
PROTOBUF_LIMIT = 2**31 - 2**24


# The newest ai.onnx opset the project knows (graph.MAX_OPSET).
LATEST_OPSET = 28


def ai_onnx_opset(model: onnx.ModelProto) -> int:
    """The ai.onnx opset `model` imports; LATEST_OPSET for one that imports none, which then
    has no ai.onnx node (onnx.checker refuses one), so no pass has anything to read it for."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), LATEST_OPSET)


def is_large(model: onnx.ModelProto) -> bool:
    """True when `model` is too big to serialize as one protobuf message."""
    return model.ByteSize() > PROTOBUF_LIMIT


def save(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """onnx.save, with external data (`<name>.data` beside it) when the model is large."""
    path = Path(path)
    if not is_large(model):
        onnx.save(model, str(path))
        return
    copy = onnx.ModelProto()  # onnx.save moves tensors' bytes out of the proto it is given
    copy.CopyFrom(model)
    onnx.save(copy, str(path), save_as_external_data=True, location=path.name + ".data")


def check(model: onnx.ModelProto, *, full_check: bool = False) -> None:
    """onnx.checker.check_model, through a temporary file when the model is large."""
    if not is_large(model):
        onnx.checker.check_model(model, full_check=full_check)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        save(model, path)
        onnx.checker.check_model(str(path), full_check=full_check)


def load(source: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    """Read and check a model. Raises BadInputError for a missing, empty, truncated or
    non-ONNX file and for a graph that onnx.checker rejects."""
    if isinstance(source, onnx.ModelProto):
        if not source.graph.node and not source.graph.output:
            raise BadInputError("model: not an ONNX model (no graph)")
        try:
            check(source)
        except (onnx.checker.ValidationError, ValueError) as e:
            raise BadInputError(f"model: invalid graph: {first_line(e)}") from e
        return source
    path = Path(source)
    check_read = _check_path(path)
    model = _read(path, load_external_data=True)
    check_read(model)
    return model


def _read(path: Path, load_external_data: bool) -> onnx.ModelProto:
    try:
        return onnx.load(str(path), load_external_data=load_external_data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise BadInputError(f"{path}: not a readable ONNX model ({first_line(e)})") from e
    except onnx.checker.ValidationError as e:  # external data missing or outside the model's folder
        raise BadInputError(f"{path}: cannot read its external data: {first_line(e)}") from e
    except OSError as e:
        raise BadInputError(f"{path}: cannot read ({first_line(e)})") from e


def load_detached(source: str | os.PathLike | onnx.ModelProto) -> tuple[onnx.ModelProto, Weights]:
    """`load`, with the large weights kept out of the returned model (weights.py): the model
    holds stubs, the store their payloads. A model given as a ModelProto is copied first (the
    caller's stays whole); from a path, external data is memory-mapped, not read."""
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(load(source))
        return model, Weights.detach(model)
    path = Path(source)
    check_read = _check_path(path)
    # The weights inside the file stay in its memory map (wire.py): read by onnx, the message
    # held a second copy of them for as long as it lived (BERT-base: 0.86 GB, 2.0 s).
    mapped = wire.read(path)
    model = mapped.model if mapped is not None else _read(path, load_external_data=False)
    external = _has_external_data(model)
    if external:  # the checker reads the model file (not the data) and checks the data's locations
        check_read(model)
    try:
        store = Weights.detach(model, path.parent, held=mapped, held_file=path.name)
    except (OSError, KeyError, ValueError) as e:
        raise BadInputError(f"{path}: cannot read its external data ({first_line(e)})") from e
    if not external:
        # Weights inside the file: the checker would read all of them again (BERT-base: 1.6 s
        # of a 2.5 s load); their types and dims are what it checks, and the stubs keep those.
        check_read(store.checkable(model), from_path=False)
    return model, store


def _has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def _check_path(path: Path):
    """Validate a model file before reading it; returns the check of the read model."""
    where = str(path)
    if not path.exists():
        raise BadInputError(f"{where}: no such file")
    if path.is_dir():
        raise BadInputError(f"{where}: is a directory, not an ONNX file")
    if path.stat().st_size == 0:
        raise BadInputError(f"{where}: file is empty")

    def check_read(model: onnx.ModelProto, from_path: bool = True) -> None:
        if not model.graph.node and not model.graph.output:
            raise BadInputError(f"{where}: not an ONNX model (no graph)")
        try:  # from the path: works for models with external data of any size
            onnx.checker.check_model(where if from_path else model)
        except (onnx.checker.ValidationError, ValueError) as e:
            # The checker reads external data's locations: a weights file left behind is not a
            # fault of the graph.
            what = "cannot read its external data" if "should be stored in" in str(e) else "invalid graph"
            raise BadInputError(f"{where}: {what}: {first_line(e)}") from e
    return check_read


_VALUE_ATTRS = {"value", "value_float", "value_floats", "value_int", "value_ints"}


def constants_to_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Copy of the model whose main-graph Constant nodes are initializers, so later stages
    see one kind of constant. Constants of other forms (strings, sparse) stay nodes."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if out.ir_version < 4:
        # Before IR 4 every initializer is also listed as a graph input, and ONNX Runtime holds
        # them constant all the same. The stitched model's IR (10) would make them runtime
        # inputs with defaults, which ORT may not fold (BatchNorm into Conv) or fuse: they
        # become plain initializers, as they were in effect.
        inits = {t.name for t in out.graph.initializer}
        keep_inputs = [i for i in out.graph.input if i.name not in inits]
        del out.graph.input[:]
        out.graph.input.extend(keep_inputs)
        out.ir_version = 4
    keep = []
    for node in out.graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and set(attrs) <= _VALUE_ATTRS and attrs:
            (name, attr), = attrs.items()
            value = helper.get_attribute_value(attr)
            if name == "value":
                tensor = onnx.TensorProto()
                tensor.CopyFrom(value)
            else:
                dtype = np.float32 if name.startswith("value_float") else np.int64
                tensor = numpy_helper.from_array(np.asarray(value, dtype=dtype))
            tensor.name = node.output[0]
            out.graph.initializer.append(tensor)
        else:
            keep.append(node)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    return out
