"""Adapters declare the precision they run (Capabilities.logit_dtype), which
the precision rule reads: the mlx-lm adapter from its loaded weights (or the
dtype= option), the transformers adapter from dtype= (float32 by default).
A dtype no adapter knows is one clear error at load."""

from __future__ import annotations

import pytest

from mtpcheck.backends import BackendLoadError, load_backend


def test_mlx_lm_declares_the_dtype_it_runs():
    pytest.importorskip("mlx_lm")
    assert load_backend("mlx-lm").capabilities().logit_dtype == "float16"  # the fixture's weights
    b = load_backend("mlx-lm", {"dtype": "bfloat16"})
    assert b.capabilities().logit_dtype == "bfloat16"
    with pytest.raises(BackendLoadError, match=r"dtype='int8': expected one of float16, bfloat16, float32"):
        load_backend("mlx-lm", {"dtype": "int8"})


def test_transformers_declares_the_dtype_it_loads():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    assert load_backend("transformers").capabilities().logit_dtype == "float32"
    assert load_backend("transformers", {"dtype": "bfloat16"}).capabilities().logit_dtype == "bfloat16"
    with pytest.raises(BackendLoadError, match=r"dtype='half': expected one of float32, bfloat16, float16"):
        load_backend("transformers", {"dtype": "half"})


def test_library_adapters_take_a_declared_logit_scale():
    """A model whose logits exceed 32 declares its bound (the ground-truth check
    fails a runtime whose raw logits pass the declared one); nonsense is one error."""
    pytest.importorskip("mlx_lm")
    assert load_backend("mlx-lm").capabilities().logit_scale == 32.0
    assert load_backend("mlx-lm", {"logit_scale": "64"}).capabilities().logit_scale == 64.0
    with pytest.raises(BackendLoadError, match=r"logit_scale='-1': expected a positive number"):
        load_backend("mlx-lm", {"logit_scale": "-1"})
