"""onnx.proto's protobuf wire format where onnxstitch handles it itself: reading a model file
without copying its weights (the walk below), and the encoding a streamed write of a model uses
(weights.Weights._save_inline: `key`, `varint`, `field_size`).

`onnx.load` copies every weight into the parsed message's memory, and the message keeps that
memory until it is dropped whole (clearing a field returns nothing), so a model whose weights are
inside its file was held twice: BERT-base's 440 MB of weights took 0.86 GB after loading. Here
the file is mapped, the bytes of ModelProto → GraphProto → each TensorProto initializer are
walked (tags and lengths only: a few thousand fields), and the message is parsed from a copy of
the file with the large `raw_data` fields cut out; their payloads stay views of the map.

Only the main graph's initializers are cut (subgraphs' are small and stay inline). Anything the
walk does not expect (a group, a truncated field) makes `read` answer None, and the caller reads
the file as onnx does.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import onnx

# Field numbers (onnx.proto): ModelProto.graph, GraphProto.initializer, TensorProto.raw_data; all
# length-delimited.
MODEL_GRAPH, GRAPH_INITIALIZER, TENSOR_RAW_DATA = 7, 5, 9
# Payloads under this many bytes stay in the message: cutting them saves nothing worth a view.
CUT_FROM = 4096
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class _Unexpected(Exception):
    """The bytes are not what the walk reads (left to onnx.load to report)."""


@dataclass(frozen=True)
class Mapped:
    """A model parsed without its large raw payloads, and those payloads: by the index of their
    initializer in the main graph, views of `mapping` (which the views keep open), and where
    each lies in the file (`offsets`, bytes from its start: ONNX Runtime can map them there)."""

    model: onnx.ModelProto
    payloads: dict[int, memoryview]
    mapping: mmap.mmap
    offsets: dict[int, int]


def _read_varint(buf, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(buf) or shift > 63:
            raise _Unexpected("a varint runs past the end")
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, at
        shift += 7


def _fields(buf, start: int, end: int):
    """(field number, wire type, start of the field's tag, start of its payload, its end) of each
    field in buf[start:end]."""
    at = start
    while at < end:
        tag_at = at
        tag, at = _read_varint(buf, at)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            _, after = _read_varint(buf, at)
        elif wire == _FIXED64:
            after = at + 8
        elif wire == _FIXED32:
            after = at + 4
        elif wire == _LENGTH:
            length, at = _read_varint(buf, at)
            after = at + length
        else:
            raise _Unexpected(f"wire type {wire}")
        if after > end:
            raise _Unexpected("a field runs past its message")
        yield number, wire, tag_at, at, after
        at = after


def varint(n: int) -> bytes:
    """`n` as a protobuf varint."""
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def key(field: int) -> bytes:
    """The tag of length-delimited field `field` (every field this module cuts or writes)."""
    return varint(field << 3 | _LENGTH)


def field_size(field: int, length: int) -> int:
    """Encoded bytes of a length-delimited field holding `length` bytes."""
    return len(key(field)) + len(varint(length)) + length


def _tensor(buf, start: int, end: int, index: int, payloads: dict[int, memoryview], view,
            offsets: dict[int, int]) -> bytes:
    """A TensorProto's bytes without a large raw_data (its payload kept as a view)."""
    parts, cut, raw = [], False, 0
    for number, wire, tag_at, at, after in _fields(buf, start, end):
        raw += number == TENSOR_RAW_DATA
        if raw > 1:  # (protobuf keeps the last of several: not worth reading here)
            raise _Unexpected("a tensor with raw_data twice")
        if number == TENSOR_RAW_DATA and wire == _LENGTH and after - at >= CUT_FROM:
            payloads[index] = view[at:after]
            offsets[index] = at
            cut = True
            continue
        parts.append(bytes(buf[tag_at:after]))
    return b"".join(parts) if cut else bytes(buf[start:end])


def _graph(buf, start: int, end: int, payloads: dict[int, memoryview], view, offsets: dict[int, int]) -> bytes:
    parts, index = [], 0
    for number, wire, tag_at, at, after in _fields(buf, start, end):
        if number == GRAPH_INITIALIZER and wire == _LENGTH:
            body = _tensor(buf, at, after, index, payloads, view, offsets)
            parts.append(key(GRAPH_INITIALIZER) + varint(len(body)) + body)
            index += 1
        else:
            parts.append(bytes(buf[tag_at:after]))
    return b"".join(parts)


def read(path: Path) -> Mapped | None:
    """The model at `path` with its large raw payloads left in the file's map, or None where
    the file is not one the walk reads (onnx.load then reads it and says what is wrong)."""
    try:
        with open(path, "rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # (an empty file cannot be mapped)
        return None
    view = memoryview(mapping)
    payloads: dict[int, memoryview] = {}
    offsets: dict[int, int] = {}
    try:
        parts, graphs = [], 0
        for number, wire, tag_at, at, after in _fields(mapping, 0, len(mapping)):
            if number == MODEL_GRAPH and wire == _LENGTH:
                graphs += 1
                if graphs > 1:  # (protobuf would merge them: their initializers' order is its own)
                    raise _Unexpected("a model with its graph twice")
                body = _graph(mapping, at, after, payloads, view, offsets)
                parts.append(key(MODEL_GRAPH) + varint(len(body)) + body)
            else:
                parts.append(bytes(mapping[tag_at:after]))
        model = onnx.ModelProto.FromString(b"".join(parts))
    except Exception:  # any doubt (not a model, a walk this does not read): onnx.load reads it
        for v in payloads.values():
            v.release()
        view.release()
        mapping.close()
        return None
    return Mapped(model, payloads, mapping, offsets)
