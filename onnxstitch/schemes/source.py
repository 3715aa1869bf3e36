"""What every kernel scheme hands on (docs/architecture.md): a `KernelSource` — the generated
CUDA C++ of one group, the facts common to every fused node (inputs, outputs, their kinds and
dtypes, folded Slices and Concat windows) and a typed `Spec` of the scheme's own launch facts —
and the pieces of the kernel contract (docs/abi.md) all schemes print: the `StitchArgs`
struct, element loads and stores, baked scalars, naming kernels after their code.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import onnx
from typing import ClassVar

from onnx import TensorProto as TP

from .. import ops
from ..folds import concats, slices
from ..graph import MAX_INPUTS, MAX_OUTPUTS, MAX_RANK, FusionGraph, constant_value

FULL, BROADCAST = 0, 1
HELPER_PREFIX = "onnxstitch~"


@dataclass(frozen=True)
class Spec:
    """A scheme's launch facts for one kernel (subclassed by each scheme, with named fields):
    which scheme made it, the shape rule the runtime applies, the entries the image exports."""

    scheme: ClassVar[str] = ""
    shape_rule: ClassVar[str] = ""
    entry_suffixes: ClassVar[tuple[str, ...]] = ()

    @property
    def builds_own_image(self) -> bool:
        """Whether the kernel's source is built by the scheme itself (`build_image`), not NVRTC:
        the gemm scheme's generated GEMMs, shared objects built by nvcc."""
        return False

    def build_image(self, source: str, name: str, cache: Path) -> tuple[str, bytes]:
        """(its target, e.g. "sm_90a"; the image) of `source`, cached under `cache`."""
        raise NotImplementedError(f"{type(self).__name__} builds no image of its own")


@dataclass(frozen=True)
class KernelSource:
    """Generated CUDA C++ for one group and the facts the fused node's attributes need."""

    name: str
    source: str
    vec_width: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    input_kinds: tuple[int, ...]
    output_dtypes: tuple[int, ...]
    spec: Spec
    # Per input: the box of its source it reads (a folded Slice/Split, slices.py), None when whole.
    input_boxes: tuple[slices.Box | None, ...] = ()
    # Per input: the Concat window it is read in (concats.py), None when read unshifted.
    input_windows: tuple[concats.Window | None, ...] = ()
    # The fused function's body when the scheme writes it itself (an attention chain reading
    # un-expanded K and V or applying its causal mask); empty: the group's nodes (rewrite.py).
    fallback: tuple[onnx.NodeProto, ...] = ()
    # Nodes the scheme puts before the group's own nodes in the fused function, whose outputs
    # those nodes read (a weight the kernel reads transposed, transposed back); named
    # HELPER_PREFIX + …: the scheme's, not the model's.
    fallback_before: tuple[onnx.NodeProto, ...] = ()
    # Constants the fused node reads that the model did not have (a conv chain's weights with its
    # BatchNormalization folded in): the rewrite adds them as initializers.
    constants: tuple[onnx.TensorProto, ...] = ()

    @property
    def scheme(self) -> str:
        return self.spec.scheme

    @property
    def shape_rule(self) -> str:
        return self.spec.shape_rule

    @property
    def bound_inputs(self) -> tuple[str, ...]:
        """The tensors the fused node takes: a boxed input's source in its place."""
        boxes = self.input_boxes or (None,) * len(self.inputs)
        return tuple(b.source if b is not None else t for t, b in zip(self.inputs, boxes))

    @property
    def entries(self) -> tuple[str, ...]:
        return tuple(self.name + s for s in self.spec.entry_suffixes)


# Kernels are generated under this name, then renamed after their code (named_by_code).
PLACEHOLDER = "stitch_KERNEL"
_COMMENT = re.compile(r"//[^\n]*")


def code_of(source: str) -> str:
    """The compiled content of a kernel source: comments (tensor names, group names) aside."""
    return _COMMENT.sub("", source)


def named_by_code(src: KernelSource) -> KernelSource:
    """`src` (generated as PLACEHOLDER) renamed after a hash of its code, so groups with the same
    code (the same layer repeated) share one name, one compilation and one cache entry. A
    library call (no code: the gemm scheme) keeps the name its scheme gave it."""
    if not src.source:
        return src
    name = "stitch_" + hashlib.sha256(code_of(src.source).encode()).hexdigest()[:16]
    return dataclasses.replace(src, name=name, source=src.source.replace(PLACEHOLDER, name))


ARGS_STRUCT = f"""
#define STITCH_MAX_RANK {MAX_RANK}
#define STITCH_MAX_IN {MAX_INPUTS}
#define STITCH_MAX_OUT {MAX_OUTPUTS}
struct StitchArgs {{
  const void* in[STITCH_MAX_IN];
  void* out[STITCH_MAX_OUT];
  long long n;
  int rank;
  int pad_;
  long long dims[STITCH_MAX_RANK];
  long long strides[STITCH_MAX_IN][STITCH_MAX_RANK];
}};
template <int N, typename T> struct alignas(sizeof(T) * N) StitchVec {{ T v[N]; }};
// Element j of a held vector of halves, read through the 32-bit word holding it: converting
// it then selects its half of the word, where reading the 16-bit element first costs a byte
// permute per element to unpack the vector (float16 Softmax: ~15% of its instructions).
template <int N> __device__ __forceinline__ unsigned short stitch_half_at(const StitchVec<N, unsigned short>& x, int j) {{
  if constexpr (N % 2 == 0) {{
    unsigned int w;
    memcpy(&w, &x.v[j & ~1], sizeof(w));
    return (unsigned short)((j & 1) ? w >> 16 : w);
  }} else {{
    return x.v[j];
  }}
}}
"""


# An element of a vector held in registers: `in0.v[e]`, `xr1[i].v[jj]`.
_HELD = re.compile(r"^(.+)\.v\[(\w+)\]$")


def load_expr(dtype: int, raw: str) -> str:
    ctype = ops.CTYPES[dtype][1]
    if dtype in (TP.FLOAT16, TP.BFLOAT16):
        fn = "stitch_h2f" if dtype == TP.FLOAT16 else "stitch_bf2f"
        held = _HELD.match(raw)
        return f"{fn}(stitch_half_at({held[1]}, {held[2]}))" if held else f"{fn}({raw})"
    return raw if ops.CTYPES[dtype][0] == ctype else f"(({ctype}){raw})"


def store_expr(dtype: int, value: str) -> str:
    if dtype == TP.FLOAT16:
        return f"stitch_f2h({value})"
    if dtype == TP.BFLOAT16:
        return f"stitch_f2bf({value})"
    return f"(({ops.CTYPES[dtype][0]})({value}))"


def baked_arg(graph: FusionGraph, tensor: str) -> ops.Arg:
    """A baked scalar constant as a literal operand in its compute type."""
    d = graph.tensors[tensor].dtype
    ct = ops.CTYPES[d][1]
    value = constant_value(graph, tensor).item()
    return ops.Arg(ops.literal(value, ct), ct, d, float(value) if ct in ("float", "double") else None)




def half_only(graph: FusionGraph, nodes: tuple[int, ...], inputs: tuple[str, ...]) -> bool:
    tensors = set(inputs) | {t for i in nodes for t in graph.nodes[i].outputs if t}
    floats = {graph.tensors[t].dtype for t in tensors} & ops.FLOATS
    return bool(floats) and floats <= {TP.FLOAT16, TP.BFLOAT16}


