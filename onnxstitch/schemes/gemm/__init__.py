"""The gemm scheme: a MatMul/Gemm by a constant weight with its bias, activation and residual
run as one cuBLASLt call with an epilogue (no generated kernel)."""
