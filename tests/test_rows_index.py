"""The row kernels' per-row offsets of broadcast inputs, run on the host: the generated C for
the current row (between the `// row offsets` markers) is compiled with g++ around a
StitchArgs-like struct holding the runtime dims and numpy's broadcast strides, and every row's
offsets must equal numpy's: the offset, in the input, of the row's first element."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from onnxstitch import ops, plan
from onnxstitch.pipeline import generate_kernel

from .row_models import channel_models, row_models, trailing_models
from .stitching import prepared

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _cases():
    for name, model, _ in row_models(3, 16):
        if name.startswith(("Softmax", "LogSoftmax", "LayerNormalization")):
            yield name, model
    for name, model, _ in list(trailing_models(16)) + list(channel_models(16)):
        if name != "BatchNormalization":  # elementwise at inference: no row kernel
            yield name, model


CASES = list(_cases())


def _offset_code(source: str) -> str:
    start = source.index("// row offsets")
    return source[source.index("\n", start) + 1:source.index("// end row offsets", start)]


def _host_offsets(code: str, dims: tuple[int, ...], strides: dict[int, tuple[int, ...]], rows: int,
                  tmp_path) -> dict[int, list[int]]:
    ks = sorted({int(k) for k in re.findall(r"\bro(\d+)\b", code)})
    fill = "".join(f"a.dims[{d}] = {n};" for d, n in enumerate(dims))
    fill += "".join(f"a.strides[{k}][{d}] = {s};" for k, st in strides.items() for d, s in enumerate(st))
    prints = " ".join(f'std::printf("%lld ", (long long)ro{k});' for k in ks)
    src = f"""#include <cstdio>
typedef long long I;
struct Args {{ long long dims[8]; long long strides[32][8]; }};
int main() {{
  Args a = {{}}; {fill}
  for (I row = 0; row < {rows}; ++row) {{
    const bool active = true;
{code}
    {prints} std::printf("\\n");
  }}
}}
"""
    (tmp_path / "offsets.cc").write_text(src)
    exe = tmp_path / "offsets"
    subprocess.run(["g++", "-O1", "-o", str(exe), str(tmp_path / "offsets.cc")], check=True)
    out = [list(map(int, line.split())) for line in subprocess.run([str(exe)], check=True, capture_output=True,
                                                                   text=True).stdout.splitlines()]
    return {k: [r[j] for r in out] for j, k in enumerate(ks)}


@pytest.mark.parametrize("name,model", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("batch", [1, 3])
def test_row_offsets_match_numpy_broadcasting(name, model, batch, tmp_path) -> None:
    _, g = prepared(model)
    groups = [grp for grp in plan.make_plan(g).groups if any(g.nodes[i].kind == ops.OpKind.REDUCE
                                                             for i in grp.nodes)]
    assert groups, name
    for grp in groups:
        src = generate_kernel(g, "k", grp)
        if "// row offsets" not in src.source:
            continue  # no input moves with the row
        shape = tuple(batch if isinstance(d, str) else d for d in g.iteration_shape(frozenset(grp.nodes)))
        lead = shape[:len(shape) - src.spec.row_axes]
        strides, want = {}, {}
        for k, t in enumerate(src.inputs):
            s = tuple(batch if isinstance(d, str) else d for d in g.tensors[t].shape)
            b = np.broadcast_to(np.arange(int(np.prod(s)), dtype=np.int64).reshape(s), shape)
            strides[k] = tuple(x // 8 for x in b.strides)
            want[k] = [int(b[np.unravel_index(r, lead) + (0,) * src.spec.row_axes]) for r in range(int(np.prod(lead)))]
        got = _host_offsets(_offset_code(src.source), shape, strides, int(np.prod(lead)), tmp_path)
        assert got, name
        for k, offs in got.items():
            assert offs == want[k], f"{name}: input {src.inputs[k]} ({g.tensors[src.inputs[k]].shape})"


def test_the_mask_costs_one_division_per_row() -> None:
    _, model = next((n, m) for n, m in CASES if n == "Softmax")
    _, g = prepared(model)
    (grp,) = plan.make_plan(g).groups
    code = _offset_code(generate_kernel(g, "k", grp).source)
    assert code.count("/") + code.count("%") == 1, code
