import pytest

from mtpcheck.contracts import SamplingParams
from mtpcheck.machinery.assertions import assert_lossless


def test_assert_lossless_passes_the_reference_and_fails_a_mutant():
    from mtpcheck.backends.toy import load_toy
    from mtpcheck.mutants import load_mutant

    sp = SamplingParams(temperature=0.25, top_k=10)  # far from the mutant's temperature 1
    result = assert_lossless(load_toy(), [1, 2, 3, 4], sp, runs=30, max_tokens=24)
    assert result.passed and result.n > 500 and 0 < result.detectable_tv < 0.5
    with pytest.raises(AssertionError, match="do not follow the target law"):
        assert_lossless(load_mutant("one-sided-temperature"), [1, 2, 3, 4], sp, runs=30, max_tokens=24)
