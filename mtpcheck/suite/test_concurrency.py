"""Requests in flight together (capability `concurrent`): each gives what it
gives alone. Logic lives in mtpcheck.machinery.concurrency."""

import pytest

from mtpcheck.machinery.concurrency import concurrent_mix, divergence


@pytest.mark.contract("CONCURRENT-EQUALS-SOLO")
@pytest.mark.parametrize("order", ["forward", "reversed"])
def test_requests_served_together_equal_their_solo_runs(mtp_backend, mtp_capabilities, mtp_fixture, mtp_seed,
                                                        mtp_record, order):
    reqs = concurrent_mix(mtp_capabilities, list(mtp_fixture.values()), mtp_seed)
    if order == "reversed":  # other neighbours, other join and leave times
        reqs = reqs[::-1]
    together = mtp_backend.generate_batch(reqs)
    alone = [mtp_backend.generate(r) for r in reqs]
    found = [dict(request=i, **d) for i, (r, a, t) in enumerate(zip(reqs, alone, together, strict=True))
             if (d := divergence(mtp_backend, mtp_capabilities, r, a, t)) is not None]
    mtp_record(requests=len(reqs), speculative=sum(t.speculation.used for t in together), divergences=found)
    bad = [d for d in found if not d["excused"]]
    assert not bad, (f"{len(bad)} of {len(reqs)} requests served together differ from their solo runs; first: request "
                     f"{bad[0]['request']} at position {bad[0]['position']}: together {bad[0]['together']} vs alone "
                     f"{bad[0]['alone']} (seed {bad[0]['seed']}, T={bad[0]['temperature']}): {bad[0]['why']}")
