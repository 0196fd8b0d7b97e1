"""Run profiles: the ci profile reports a failing hypothesis example as found
(no shrinking: shrinking one against a real backend cost minutes); dev and
thorough shrink it."""

import re
from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import mtpcheck.suite
from mtpcheck.machinery.harness import PROFILES


def run_failing_property(profile):
    """A property that fails on any list holding a value >= 10, under the
    profile's settings as the suite builds them. Returns the examples tried."""
    calls = []

    @settings(max_examples=profile.hypothesis_examples, phases=profile.hypothesis_phases(),
              deadline=None, database=None, derandomize=True)
    @given(xs=st.lists(st.integers(0, 1000), min_size=3, max_size=20))
    def check(xs):
        calls.append(list(xs))
        assert max(xs) < 10, xs

    with pytest.raises(AssertionError):
        check()
    return calls


def test_ci_reports_the_first_failing_example_without_shrinking():
    assert Phase.shrink not in PROFILES["ci"].hypothesis_phases()
    calls = run_failing_property(PROFILES["ci"])
    first = next(i for i, xs in enumerate(calls) if max(xs) >= 10)
    # the failing example is replayed once to report it, and nothing else runs
    assert calls[first + 1:] == [calls[first]], len(calls) - first
    assert calls[-1] != [0, 0, 10]  # not the minimal example


@pytest.mark.parametrize("name", ["dev", "thorough"])
def test_dev_and_thorough_shrink(name):
    assert Phase.shrink in PROFILES[name].hypothesis_phases()
    calls = run_failing_property(PROFILES[name])
    assert calls[-1] == [0, 0, 10]  # shrunk to the minimal failing example


def test_every_suite_settings_takes_the_profile_phases():
    suite = Path(mtpcheck.suite.__file__).parent
    uses = {p.name: re.findall(r"@settings\((.*?)\n\s*(?:@|def )", p.read_text(), re.S) for p in suite.glob("*.py")}
    uses = {name: args for name, args in uses.items() if args}
    assert uses, "no @settings in the suite"
    for name, args in uses.items():
        for a in args:
            assert "phases=mtp_profile.hypothesis_phases()" in a, (name, a)
