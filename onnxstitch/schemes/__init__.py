"""Kernel schemes: each kind of kernel (elementwise, rows, attention, gemm, conv) in one folder behind one
interface (`base.Scheme`: generate the source, describe the launch, write the fused node's
attributes), listed in `registry`. docs/architecture.md says how to add one. Importing this
package loads no scheme: the plan and the cost model read a scheme's geometry without
pulling in every code generator.
"""

# Scheme names, as groups, kernel sources and reports carry them.
ELEMENTWISE = "elementwise"
ROWS = "rows"
ATTENTION = "attention"
GEMM = "gemm"  # a library call (cuBLASLt) with an epilogue: no generated kernel
CONV = "conv"  # a library call (cuDNN's graph API): a convolution and its epilogue, in NHWC
