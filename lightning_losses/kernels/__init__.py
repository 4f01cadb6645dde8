"""Triton kernels (GPU) of the target-probability family, one file per op.

Nothing here imports Triton at import time: :mod:`lightning_losses.kernels.availability` says
whether the kernels can run for a tensor (Triton importable, and the tensor on a CUDA device or
``TRITON_INTERPRET=1`` set for the CPU interpreter), and the op modules
(:mod:`lightning_losses.kernels.target_probability`) are imported only when a tensor needs them.
"""
