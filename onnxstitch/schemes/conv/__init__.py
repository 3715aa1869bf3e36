"""The conv scheme: a 2-D convolution and its epilogue as one cuDNN graph (runtime: launch.cc)."""
