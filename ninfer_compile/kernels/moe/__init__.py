"""The sparse mixture-of-experts families (issue 32): `moe_router` (router projection + softmax +
top-k + renormalise, and the shared expert's sigmoid gate) and `moe_experts` (the selected experts'
SwiGLU + down rows read from the stored expert banks, their weighted sum, the gated shared expert and
the residual)."""
