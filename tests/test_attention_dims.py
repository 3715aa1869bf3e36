"""The runtime's launch arithmetic for attention kernels (schemes/attention/attention_dims.h's
AttentionDims, the code the scheme's launch runs), compiled with g++ and called through ctypes:
dims [B, H, Sq, Sk] and each mask's element strides, against numpy's own broadcasting of the
mask to the scores (an independent computation), the row widths of operands read from
projections, and its refusals."""
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
#include "attention_dims.h"
extern "C" int attention_dims(const long long* spec, long long spec_size, const long long* shapes,
                              const long long* ranks, long long n_in, long long* dims, long long* strides,
                              long long* widths, char* error, int error_size) {
  // spec: head size, queries, threads, shared bytes, masks, transposed(, heads, 3 offsets, biased)
  // (, KV group: 7 values)(, KV group, value size: 8 values)
  onnxstitch::AttentionSpec s;
  s.head = spec[0], s.queries = spec[1], s.threads = spec[2], s.shared = spec[3];
  s.masks = static_cast<int>(spec[4]), s.transposed = spec[5] != 0;
  if (spec_size == 7 || spec_size == 8) s.kv_group = spec[6];
  if (spec_size == 8) s.value = spec[7];  // V's own head width
  if (spec_size == 11) {
    s.projected = true, s.heads = spec[6], s.biased = spec[10] != 0;
    for (int i = 0; i < 3; ++i) s.offsets[i] = spec[7 + i];
  }
  std::string why;
  if (!onnxstitch::CheckAttention(s, &why)) { snprintf(error, error_size, "%s", why.c_str()); return 0; }
  int64_t sh[8][STITCH_MAX_RANK];
  size_t rk[8];
  for (long long i = 0; i < n_in; ++i) {
    rk[i] = static_cast<size_t>(ranks[i]);
    for (int j = 0; j < STITCH_MAX_RANK; ++j) sh[i][j] = shapes[i * STITCH_MAX_RANK + j];
  }
  long long ms[onnxstitch::kMaxMasks][4];
  if (!onnxstitch::AttentionDims(s, sh, rk, static_cast<size_t>(n_in), dims, ms, widths, &why)) {
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
    scheme = Path(runtime.__file__).parent.parent / "schemes" / "attention"
    lib = folder / "driver.so"
    subprocess.run(["g++", "-std=c++17", "-O1", "-fPIC", "-shared", f"-I{csrc}", f"-I{scheme}", "-include", "cstdio",
                    "-o", str(lib),
                    str(src)], check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(lib))


def call(lib: ctypes.CDLL, head: int, shapes: list[tuple[int, ...]], transposed: bool = False,
         projection: tuple[int, ...] = ()):
    """AttentionDims over `shapes`; `projection` = (heads, q, k, v column offsets, biased) for
    operands read from projections. (ok, dims, mask strides, widths, error)."""
    first = 3 + 3 * (projection[-1] if projection else 0)
    masks = max(len(shapes) - first, 0)
    return _dims(lib, (head, 64, 128, 0, masks, int(transposed), *projection), shapes, masks)


def _dims(lib: ctypes.CDLL, values: tuple[int, ...], shapes: list[tuple[int, ...]], masks: int):
    """The driver over spec `values` and `shapes`: (ok, dims, mask strides, widths, error)."""
    spec = (ctypes.c_longlong * len(values))(*values)
    flat = (ctypes.c_longlong * (8 * len(shapes)))()
    for i, sh in enumerate(shapes):
        for j, v in enumerate(sh):
            flat[i * 8 + j] = v
    ranks = (ctypes.c_longlong * len(shapes))(*[len(sh) for sh in shapes])
    dims, strides, widths = (ctypes.c_longlong * 4)(), (ctypes.c_longlong * 8)(), (ctypes.c_longlong * 3)()
    error = ctypes.create_string_buffer(512)
    ok = lib.attention_dims(spec, len(values), flat, ranks, len(shapes), dims, strides, widths, error, 512)
    return (bool(ok), tuple(dims), [tuple(strides[k * 4:(k + 1) * 4]) for k in range(masks)],
            tuple(widths), error.value.decode())


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
    ok, dims, strides, _, why = call(dims_lib, d, [(*lead, sq, d), (*lead, d, sk), (*lead, sk, d), *masks])
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
    ok, _, _, _, why = call(dims_lib, 16, shapes, transposed)
    assert not ok and message in why


@pytest.mark.parametrize("xq,xk,xv,heads,offsets,biased,masks", [
    ((8, 128, 2304), (8, 128, 2304), (8, 128, 2304), 12, (0, 768, 1536), 1, [(8, 1, 128, 128)]),  # BERT, merged
    ((2, 70, 512), (2, 70, 512), (2, 70, 512), 8, (0, 0, 0), 0, [(1, 8, 70, 70), (2, 1, 1, 70)]),  # T5, apart
    ((3, 5, 100), (3, 9, 40), (3, 9, 36), 2, (4, 8, 0), 1, []),  # cross attention, wider than the heads
])
def test_projected_dims_from_the_projections(dims_lib, xq, xk, xv, heads, offsets, biased, masks) -> None:
    d = 16
    biases = [(heads * d,)] * 3 if biased else []
    ok, dims, strides, widths, why = call(dims_lib, d, [xq, xk, xv, *biases, *masks], True,
                                          (heads, *offsets, biased))
    assert ok, why
    scores = (xq[0], heads, xq[1], xk[1])
    assert dims == scores and widths == (xq[2], xk[2], xv[2])
    for shape, got in zip(masks, strides):
        want = tuple(s // 4 for s in np.broadcast_to(np.zeros(shape, np.float32), scores).strides)
        assert all(g == w or e == 1 for g, w, e in zip(got, want, scores))


@pytest.mark.parametrize("shapes,projection,message", [
    ([(2, 5, 64), (2, 5, 64), (2, 5, 64)], (2, 0, 0, 40, 0), "do not hold"),  # v's heads past its width
    ([(2, 5, 64), (2, 5, 64), (2, 6, 64)], (2, 0, 0, 0, 0), "do not hold"),  # k and v of other lengths
    ([(2, 5, 64), (3, 5, 64), (2, 5, 64)], (2, 0, 0, 0, 0), "do not hold"),  # other batches
    ([(2, 5, 66), (2, 5, 66), (2, 5, 66)], (2, 0, 0, 0, 0), "do not hold"),  # a width not a multiple of 4
    ([(2, 5, 64)] * 3 + [(32,), (32,), (16,)], (2, 0, 0, 0, 1), "do not hold"),  # a bias too short
    ([(2, 5, 64)] * 3, (2, 0, 0, 0, 1), "three biases"),  # biases missing
    ([(2, 5, 64)] * 3, (2, 0, 2, 0, 0), "multiples of 4"),  # an unaligned offset
])
def test_projected_dims_refuse_what_does_not_fit(dims_lib, shapes, projection, message) -> None:
    ok, _, _, _, why = call(dims_lib, 16, shapes, True, projection)
    assert not ok and message in why, why


def call_grouped(lib: ctypes.CDLL, head: int, shapes: list[tuple[int, ...]], group: int):
    """AttentionDims for a kernel with `group` q heads per KV head: (ok, dims, strides, error)."""
    masks = len(shapes) - 3
    ok, dims, strides, _, why = _dims(lib, (head, 64, 128, 0, masks, 1, group), shapes, masks)
    return ok, dims, strides, why


@pytest.mark.parametrize("b,heads,group,sq,sk,masks", [
    (8, 6, 3, 128, 128, [(8, 1, 128, 128)]),  # Qwen2's 6 q heads on 2 KV heads
    (2, 8, 2, 1, 1024, [(2, 1, 1, 1024)]),  # a decode step against a long cache
    (1, 14, 7, 16, 300, []),
    (3, 4, 1, 5, 9, []),  # a group of 1 reads K as kᵀ (the attribute's default): see below
])
def test_grouped_dims_take_kv_with_fewer_heads(dims_lib, b, heads, group, sq, sk, masks) -> None:
    d = 16
    k = (b, heads // group, sk, d) if group > 1 else (b, heads, d, sk)
    v = (b, heads // group, sk, d)
    ok, dims, strides, why = call_grouped(dims_lib, d, [(b, heads, sq, d), k, v, *masks], group)
    assert ok, why
    scores = (b, heads, sq, sk)
    assert dims == scores
    for shape, got in zip(masks, strides):
        want = tuple(s // 4 for s in np.broadcast_to(np.zeros(shape, np.float32), scores).strides)
        assert all(g == w or e == 1 for g, w, e in zip(got, want, scores))


@pytest.mark.parametrize("shapes,group,message", [
    ([(2, 6, 5, 16), (2, 3, 7, 16), (2, 3, 7, 16)], 3, "q heads per KV head"),  # 6 / 3 is 2, not 3
    ([(2, 6, 5, 16), (2, 2, 7, 16), (2, 2, 8, 16)], 3, "q heads per KV head"),  # K and V lengths differ
    ([(2, 6, 5, 16), (2, 2, 16, 7), (2, 2, 7, 16)], 3, "q heads per KV head"),  # K given as kᵀ
    ([(12, 5, 16), (4, 7, 16), (4, 7, 16)], 3, "rank 4"),  # rank 3
    ([(2, 6, 5, 16), (2, 2, 7, 16), (2, 2, 7, 16)], 0, "KV group >= 1"),
])
def test_grouped_dims_refuse_what_does_not_fit(dims_lib, shapes, group, message) -> None:
    ok, _, _, why = call_grouped(dims_lib, 16, shapes, group)
    assert not ok and message in why, why


@pytest.mark.parametrize("lead,sq,sk,dv", [((2, 4), 49, 49, 32), ((6,), 16, 49, 64), ((1, 2), 70, 90, 8)])
def test_values_of_their_own_width(dims_lib, lead, sq, sk, dv) -> None:
    d = 16
    shapes = [(*lead, sq, d), (*lead, d, sk), (*lead, sk, dv)]
    ok, dims, _, _, why = _dims(dims_lib, (d, 64, 128, 0, 0, 0, 1, dv), shapes, 0)
    assert ok, why
    assert dims == (((1,) if len(lead) == 1 else ()) + (*lead, sq, sk))
    # The spec without the value size takes V as wide as q: these do not fit it.
    ok, _, _, _, why = _dims(dims_lib, (d, 64, 128, 0, 0, 0, 1, 0), shapes, 0)
    assert not ok and "do not fit" in why
    # Values of their own width are for plain operands: not with grouped KV heads.
    ok, _, _, _, why = _dims(dims_lib, (d, 64, 128, 0, 0, 0, 2, dv), shapes, 0)
    assert not ok and "value size" in why
