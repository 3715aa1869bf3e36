"""A model's weights kept out of its protobuf while optimize works on the graph.

Every stage rewrites the graph, and protobuf copies a model whole (CopyFrom, serialization for
shape inference, the checker and ONNX Runtime): with the weights inside, each copy costs their
size and time (BERT-base: 7 GB resident and most of optimize's time for 440 MB of weights).
So `detach` moves the payload of every large floating-point initializer into a `Weights` store
and leaves a stub in the model: same name, type and dims, marked as external data at a
location only the store knows. The graph passes never read those values (they read shapes,
scalars and small parameters, which stay inline); sibling MatMuls join weights through the
store (`concat`), which makes the joined payload only when it is read. `attach` and `save` put
the payloads back.

Memory: a large model's weights should be resident about once, not once per copy. Initializers
that were external data on disk, and those inside the model's own file (wire.py leaves them in
the file's map), stay memory-mapped here, unread until the output is written (copied file to
file). ONNX Runtime reads them from their files itself (`session_model` points the stubs back at
them, a weight inside the model file as external data of that file at its bytes' offset): it
maps the file and runs CPU initializers from the mapping, where buffers handed over in memory
(`SessionOptions.add_external_initializers_from_files_in_memory`, still used for weights made
here or read without the map) are copied into every session (Qwen2-0.5B: +2 GB and 6 s per
session; BERT-base +0.48 GB). A joined weight reaches a session as a Concat of its parts, which
ORT folds when the session starts.
"""
from __future__ import annotations

import mmap
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from . import wire

# Floating-point initializers above this many elements are weights; smaller ones (norm
# parameters, channel scales, masks and indices of any size) stay in the graph, where the passes
# read their values.
DETACH_ABOVE = 65536
_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)
_PREFIX = "onnxstitch-weight-"
# Payloads are written and joined this many bytes at a time, so a copy never holds a whole one.
_CHUNK = 64 << 20
# ONNX Runtime session config: the folder external data locations are relative to, for a model
# given as bytes.
_FOLDER_KEY = "session.model_external_initializers_file_folder_path"
# The name ending of the Concat nodes that make joined weights in a session's model.
JOIN_SUFFIX = "~concat"


def _numel(t: TensorProto) -> int:
    return int(np.prod(t.dims)) if len(t.dims) else 1


def is_stub(t: TensorProto) -> bool:
    """Whether an initializer is a stub whose payload a `Weights` store holds."""
    return t.data_location == TensorProto.EXTERNAL and any(
        e.key == "location" and e.value.startswith(_PREFIX) for e in t.external_data)


def _payload_size(payload: memoryview | bytes | _Concat | _Transposed) -> int:
    return payload.nbytes if isinstance(payload, (_Concat, _Transposed)) else len(payload)


def _location(t: TensorProto) -> str:
    return next(e.value for e in t.external_data if e.key == "location")


def _external_fields(t: TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def _set_external(t: TensorProto, location: str, offset: int, length: int) -> None:
    del t.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value


def _write_all(f: Any, data: Any) -> int:
    """Write all of `data` to the unbuffered file `f` (one write may take less); its length."""
    view = memoryview(data).cast("B")
    total = len(view)
    while view:
        view = view[f.write(view):]
    return total


@dataclass(frozen=True)
class _Extent:
    """Where a payload lies in an external data file (`location` relative to the store's base
    directory)."""

    location: str
    offset: int
    length: int


@dataclass(frozen=True)
class _Concat:
    """A payload made when it is read: `parts` (stubs of the same store or small inline
    initializers, of one dtype) joined along `axis`."""

    parts: tuple[TensorProto, ...]
    axis: int
    nbytes: int


@dataclass(frozen=True)
class _Transposed:
    """A payload made when it is read: the 2-D `part` (a stub of the same store or an inline
    initializer) transposed (a float32 GEMM's weight, read K-major: schemes/gemm/match.py)."""

    part: TensorProto
    nbytes: int


_Lazy = (_Concat, _Transposed)


class Weights:
    """Payloads of a model's detached initializers, by stub location. Buffers are bytes (moved
    out of the protobuf), read-only memory maps of the model's external data files, or joins of
    other payloads made on demand (`concat`)."""

    def __init__(self) -> None:
        self._data: dict[str, memoryview | bytes | _Concat | _Transposed] = {}
        self._maps: list[mmap.mmap] = []
        # Payloads that are a range of an external data file, by stub location, and the folder
        # their locations are relative to: what ONNX Runtime can map itself.
        self._extents: dict[str, _Extent] = {}
        self._base_dir: Path | None = None
        # Bytes of the detached payloads that were inside the model's own file (not external
        # data): what ONNX Runtime copies when it reads that file itself.
        self.inside_bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def nbytes(self) -> int:
        """Bytes held (memory-mapped ones and joins not yet made counted). A merged weight's
        parts and its join both count: `bytes_in` is what one model writes."""
        return sum(_payload_size(b) for b in self._data.values())

    def bytes_in(self, model: onnx.ModelProto) -> int:
        """Bytes of the payloads `model`'s stubs stand for: what writing it adds (`save`)."""
        return sum(_payload_size(self._data[_location(t)]) for t in model.graph.initializer if is_stub(t))

    def _stub(self, t: TensorProto, payload: memoryview | bytes | _Concat | _Transposed) -> str:
        loc = f"{_PREFIX}{len(self._data)}"
        self._data[loc] = payload
        for field in ("raw_data", "float_data", "int32_data", "double_data", "external_data"):
            t.ClearField(field)
        t.data_location = TensorProto.EXTERNAL
        _set_external(t, loc, 0, _payload_size(payload))
        return loc

    def _mapped(self, path: Path) -> mmap.mmap:
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._maps.append(m)
        return m

    @classmethod
    def detach(cls, model: onnx.ModelProto, base_dir: str | os.PathLike | None = None,
               held: "wire.Mapped | None" = None, held_file: str | None = None) -> "Weights":
        """Move the large floating-point initializers of `model`'s main graph into a new store,
        in place. Initializers stored as external data (loaded without it, relative to
        `base_dir`) are memory-mapped from their files instead of read. `held`: the model file
        as wire.py read it, whose raw payloads the message was parsed without: the large
        floating-point ones stay views of its map, the others go back into their tensors.
        `held_file`: that file's name in `base_dir`, where ONNX Runtime can map those payloads
        itself (`session_model`), as it does external data."""
        store = cls()
        base = Path(base_dir or ".").resolve()
        if held is not None:
            store._maps.append(held.mapping)
            for i, payload in held.payloads.items():
                t = model.graph.initializer[i]
                if not (t.data_type in _FLOATS and _numel(t) > DETACH_ABOVE):
                    t.raw_data = bytes(payload)
                    continue
                loc = store._stub(t, payload)
                store.inside_bytes += len(payload)
                if held_file is not None:
                    store._extents[loc] = _Extent(held_file, held.offsets[i], len(payload))
                    store._base_dir = base
        maps: dict[Path, mmap.mmap] = {}
        for t in model.graph.initializer:
            if is_stub(t):
                continue
            large = t.data_type in _FLOATS and _numel(t) > DETACH_ABOVE
            if t.data_location == TensorProto.EXTERNAL:
                fields = _external_fields(t)
                path = base / fields["location"]
                if path not in maps:
                    maps[path] = store._mapped(path)
                offset = int(fields.get("offset", 0))
                length = int(fields.get("length", len(maps[path]) - offset))
                payload = memoryview(maps[path])[offset:offset + length]
                if large:
                    store._extents[store._stub(t, payload)] = _Extent(fields["location"], offset, length)
                    store._base_dir = base
                else:  # small: inline, so the graph alone is whole (biases, shapes, masks)
                    del t.external_data[:]
                    t.data_location = TensorProto.DEFAULT
                    t.raw_data = bytes(payload)
            elif not large:
                continue
            elif t.HasField("raw_data"):
                store.inside_bytes += len(t.raw_data)
                store._stub(t, t.raw_data)
            else:  # typed fields (float_data …): their little-endian bytes
                payload = numpy_helper.to_array(t).tobytes()
                store.inside_bytes += len(payload)
                store._stub(t, payload)
        return store

    def _raw(self, t: TensorProto) -> memoryview | bytes:
        """An initializer's little-endian bytes, stub or not (a join is made here)."""
        if not is_stub(t):
            return numpy_helper.to_array(t).tobytes()
        payload = self._data[_location(t)]
        if isinstance(payload, _Transposed):
            return memoryview(np.ascontiguousarray(self.value(payload.part).T).reshape(-1).view(np.uint8))
        if not isinstance(payload, _Concat):
            return payload
        joined = np.empty(payload.nbytes, np.uint8)
        at = 0
        for chunk in self._join_chunks(payload):
            joined[at:at + chunk.size] = chunk
            at += chunk.size
        return memoryview(joined)

    def _span(self, t: TensorProto, start: int, stop: int, into: np.ndarray) -> np.ndarray:
        """Bytes [start, stop) of an initializer's payload, in the front of the uint8 array
        `into`. A range of an external data file is read from the file: read through the map,
        its pages would stay in this process's resident size."""
        out = into[:stop - start]
        extent = self._extents.get(_location(t)) if is_stub(t) else None
        if extent is None:
            out[:] = np.frombuffer(self._raw(t), np.uint8)[start:stop]
            return out
        with open(self._base_dir / extent.location, "rb") as f:
            f.seek(extent.offset + start)
            if f.readinto(memoryview(out)) != out.size:
                raise OSError(f"{extent.location}: ends before {extent.offset + stop} bytes")
        return out

    def _join_chunks(self, join: _Concat) -> Iterator[np.ndarray]:
        """A join's payload in pieces of about _CHUNK bytes, each valid until the next is made
        (their buffers are reused): the parts are row-major, so rows [r, s) of the axes before
        the joined one are the same rows of every part, side by side."""
        outer = int(np.prod(join.parts[0].dims[:join.axis]))
        widths = [_numel(p) * helper.tensor_dtype_to_np_dtype(p.data_type).itemsize // max(outer, 1)
                  for p in join.parts]
        rows = min(outer, max(1, _CHUNK // max(sum(widths), 1)))
        chunk = np.empty((rows, sum(widths)), np.uint8)
        scratch = np.empty(rows * max(widths, default=0), np.uint8)
        for r in range(0, outer, rows):
            s = min(r + rows, outer)
            col = 0
            for p, w in zip(join.parts, widths):
                chunk[:s - r, col:col + w] = self._span(p, r * w, s * w, scratch).reshape(s - r, w)
                col += w
            yield chunk[:s - r].reshape(-1)

    def value(self, t: TensorProto) -> np.ndarray:
        """An initializer's value, stub or not."""
        if not is_stub(t):
            return numpy_helper.to_array(t)
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
        return np.frombuffer(self._raw(t), dtype=dtype).reshape(tuple(t.dims))

    def add(self, array: np.ndarray, name: str) -> TensorProto:
        """A new initializer of `array`: a stub when it is as large as a detached weight."""
        t = numpy_helper.from_array(array, name)
        if t.data_type in _FLOATS and _numel(t) > DETACH_ABOVE:
            self._stub(t, t.raw_data)
        return t

    def concat(self, tensors: Sequence[TensorProto], axis: int, name: str) -> TensorProto:
        """A new initializer `name`: `tensors` (initializers of one dtype and rank, stubs of
        this store or inline) joined along `axis`. When it is as large as a detached weight it
        is a stub whose payload is made only where it is read (`value`, `attach`, `save`), in
        chunks when saved; sessions join it themselves (`session_model`)."""
        axis = axis % len(tensors[0].dims)
        dims = list(tensors[0].dims)
        dims[axis] = sum(int(t.dims[axis]) for t in tensors)
        dtype = tensors[0].data_type
        if not (dtype in _FLOATS and int(np.prod(dims)) > DETACH_ABOVE):
            return numpy_helper.from_array(np.concatenate([self.value(t) for t in tensors], axis=axis), name)
        parts = []
        for t in tensors:
            part = TensorProto()
            part.CopyFrom(t)
            parts.append(part)
        nbytes = int(np.prod(dims)) * helper.tensor_dtype_to_np_dtype(dtype).itemsize
        out = TensorProto(name=name, data_type=dtype, dims=dims)
        self._stub(out, _Concat(tuple(parts), axis, nbytes))
        return out

    def transposed(self, t: TensorProto, name: str) -> TensorProto:
        """A new initializer `name`: the 2-D `t` (a stub of this store or inline) transposed.
        When it is as large as a detached weight it is a stub whose payload is made only where
        it is read (`value`, `attach`, `save`); sessions transpose it themselves."""
        dims = [int(d) for d in reversed(t.dims)]
        if not (t.data_type in _FLOATS and int(np.prod(dims)) > DETACH_ABOVE):
            return numpy_helper.from_array(np.ascontiguousarray(self.value(t).T), name)
        part = TensorProto()
        part.CopyFrom(t)
        out = TensorProto(name=name, data_type=t.data_type, dims=dims)
        self._stub(out, _Transposed(part, int(np.prod(dims)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize))
        return out

    def session_model(self, model: onnx.ModelProto, files: bool = True) -> onnx.ModelProto:
        """`model` as ONNX Runtime should read it, with `session_options`: each join is a Concat
        node of its parts, each transposed weight a Transpose of its source (run in the session;
        the store never makes them) and,
        with `files` (for a model given to ORT as bytes), stubs of payloads in external data
        files point at their file (ORT maps it: no copy in either process). Other stubs stay,
        for `session_options` to supply. `model` itself when there is nothing to change."""
        def changed(t: TensorProto) -> bool:
            return is_stub(t) and (isinstance(self._data[_location(t)], _Lazy) or
                                   (files and _location(t) in self._extents))

        if not any(changed(t) for t in model.graph.initializer):
            return model
        out = onnx.ModelProto()
        out.CopyFrom(model)
        keep, joins = [], []
        todo = list(out.graph.initializer)
        while todo:  # (a transposed join's part is a join itself)
            t = todo.pop(0)
            lazy = self._data[_location(t)] if is_stub(t) else None
            if not isinstance(lazy, _Lazy):
                keep.append(t)
                continue
            names = []
            for i, part in enumerate(lazy.parts if isinstance(lazy, _Concat) else (lazy.part,)):
                p = TensorProto()
                p.CopyFrom(part)
                p.name = f"{t.name}~part{i}"
                todo.append(p)
                names.append(p.name)
            joins.append(helper.make_node("Concat", names, [t.name], name=f"{t.name}{JOIN_SUFFIX}", axis=lazy.axis)
                         if isinstance(lazy, _Concat) else
                         helper.make_node("Transpose", names, [t.name], name=f"{t.name}{JOIN_SUFFIX}", perm=[1, 0]))
        for t in keep:
            if files and is_stub(t) and (extent := self._extents.get(_location(t))):
                _set_external(t, extent.location, extent.offset, extent.length)
        del out.graph.initializer[:]
        out.graph.initializer.extend(keep)
        if joins:  # ORT sorts the graph itself; first is simply where they belong
            nodes = joins + list(out.graph.node)
            del out.graph.node[:]
            out.graph.node.extend(nodes)
        return out

    @staticmethod
    def has_joins(model: onnx.ModelProto) -> bool:
        """Whether `model` (from `session_model`) makes joined weights with Concat nodes."""
        return any(n.op_type in ("Concat", "Transpose") and n.name.endswith(JOIN_SUFFIX) for n in model.graph.node)

    def session_options(self, model: onnx.ModelProto, options: Any = None) -> Any:
        """ONNX Runtime SessionOptions (`options`, or new ones) that supply the stubs of `model`
        (from `session_model`) from memory and name the folder of the external data files it
        points at. Raises ValueError for a model with joins still as stubs: ORT would read
        their payloads after the buffers made for it here were gone."""
        import onnxruntime as ort

        options = options or ort.SessionOptions()
        names, buffers = [], []
        for t in model.graph.initializer:
            if is_stub(t) and (loc := _location(t)) not in names:
                if isinstance(self._data[loc], _Lazy):
                    raise ValueError(f"initializer {t.name!r} is made on demand: pass the model through session_model")
                names.append(loc)
                buffers.append(self._data[loc])
        if names:
            options.add_external_initializers_from_files_in_memory(names, buffers, [len(b) for b in buffers])
        if self._base_dir is not None and any(
                t.data_location == TensorProto.EXTERNAL and not is_stub(t) for t in model.graph.initializer):
            options.add_session_config_entry(_FOLDER_KEY, str(self._base_dir))
        return options

    def attach(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of `model` with every stub's payload inside it again."""
        out = onnx.ModelProto()
        out.CopyFrom(model)
        for t in out.graph.initializer:
            if is_stub(t):
                data = bytes(self._raw(t))
                t.ClearField("external_data")
                t.data_location = TensorProto.DEFAULT
                t.raw_data = data
        return out

    def _write(self, f: Any, t: TensorProto) -> int:
        """Write a stub's payload to the unbuffered file `f`; returns its length. A range of an
        external data file is copied by the kernel (sendfile), a join a chunk at a time."""
        loc = _location(t)
        extent = self._extents.get(loc)
        if extent is not None and sys.platform.startswith("linux"):
            with open(self._base_dir / extent.location, "rb") as src:
                offset, left = extent.offset, extent.length
                while left:
                    n = os.sendfile(f.fileno(), src.fileno(), offset, left)
                    if n == 0:
                        raise OSError(f"{extent.location}: ends before {extent.offset + extent.length} bytes")
                    offset, left = offset + n, left - n
            return extent.length
        payload = self._data[loc]
        if isinstance(payload, _Concat):
            chunks: Iterator = self._join_chunks(payload)
        elif isinstance(payload, _Transposed):  # (one weight at a time: BERT's largest is 9.4 MB)
            chunks = iter((self._raw(t),))
        else:
            view = memoryview(payload).cast("B")
            chunks = (view[i:i + _CHUNK] for i in range(0, len(view), _CHUNK))
        return sum(_write_all(f, chunk) for chunk in chunks)

    def save(self, model: onnx.ModelProto, path: str | os.PathLike, external: bool) -> None:
        """Write `model` with its payloads to `path`: inside the file, or with `external` in
        `<name>.data` beside it, written tensor by tensor (no second copy in memory)."""
        path = Path(path)
        if not external:
            self._save_inline(model, path)
            return
        out = onnx.ModelProto()
        out.CopyFrom(model)
        data_name = path.name + ".data"
        offset = 0
        with open(path.parent / data_name, "wb", buffering=0) as f:
            for t in out.graph.initializer:
                if not is_stub(t):
                    continue
                pad = (-offset) % 4096  # aligned, as onnx's own writer does, so ORT can map them
                _write_all(f, b"\0" * pad)
                offset += pad
                length = self._write(f, t)
                _set_external(t, data_name, offset, length)
                offset += length
        onnx.save(out, str(path))

    def _save_inline(self, model: onnx.ModelProto, path: Path) -> None:
        """Write `model` with every payload inside, as one protobuf file, without a copy of it
        in memory: protobuf's encoding of a message is the concatenation of its fields' encodings,
        in any order, so the model without its graph, then the graph without its initializers,
        then each initializer in its order (a stub as its tensor header plus its `raw_data`,
        copied a chunk at a time) make the same model that `attach` + `onnx.save` would write.
        (Qwen2-0.5B's 1.98 GB: attach and SerializeToString held it twice, 5.9 GB at the peak.)"""
        graph = onnx.GraphProto()
        graph.CopyFrom(model.graph)
        del graph.initializer[:]
        head = onnx.ModelProto()
        head.CopyFrom(model)
        head.ClearField("graph")
        # (encoded tensor or its header, stub, its payload's bytes)
        pieces: list[tuple[bytes, TensorProto | None, int]] = []
        for t in model.graph.initializer:
            if not is_stub(t):
                pieces.append((t.SerializeToString(), None, 0))
                continue
            header = TensorProto()
            header.CopyFrom(t)
            header.ClearField("external_data")
            header.data_location = TensorProto.DEFAULT
            pieces.append((header.SerializeToString(), t, _payload_size(self._data[_location(t)])))
        sizes = [len(encoded) + (wire.field_size(wire.TENSOR_RAW_DATA, n) if stub is not None else 0)
                 for encoded, stub, n in pieces]
        graph_bytes = graph.SerializeToString()
        graph_size = len(graph_bytes) + sum(wire.field_size(wire.GRAPH_INITIALIZER, n) for n in sizes)
        with open(path, "wb", buffering=0) as f:
            _write_all(f, head.SerializeToString())
            _write_all(f, wire.key(wire.MODEL_GRAPH) + wire.varint(graph_size))
            _write_all(f, graph_bytes)
            for (encoded, stub, n), size in zip(pieces, sizes):
                _write_all(f, wire.key(wire.GRAPH_INITIALIZER) + wire.varint(size) + encoded)
                if stub is not None:
                    _write_all(f, wire.key(wire.TENSOR_RAW_DATA) + wire.varint(n))
                    if self._write(f, stub) != n:
                        raise OSError(f"{stub.name}: its payload is not {n} bytes long")

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
