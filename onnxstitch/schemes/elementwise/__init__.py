"""The elementwise scheme: a grid-stride loop over one iteration space, broadcast inputs
through strides, outputs optionally written through a view (reshape/transpose)."""
