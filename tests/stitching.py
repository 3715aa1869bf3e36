"""Test helpers: fuse chosen node groups without the planner, and compare runs."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx

from onnxstitch import compile as nvrtc, graph as graph_mod, load, normalize, rewrite, shapes, sizes
from onnxstitch.cost import CostModel
from onnxstitch.pipeline import generate_kernel
from onnxstitch.plan import make_group

from models.tolerances import chain_tolerance, tolerance  # noqa: F401 (the tests' names for them)


# The seeds fresh_seed drew in the running test: a failure reports them (conftest.py), and
# ONNXSTITCH_SEED=<seed> replays one.
SEEDS: list[int] = []


def fresh_seed() -> int:
    """A new seed per run, so numerical tests see fresh random inputs each time; a failing test
    prints the seeds it drew, and ONNXSTITCH_SEED set to one of them makes every draw that seed."""
    import os

    seed = int(os.environ.get("ONNXSTITCH_SEED") or np.random.SeedSequence().entropy % 2**31)
    SEEDS.append(seed)
    return seed


def prepared(model: onnx.ModelProto, reductions: bool = True,
             archs: Sequence[str] = nvrtc.DEFAULT_ARCHS) -> tuple[onnx.ModelProto, graph_mod.FusionGraph]:
    """The normalized model and its FusionGraph, as the pipeline builds them for `archs`."""
    m = load.constants_to_initializers(load.load(model))
    _, infos = shapes.infer(m)
    if reductions:
        normal = normalize.normalize(m, infos)
        m, infos = normal.model, normal.tensors
    clusters = any(nvrtc.arch_number(a) >= 90 for a in archs)
    return m, graph_mod.build(m, infos, reductions=reductions, clusters=clusters)


def stitch_nodes(model: onnx.ModelProto, groups: Sequence[Sequence[int]],
                 archs: Sequence[str] = nvrtc.DEFAULT_ARCHS) -> onnx.ModelProto:
    """Rewrite `model` with the given node groups fused (single nodes allowed), bypassing the
    planner, so every op's kernel can be exercised on its own."""
    m, g = prepared(model, reductions=True)
    srcs = [generate_kernel(g, f"stitch_t{i}", make_group(g, CostModel(), f"t{i}", tuple(grp))) for i, grp in enumerate(groups)]
    kernels = nvrtc.compile_all(srcs, archs)
    return rewrite.rewrite(m, g, [rewrite.FusedGroup(f"t{i}", tuple(grp), k)
                                  for i, (grp, k) in enumerate(zip(groups, kernels))])


def assert_close(actual: np.ndarray, expected: np.ndarray, what: str = "") -> None:
    """Dtype-aware comparison; NaN must match NaN, shapes and dtypes must match exactly."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    rtol, atol = tolerance(expected.dtype)
    if expected.dtype.kind in "fc" or expected.dtype.name == "bfloat16":
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol,
                                   equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


def as_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same float16 model in float32 (inputs, outputs, value_info, initializers): the
    reference for half-precision kernels, which compute in float32."""
    from onnx import TensorProto, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT16:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT
    for i, init in enumerate(m.graph.initializer):
        if init.data_type == TensorProto.FLOAT16:
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name))
    return m


def assert_matches_reference(got: np.ndarray, expected: np.ndarray, half: bool, what: str) -> None:
    """A kernel's output (poisoned before the run) against an independent float64 reference:
    same shape, integers and booleans exactly, every element written (finite), values within
    1e-5 relative norm error in float32 and 1e-2 in float16/bfloat16."""
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    if expected.dtype.kind in "iub":
        np.testing.assert_array_equal(got, expected, err_msg=what)
        return
    g64, e64 = got.astype(np.float64), expected.astype(np.float64)
    assert np.isfinite(g64).all(), f"{what}: unwritten (NaN) elements"
    tol = 1e-2 if half else 1e-5
    err = np.linalg.norm(g64 - e64) / max(np.linalg.norm(e64), 1e-30)
    assert err <= tol, f"{what}: relative error {err:.2e} > {tol}"


def assert_one_kernel_on_cpu(model: onnx.ModelProto, ref, plan: dict, run: dict, what: str) -> None:
    """`model` optimizes into a single FusedKernel node, and the stitched model run on ORT CPU
    (its fallback function) matches `ref` (float64 numpy) on fresh random inputs at `run`."""
    import onnxstitch
    from models.fuzz import run_cpu
    from onnxstitch.inputs import random_feeds

    res = onnxstitch.optimize(model, shapes=sizes.applicable(model, plan), archs=("sm_90",))
    assert [n.op_type for n in res.model.graph.node] == ["FusedKernel"], [n.op_type for n in res.model.graph.node]
    feeds = random_feeds(model, seed=fresh_seed(), dim_values=run)
    for g, e in zip(run_cpu(res.model, feeds), ref(feeds)):
        assert_close(g, e.astype(g.dtype), what)


def single_kernel_attrs(model: onnx.ModelProto) -> dict:
    """The inputs and attributes of a stitched model's one node (a single FusedKernel)."""
    (fused,) = model.graph.node
    return {"inputs": list(fused.input), **{a.name: onnx.helper.get_attribute_value(a) for a in fused.attribute}}
