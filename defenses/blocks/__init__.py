"""DP building blocks: the pieces a defense is assembled from.

Flat parameter vectors, local SGD (plain or DP-SGD), ℓ2 clipping, Gaussian and discrete-Gaussian
noise from keyed streams, additive mechanisms with their densities and RDP curves, per-scalar LDP,
sparsification and sketches, the Hadamard rotation and simulated secure aggregation.

Extension interface: a block is a function (or a small class) on flat update rows and keyed
``torch.Generator`` streams; it imports neither the engine nor any algorithm, so a new defense
combines blocks without touching them, and a new block is tested on its own mathematics.
"""
