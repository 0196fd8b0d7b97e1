"""Measurement programs (docs/architecture.md): speed benchmarks with gates
(bench), one request through several runtimes (side_by_side, two_engines),
the suite's power and its false-failure calibration (power, calibrate). They
use the machinery, backends and fixture; nothing in the suite imports them."""
