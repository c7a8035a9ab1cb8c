"""Physics families: wave fields and vortices, Gross–Pitaevskii and GFT condensates, tensor networks and
MERA, exact diagonalisation, 1+1D causal dynamical triangulations."""
