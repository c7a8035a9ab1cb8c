"""Pure neural-network kernels: attention (every implementation), the GRU step, adaptive-node dynamics."""
