"""The attention scheme: MatMul → scale → mask → Softmax → MatMul in one kernel on TF32 tensor
cores with an online Softmax."""
