"""The runtime's launch arithmetic for attention kernels (runtime/csrc/attention.h's
AttentionDims, the code ComputeAttention runs), compiled with g++ and called through ctypes:
dims [B, H, Sq, Sk] and each mask's element strides, against numpy's own broadcasting of the
mask to the scores (an independent computation), and its refusals."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from onnxstitch import runtime

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

DRIVER = r"""
#include "attention.h"
extern "C" int attention_dims(const long long* spec, const long long* shapes, const long long* ranks, long long n_in,
                              long long* dims, long long* strides, char* error, int error_size) {
  onnxstitch::AttentionSpec s;
  std::string why;
  std::vector<int64_t> a(spec, spec + 6);
  if (!onnxstitch::ParseAttention(a, &s, &why)) { snprintf(error, error_size, "%s", why.c_str()); return 0; }
  int64_t sh[8][STITCH_MAX_RANK];
  size_t rk[8];
  for (long long i = 0; i < n_in; ++i) {
    rk[i] = static_cast<size_t>(ranks[i]);
    for (int j = 0; j < STITCH_MAX_RANK; ++j) sh[i][j] = shapes[i * STITCH_MAX_RANK + j];
  }
  long long ms[onnxstitch::kMaxMasks][4];
  if (!onnxstitch::AttentionDims(s, sh, rk, static_cast<size_t>(n_in), dims, ms, &why)) {
    snprintf(error, error_size, "%s", why.c_str());
    return 0;
  }
  for (int k = 0; k < s.masks; ++k) for (int d = 0; d < 4; ++d) strides[k * 4 + d] = ms[k][d];
  return 1;
}
"""


@pytest.fixture(scope="module")
def dims_lib(tmp_path_factory) -> ctypes.CDLL:
    folder = tmp_path_factory.mktemp("attention-dims")
    src = folder / "driver.cc"
    src.write_text(DRIVER)
    csrc = Path(runtime.__file__).parent / "csrc"
    lib = folder / "driver.so"
    subprocess.run(["g++", "-std=c++17", "-O1", "-fPIC", "-shared", f"-I{csrc}", "-include", "cstdio", "-o", str(lib),
                    str(src)], check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(lib))


def call(lib: ctypes.CDLL, head: int, shapes: list[tuple[int, ...]], transposed: bool = False):
    masks = len(shapes) - 3
    spec = (ctypes.c_longlong * 6)(head, 64, 128, 0, masks, int(transposed))
    flat = (ctypes.c_longlong * (8 * len(shapes)))()
    for i, sh in enumerate(shapes):
        for j, v in enumerate(sh):
            flat[i * 8 + j] = v
    ranks = (ctypes.c_longlong * len(shapes))(*[len(sh) for sh in shapes])
    dims, strides = (ctypes.c_longlong * 4)(), (ctypes.c_longlong * 8)()
    error = ctypes.create_string_buffer(512)
    ok = lib.attention_dims(spec, flat, ranks, len(shapes), dims, strides, error, 512)
    return bool(ok), tuple(dims), [tuple(strides[k * 4:(k + 1) * 4]) for k in range(masks)], error.value.decode()


@pytest.mark.parametrize("lead,sq,sk,masks", [
    ((8, 12), 128, 128, [(8, 1, 1, 128)]),
    ((8, 12), 128, 128, [(8, 1, 128, 128)]),
    ((2, 4), 70, 70, [(1, 4, 70, 70), (2, 1, 1, 70)]),  # T5: position bias, then the mask
    ((2, 3), 5, 130, [(130,), (5, 1)]),
    ((6,), 33, 65, [(6, 33, 65), (1, 65)]),  # rank 3: B = 1, H = 6
    ((2, 2), 9, 9, [()]),  # a scalar term
])
def test_dims_and_mask_strides_match_numpy_broadcasting(dims_lib, lead, sq, sk, masks) -> None:
    d = 16
    ok, dims, strides, why = call(dims_lib, d, [(*lead, sq, d), (*lead, d, sk), (*lead, sk, d), *masks])
    assert ok, why
    scores = (*lead, sq, sk)
    want_dims = ((1,) + scores) if len(lead) == 1 else scores
    assert dims == want_dims
    for shape, got in zip(masks, strides):
        view = np.broadcast_to(np.zeros(shape, np.float32), scores)
        want = tuple(s // 4 for s in view.strides)
        want = ((0,) + want) if len(lead) == 1 else want
        # A dim of extent 1 in the scores is never stepped over: its stride is free.
        assert all(g == w or e == 1 for g, w, e in zip(got, want, want_dims))


@pytest.mark.parametrize("shapes,transposed,message", [
    ([(2, 3, 5, 16), (2, 3, 16, 7), (2, 3, 7, 16), (4, 5, 7)], False, "does not broadcast"),
    ([(2, 3, 5, 16), (2, 3, 16, 7), (2, 3, 7, 16), (1, 1, 1, 5, 7)], False, "higher rank"),
    ([(2, 3, 5, 16), (2, 3, 16, 7), (2, 3, 8, 16)], False, "do not fit"),
    ([(2, 3, 5, 16), (2, 4, 16, 7), (2, 3, 7, 16)], False, "do not fit"),
    ([(6, 5, 16), (6, 16, 7), (6, 7, 16)], True, "of rank 4"),
])
def test_dims_refuse_what_does_not_fit(dims_lib, shapes, transposed, message) -> None:
    ok, _, _, why = call(dims_lib, 16, shapes, transposed)
    assert not ok and message in why
