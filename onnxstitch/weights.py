"""A model's weights kept out of its protobuf while optimize works on the graph.

Every stage rewrites the graph, and protobuf copies a model whole (CopyFrom, serialization for
shape inference, the checker and ONNX Runtime): with the weights inside, each copy costs their
size and time (BERT-base: 7 GB resident and most of optimize's time for 440 MB of weights).
So `detach` moves the payload of every large floating-point initializer into a `Weights` store
and leaves a stub in the model: same name, type and dims, marked as external data at a
location only the store knows. The graph passes never read those values (they read shapes,
scalars and small parameters, which stay inline); sibling MatMuls read and add weights through
the store. ONNX Runtime reads stubs from the store's buffers
(`SessionOptions.add_external_initializers_from_files_in_memory`); `attach` and `save` put the
payloads back. Initializers that were external data on disk stay memory-mapped, unread until
ONNX Runtime copies them or the output is written.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Floating-point initializers above this many elements are weights; smaller ones (norm
# parameters, channel scales, masks and indices of any size) stay in the graph, where the passes
# read their values.
DETACH_ABOVE = 65536
_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)
_PREFIX = "onnxstitch-weight-"


def _numel(t: TensorProto) -> int:
    return int(np.prod(t.dims)) if len(t.dims) else 1


def is_stub(t: TensorProto) -> bool:
    """Whether an initializer is a stub whose payload a `Weights` store holds."""
    return t.data_location == TensorProto.EXTERNAL and any(
        e.key == "location" and e.value.startswith(_PREFIX) for e in t.external_data)


def _location(t: TensorProto) -> str:
    return next(e.value for e in t.external_data if e.key == "location")


def _external_fields(t: TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


class Weights:
    """Payloads of a model's detached initializers, by stub location. Buffers are bytes (moved
    out of the protobuf) or read-only memory maps of the model's external data files."""

    def __init__(self) -> None:
        self._data: dict[str, memoryview | bytes] = {}
        self._maps: list[mmap.mmap] = []

    def __len__(self) -> int:
        return len(self._data)

    @property
    def nbytes(self) -> int:
        """Bytes held (memory-mapped ones counted)."""
        return sum(len(b) for b in self._data.values())

    def _stub(self, t: TensorProto, payload: memoryview | bytes) -> None:
        loc = f"{_PREFIX}{len(self._data)}"
        self._data[loc] = payload
        for field in ("raw_data", "float_data", "int32_data", "double_data", "external_data"):
            t.ClearField(field)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", loc), ("offset", "0"), ("length", str(len(payload)))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value

    def _mapped(self, path: Path) -> mmap.mmap:
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._maps.append(m)
        return m

    @classmethod
    def detach(cls, model: onnx.ModelProto, base_dir: str | os.PathLike | None = None) -> "Weights":
        """Move the large floating-point initializers of `model`'s main graph into a new store,
        in place. Initializers stored as external data (loaded without it, relative to
        `base_dir`) are memory-mapped from their files instead of read."""
        store = cls()
        maps: dict[Path, mmap.mmap] = {}
        for t in model.graph.initializer:
            if is_stub(t):
                continue
            large = t.data_type in _FLOATS and _numel(t) > DETACH_ABOVE
            if t.data_location == TensorProto.EXTERNAL:
                fields = _external_fields(t)
                path = Path(base_dir or ".") / fields["location"]
                if path not in maps:
                    maps[path] = store._mapped(path)
                offset = int(fields.get("offset", 0))
                length = int(fields.get("length", len(maps[path]) - offset))
                payload = memoryview(maps[path])[offset:offset + length]
                if large:
                    store._stub(t, payload)
                else:  # small: inline, so the graph alone is whole (biases, shapes, masks)
                    del t.external_data[:]
                    t.data_location = TensorProto.DEFAULT
                    t.raw_data = bytes(payload)
            elif not large:
                continue
            elif t.HasField("raw_data"):
                store._stub(t, t.raw_data)
            else:  # typed fields (float_data …): their little-endian bytes
                store._stub(t, numpy_helper.to_array(t).tobytes())
        return store

    def value(self, t: TensorProto) -> np.ndarray:
        """An initializer's value, stub or not."""
        if not is_stub(t):
            return numpy_helper.to_array(t)
        data = self._data[_location(t)]
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
        return np.frombuffer(data, dtype=dtype).reshape(tuple(t.dims))

    def add(self, array: np.ndarray, name: str) -> TensorProto:
        """A new initializer of `array`: a stub when it is as large as a detached weight."""
        t = numpy_helper.from_array(array, name)
        if t.data_type in _FLOATS and _numel(t) > DETACH_ABOVE:
            self._stub(t, t.raw_data)
        return t

    def buffers(self, model: onnx.ModelProto) -> Iterator[tuple[str, memoryview | bytes]]:
        """(location, payload) of every stub among `model`'s initializers."""
        seen = set()
        for t in model.graph.initializer:
            if is_stub(t) and (loc := _location(t)) not in seen:
                seen.add(loc)
                yield loc, self._data[loc]

    def session_options(self, model: onnx.ModelProto, options: Any = None) -> Any:
        """ONNX Runtime SessionOptions (`options`, or new ones) that supply `model`'s stubs."""
        import onnxruntime as ort

        options = options or ort.SessionOptions()
        names, buffers = [], []
        for loc, data in self.buffers(model):
            names.append(loc)
            buffers.append(data)
        if names:
            options.add_external_initializers_from_files_in_memory(names, buffers, [len(b) for b in buffers])
        return options

    def attach(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of `model` with every stub's payload inside it again."""
        out = onnx.ModelProto()
        out.CopyFrom(model)
        for t in out.graph.initializer:
            if is_stub(t):
                data = self._data[_location(t)]
                t.ClearField("external_data")
                t.data_location = TensorProto.DEFAULT
                t.raw_data = bytes(data)
        return out

    def save(self, model: onnx.ModelProto, path: str | os.PathLike, external: bool) -> None:
        """Write `model` with its payloads to `path`: inside the file, or with `external` in
        `<name>.data` beside it, written tensor by tensor (no second copy in memory)."""
        path = Path(path)
        if not external:
            onnx.save(self.attach(model), str(path))
            return
        out = onnx.ModelProto()
        out.CopyFrom(model)
        data_name = path.name + ".data"
        offset = 0
        with open(path.parent / data_name, "wb") as f:
            for t in out.graph.initializer:
                if not is_stub(t):
                    continue
                payload = self._data[_location(t)]
                pad = (-offset) % 4096  # aligned, as onnx's own writer does, so ORT can map them
                f.write(b"\0" * pad)
                offset += pad
                f.write(payload)
                del t.external_data[:]
                for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(len(payload)))):
                    entry = t.external_data.add()
                    entry.key, entry.value = key, value
                offset += len(payload)
        onnx.save(out, str(path))

    def checkable(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of `model` whose stubs are typed graph inputs: what onnx.checker and shape
        inference can read without the payloads (their types and dims are all they need)."""
        out = onnx.ModelProto()
        out.CopyFrom(model)
        stubs = [t for t in out.graph.initializer if is_stub(t)]
        if not stubs:
            return out
        keep = [t for t in out.graph.initializer if not is_stub(t)]
        inputs = {i.name for i in out.graph.input}
        out.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                               for t in stubs if t.name not in inputs)
        del out.graph.initializer[:]
        out.graph.initializer.extend(keep)
        return out
