"""Layout and view folding: what a kernel reads or writes in place of a separate copy — output
views (Reshape/Transpose chains, views.py), boxes of a wider tensor (folded Slice/Split,
slices.py), windows of a stitched Concat (concats.py) and per-channel parameters broadcast as
[C, 1, …] (channel_params.py). graph.py consults them when it classifies nodes; the schemes
print what they decide."""
