"""The rows scheme: row reductions (Softmax, LayerNorm, GroupNorm, Reduce*) stitched with the
elementwise work around them, one row per thread group through registers or shared memory."""
