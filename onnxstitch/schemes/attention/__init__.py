"""The attention scheme: MatMul → scale → mask → Softmax → MatMul in one kernel on tensor cores
(TF32 for float32, float16/bfloat16 with float32 accumulation) with an online Softmax."""
