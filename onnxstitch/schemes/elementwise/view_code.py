"""Code generation, layout folding (folds/views.py): how an elementwise kernel writes outputs through views.

A view that keeps the source's innermost axis innermost is a re-addressed store: 16 bytes at
a time when whole vectors stay inside that axis. A view that moves the innermost axis (BERT's
key transpose, [b, s, h, d] → [b, h, d, s]) would scatter every element to its own sector, so
those outputs go through a shared-memory tile instead: a block computes TILE_A × TILE_C
elements reading along the source's innermost axis C, and writes them along the axis A the
view makes innermost. Both sides move whole sectors.
"""
from __future__ import annotations

from ... import ops
from ...folds import views
from ...graph import FusionGraph
from .index import decompose

TILE_A = 32  # elements along the output's innermost axis: one warp's store
TILE_VECS = 8  # vectors along the source's innermost axis: with TILE_A, 256 threads per block


def view_code(graph: FusionGraph, outputs: tuple[str, ...],
              out_views: list[views.View | None]) -> tuple[str, dict[int, str]]:
    """(per-thread setup, stores by output) for outputs written through a view.

    Per thread: the split dims vd (from the iteration dims, fixed sizes and one remainder) and
    each split axis's stride in the permuted output, vs. Per vector: its first element's
    offset, decomposed over vd once when the innermost split dim holds whole vectors (vr);
    then a 16-byte store when the permutation keeps that axis innermost, else one store per
    element, stepping by the innermost axis's stride."""
    setup: list[str] = []
    stores: dict[int, str] = {}
    for k, v in enumerate(out_views):
        if v is None:
            continue
        r = len(v.split)
        st = ops.CTYPES[graph.tensors[outputs[k]].dtype][0]
        setup.append(f"  I vd{k}[{r}], vs{k}[{r}];")
        known = []
        for j, e in enumerate(v.split):
            if e != views.REST:
                setup.append(f"  vd{k}[{j}] = {f'(I){e}' if e >= 0 else f'(I)a.dims[{-e - 2}]'};")
                known.append(f"vd{k}[{j}]")
        if views.REST in v.split:
            j = v.split.index(views.REST)
            prod = " * ".join(known) or "(I)1"
            setup.append(f"  {{ const I kn = {prod}; vd{k}[{j}] = kn ? (I)(a.n / kn) : (I)0; }}")
        setup.append("  { I acc = 1;" + "".join(f" vs{k}[{p}] = acc; acc *= vd{k}[{p}];" for p in reversed(v.perm))
                     + " (void)acc; }")
        setup.append(f"  const bool vr{k} = vd{k}[{r - 1}] % V == 0;")
        last = f"vs{k}[{r - 1}]"
        first = decompose("r", r - 1, 0, {f"vs{k}": "vb"}, "      ", dims=f"vd{k}")
        each = decompose("r", r - 1, 0, {f"vs{k}": "off"}, "          ", dims=f"vd{k}")
        vector = (f"      if (vr{k}) {{ static_cast<StitchVec<V, {st}>*>(a.out[{k}])[vb / V] = out{k}; }}\n      else "
                  if v.perm[-1] == r - 1 else "      ")
        stores[k] = (f"    {{ I vb = 0;\n      if (vr{k}) {{ I r = w * V;\n      {first}\n      }}\n"
                     f"{vector}{{\n#pragma unroll\n"
                     f"        for (int e = 0; e < V; ++e) {{\n          I off = vb + (I)e * {last};\n"
                     f"          if (!vr{k}) {{ I r = w * V + e; off = 0;\n          {each}\n          }}\n"
                     f"          static_cast<{st}*>(a.out[{k}])[off] = out{k}.v[e];\n        }}\n      }}\n    }}")
    return ("\n".join(setup) + "\n" if setup else ""), stores


def tiled_loop(graph: FusionGraph, outputs: tuple[str, ...], out_views: list[views.View | None],
               tiled: list[int], vector_body: str, plain_stores: str) -> str:
    """The grid-stride loop over tiles, for a launch where the lead view's innermost split dim
    holds whole vectors (`vr`, checked by the caller). `vector_body` computes out{k} for the
    vector `w`; `plain_stores` writes the outputs that are not tiled. Every thread of a block
    reaches both barriers: the tile count is uniform per block and idle threads only skip work."""
    lead = out_views[tiled[0]]
    assert lead is not None
    k0, rank = tiled[0], len(lead.split)
    c, ax = rank - 1, lead.perm[-1]
    vd = f"vd{k0}"
    outer = [d for d in range(rank) if d not in (ax, c)]
    tiles = " * ".join([f"{vd}[{d}]" for d in outer] + ["nta", "ntc"])
    smem = "\n".join(f"    __shared__ {ops.CTYPES[graph.tensors[outputs[k]].dtype][0]} tile{k}[TC][{TILE_A + 1}];"
                     for k in tiled)
    walk = "\n".join(f"      {{ const I q = r % {vd}[{d}]; r /= {vd}[{d}]; sb += q * ss[{d}];"
                     + "".join(f" ob{k} += q * vs{k}[{d}];" for k in tiled) + " }"
                     for d in reversed(outer))
    put = "\n".join(f"          tile{k}[tv * V + e][ta] = out{k}.v[e];" for k in tiled)
    get = "\n".join(f"          static_cast<{ops.CTYPES[graph.tensors[outputs[k]].dtype][0]}*>(a.out[{k}])"
                    f"[ob{k} + (I)ja + (I)jc * vs{k}[{c}]] = tile{k}[jc][ja];" for k in tiled)
    return f"""    constexpr int TC = {TILE_VECS} * V;
{smem}
    I ss[{rank}];
    {{ I acc = 1;{''.join(f' ss[{d}] = acc; acc *= {vd}[{d}];' for d in reversed(range(rank)))} (void)acc; }}
    const I nta = ({vd}[{ax}] + {TILE_A} - 1) / {TILE_A}, ntc = ({vd}[{c}] + TC - 1) / TC;
    const I tiles = {tiles};
    const int ta = threadIdx.x / {TILE_VECS}, tv = threadIdx.x % {TILE_VECS};
    for (I t = blockIdx.x; t < tiles; t += gridDim.x) {{
      I r = t;
      const I tc0 = (r % ntc) * TC; r /= ntc;
      const I ta0 = (r % nta) * {TILE_A}; r /= nta;
      I sb = tc0 + ta0 * ss[{ax}];
      {' '.join(f'I ob{k} = tc0 * vs{k}[{c}] + ta0;' for k in tiled)}
{walk}
      if (ta0 + ta < {vd}[{ax}] && tc0 + (I)tv * V < {vd}[{c}]) {{
        const I w = (sb + (I)ta * ss[{ax}] + (I)tv * V) / V;
{vector_body}
{plain_stores}
#pragma unroll
        for (int e = 0; e < V; ++e) {{
{put}
        }}
      }}
      __syncthreads();
      for (int j = threadIdx.x; j < {TILE_A} * TC; j += blockDim.x) {{
        const int ja = j % {TILE_A}, jc = j / {TILE_A};
        if (ta0 + ja < {vd}[{ax}] && tc0 + jc < {vd}[{c}]) {{
{get}
        }}
      }}
      __syncthreads();
    }}"""
