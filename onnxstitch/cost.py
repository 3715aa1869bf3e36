"""The cost model the plan minimises: every kernel costs one launch plus its memory traffic.

Memory-bound kernels are priced by the roofline's memory side only: the bytes a kernel must
move (each boundary tensor read or written once, or once per pass for a row kernel whose rows
do not fit its registers) over the measured device-to-device copy bandwidth, plus one host
launch. DESIGN.md's anchors: a launch from the host costs about
4–5 µs; a device-to-device copy moves about 2.85 TB/s on H100 and 3.96 TB/s on H200
(read + write counted). Small tensors are launch-bound, large ones bandwidth-bound, so both
terms are needed.

Nodes left to ONNX Runtime (unfused fusible nodes, and opaque nodes such as MatMul) are priced
the same way from their own inputs and outputs. For opaque nodes that underestimates compute,
but their cost is the same in every plan, so it never changes the choice. The exceptions are
ops whose ORT kernel was measured well below the bandwidth (ORT_BANDWIDTH_SHARE: LayerNorm),
priced at that share.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from . import ops
from .graph import FusionGraph
from .shapes import dtype_size
from . import rowplan as rows

H100_BANDWIDTH_GBS = 2850.0  # measured device-to-device copy, read + write (DESIGN.md)
H200_BANDWIDTH_GBS = 4090.0  # measured by scripts/bench_elementwise.py, 2026-11-22 (DESIGN.md: 3960)
# One kernel launched from the host, outside a CUDA graph. scripts/bench_elementwise.py
# measured stock ORT at 4.9 µs per small elementwise node on H200 (2026-11-22).
HOST_LAUNCH_US = 4.5


@dataclass(frozen=True)
class CostModel:
    """Predicted time of a memory-bound kernel: `launch_us + bytes / bandwidth`.

    Defaults are the H100 anchors; use `CostModel(bandwidth_gbs=H200_BANDWIDTH_GBS)` for H200.
    """

    launch_us: float = HOST_LAUNCH_US
    bandwidth_gbs: float = H100_BANDWIDTH_GBS
    # Price the layout changes at a conv group's NCHW ends (schemes/conv): off, every legal
    # convolution chain is planned as a conv group whatever its neighbours (the tests' setting).
    layout_changes: bool = True
    # Price a column reduction at the share of the bandwidth its columns reach (rows.column_share):
    # off, at the full bandwidth (tests that exercise column kernels on small shapes).
    column_share: bool = True
    # Groups measured on the GPU (measure.py), by `node_key`: their price in this model's units,
    # the sum of their nodes' prices scaled by the measured ratio of the kernel to ORT's nodes,
    # so the plan weighs them as the GPU did (pipeline.py plans again with them).
    measured: Mapping[frozenset[str], float] = field(default_factory=dict)

    def kernel_us(self, nbytes: int) -> float:
        """Microseconds for one kernel moving `nbytes` (1 GB/s = 1e3 bytes/µs)."""
        return self.launch_us + nbytes / (self.bandwidth_gbs * 1e3)


def _sum_bytes(graph: FusionGraph, tensors: Iterable[str]) -> int:
    return sum(graph.tensor_bytes(t) for t in dict.fromkeys(tensors) if t)


def group_bytes(graph: FusionGraph, group: frozenset[int] | set[int]) -> int:
    """Bytes a fused kernel moves: its boundary inputs and outputs, each once. Internal
    tensors stay in registers; baked scalars are literals and cost nothing. The rows scheme's
    loop path (a row longer than the registers hold) reads its per-element inputs once per
    pass (rows.loop_passes) instead."""
    ins, outs = graph.boundary(group)
    moved = _sum_bytes(graph, ins + outs)
    if not rows.has_rows(graph, group):
        return moved
    plan = rows.row_plan(graph, frozenset(group))
    if plan.in_registers:
        return moved
    per_element = [t for t in ins if graph.tensors[t].shape == plan.shape]
    return moved + (rows.loop_passes(graph, frozenset(group)) - 1) * _sum_bytes(graph, per_element)


def _relabels(graph: FusionGraph, node: int) -> bool:
    """A reshape-like op: ONNX Runtime runs it by relabelling the buffer, no kernel, no bytes."""
    n = graph.nodes[node]
    return n.op_type in ops.RESHAPES and n.domain in ("", "ai.onnx")


def node_bytes(graph: FusionGraph, node: int) -> int:
    """Bytes one node moves when ONNX Runtime runs it alone: all its inputs and outputs; a row
    reduction over rows too long for registers once per pass, as a row kernel of its own
    would (ORT's long-row Softmax and LayerNorm also read the row more than once)."""
    n = graph.nodes[node]
    if _relabels(graph, node):
        return 0
    if n.kind == ops.OpKind.REDUCE and n.fusible:
        return group_bytes(graph, frozenset({node}))
    return _sum_bytes(graph, n.inputs + n.outputs)


def node_key(graph: FusionGraph, nodes: Iterable[int]) -> frozenset[str]:
    """A node set by what its nodes write: the same on every build of the same model's graph."""
    return frozenset(t for i in nodes for t in graph.nodes[i].outputs if t)


def group_us(graph: FusionGraph, cost: CostModel, group: frozenset[int] | set[int]) -> float:
    """Predicted time of one fused kernel over `group`: its bytes at the bandwidth the kernel
    can reach (a column reduction over few columns reaches a share of it: rows.column_share)."""
    if cost.measured:
        priced = cost.measured.get(node_key(graph, group))
        if priced is not None:
            return priced
    nbytes = group_bytes(graph, group)
    if cost.column_share and rows.has_rows(graph, group):
        plan = rows.row_plan(graph, frozenset(group))
        ins, outs = graph.boundary(frozenset(group))
        widest = max([dtype_size(graph.tensors[t].dtype) for t in ins + outs if graph.tensors[t].shape == plan.shape]
                     or [4])
        nbytes = int(nbytes / rows.column_share(plan, widest))
    return cost.kernel_us(nbytes)


# A reshape-like node left to ONNX Runtime launches nothing but is still dispatched on the host.
RELABEL_US = 0.5

# Ops whose CUDA kernel in ONNX Runtime moves its bytes at a fraction of the copy bandwidth that
# the roofline assumes. LayerNormalization (cuApplyLayerNorm) over BERT-base's [1024, 768] float32
# rows took 6.8 µs in a CUDA graph where the rows kernel doing a bias, a residual and the same
# LayerNorm (twice its bytes) took 4.2 µs (H200, bench/results/nvidia-h200/bert-timeline): about
# 0.3 of the bandwidth. Without it the plan saw a lone LayerNormalization as free to leave to ORT
# and left one per BERT layer there, 31 µs of the run.
ORT_BANDWIDTH_SHARE = {"LayerNormalization": 0.3}
# BatchNormalization over inputs with no spatial extent ([N, C], or every dim after C of size 1:
# BatchNorm1d after a Linear) runs as cuDNN's per-channel inference kernel for N×C×1×1
# (bn_fw_inf_1C11_kernel_NCHW), which walks the N rows of a channel one after another: LeViT-128S
# at batch 8 ([392..1568, 128..384] float32) spent 6.46 ms in 58 of them on an H200, 111 µs each
# for about 1 MB, against 7.3 ms for the whole model (bench/results/nvidia-h200/wave3m). A share
# of 0.01 is several times what was measured; the gate's timing of each group decides the rest.
ORT_FLAT_BATCHNORM_SHARE = 0.01


def node_us(graph: FusionGraph, cost: CostModel, node: int) -> float:
    """Predicted time of a node left as it is (one launch of its own; for the reshape-like
    ops, which ONNX Runtime runs by relabelling the buffer, only a host dispatch; for the ops of
    ORT_BANDWIDTH_SHARE, their bytes at that share of the bandwidth)."""
    if _relabels(graph, node):
        return RELABEL_US
    return cost.kernel_us(int(node_bytes(graph, node) / ort_share(graph, node)))


def ort_share(graph: FusionGraph, node: int) -> float:
    """The share of the bandwidth ORT's kernel for `node` reaches: ORT_BANDWIDTH_SHARE's for its
    op, else 1 (the roofline)."""
    n = graph.nodes[node]
    if n.domain not in ("", "ai.onnx"):
        return 1.0
    if n.op_type == "BatchNormalization" and _flat(graph, n.inputs[0]):
        return ORT_FLAT_BATCHNORM_SHARE
    return ORT_BANDWIDTH_SHARE.get(n.op_type, 1.0)


def _flat(graph: FusionGraph, tensor: str) -> bool:
    """Whether `tensor` ([N, C, ...]) has no spatial extent: rank 2, or every dim after C 1."""
    info = graph.tensors.get(tensor)
    shape = info.shape if info is not None else None
    return shape is not None and len(shape) >= 2 and all(d == 1 for d in shape[2:])
