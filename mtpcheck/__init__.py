"""mtpcheck: the conformance suite for speculative decoding.

Importing this package (and its pytest plugin) must not import mlx: backends
load it lazily, so the suite can judge runtimes that are not built on MLX.
"""

__version__ = "0.1.0"
