"""Distribution equivalence at temperature > 0, against target_distributions."""

import numpy as np
import pytest

from mtpcheck.laws.precision import precision
from mtpcheck.laws.stats import (
    LawSummary,
    TopLawSummary,
    boundary_excess,
    boundary_mass,
    pit_ks,
    rank_gtest,
    summarise,
    summarise_truncated,
    truncated_pit_ks,
    truncated_rank_gtest,
    truncated_zero_probability_violations,
    zero_probability_violations,
)
from mtpcheck.machinery.checks import logprob_problems, observations, sampled_through, token_role
from mtpcheck.machinery.configs import (
    DIST_CONFIGS,
    DIST_ESCALATE,
    DIST_STAGE1,
    DIST_STAGE2,
    SIDE_ALPHA,
    SUSPICIOUS,
    request,
    seeded,
    spec_for,
    subtest_alpha,
)
from mtpcheck.machinery.report import SIDE_WORDS

# A failure names its side: the same seeded requests with speculation off, judged by the same
# tests. Drawn only after a failure, so they spend none of the passing run's alpha (SIDE_ALPHA is
# in configs.AFTER_FAILURE, outside the budget); the plain path's p-value below SIDE_ALPHA labels
# the failure "both paths". A pinned xfails line turns a wrong label into a failure, so the label
# keeps the run's level: a plain path that keeps the law is called deviating once in a million failures.

# Escalation on suspicion (docs/statistics.md; the constants in
# mtpcheck/machinery/configs.py): each DIST-EQUIV test spends its registered
# alpha in two stages, DIST_STAGE1 on the profile's sample and DIST_STAGE2 on
# that sample grown DIST_ESCALATE-fold, drawn only when a stage-1 p-value lands
# in (DIST_STAGE1, SUSPICIOUS]. Union bound: DIST_STAGE1 + DIST_STAGE2 = its alpha.


@pytest.fixture(scope="module")
def samples(mtp_backend, mtp_capabilities, mtp_fixture, mtp_profile, mtp_seed):
    """(config, runs) -> list of (prompt, result); one shared sample per config,
    grown on demand (escalation), so the clauses below judge the same tokens.
    Drawn through generate_batch when the backend declares it."""
    cache, asked = {}, {}

    def get(config, runs=None, plain=False):
        """`plain`: the same requests with speculation off (drawn only to name the side of a failure)."""
        want = runs or mtp_profile.dist_runs
        have = cache.setdefault((config, plain), [])
        if len(have) < want:
            prompts = list(mtp_fixture.values())
            todo = [(prompts[r % len(prompts)], request(prompts[r % len(prompts)], mtp_profile.dist_tokens,
                                                        seeded(DIST_CONFIGS[config], mtp_seed * 1000 + r),
                                                        False if plain else spec_for(mtp_capabilities)))
                    for r in range(len(have), want)]
            if mtp_capabilities.generate_batch:
                results = mtp_backend.generate_batch([req for _, req in todo])
            else:
                results = [mtp_backend.generate(req) for _, req in todo]
            have += [(prompt, res) for (prompt, _), res in zip(todo, results, strict=True)]
            asked.update({id(res): req for (_, req), res in zip(todo, results, strict=True)})
        mtp_backend.note(*((asked[id(res)], res) for _, res in have[:want]))  # each test's exercise: the runs it judges
        return have[:want]

    return get


@pytest.fixture(scope="module")
def observed():
    """(config, id(result)) -> (result, summary, flips): DIST-ZERO and DIST-EQUIV judge the same runs once."""
    return {}


def _summary(obs, top_n):
    """What the tests read of the observations, without their rows of width V
    (memoised for every run of every configuration, the rows would not fit
    at real vocabularies; docs/benchmarks.md, "The suite's own cost")."""
    return summarise_truncated(obs, top_n) if top_n else summarise(obs)


def _obs(backend, caps, config, runs, excused=None, memo=None):
    """The runs' observations, summarised; zero-probability tokens within the
    precision rule's filter margin of a boundary (laws.precision) go to `excused`."""
    sp, tol, n = DIST_CONFIGS[config], precision(caps).filter_margin, caps.truncated_laws
    out, memo = [], {} if memo is None else memo
    for r, (prompt, res) in enumerate(runs):
        key = (config, id(res))
        if key not in memo:
            flips = []
            obs = observations(backend, prompt, [res], sp, tol, flips)
            memo[key] = (res, _summary(obs, n), flips)  # res held: ids stay unique
        _, summary, flips = memo[key]
        out.append(summary)
        if excused is not None:
            excused += [{"generation": r, **f} for f in flips]
    return TopLawSummary.join(out, n) if n else LawSummary.join(out)


def _proposed_at(caps, config, runs, memo) -> np.ndarray:
    """[n] bool over _obs(...)'s observations: the token was emitted where a
    proposal stood (accepted, or the correction of a rejected one), as the
    report's accept_lens / draft_lens place it."""
    first, out = caps.first_token_from_prefill, []
    for _, res in runs:
        flips = {f["position"] for f in memo[(config, id(res))][2]}
        out += [token_role(res, i, first) in ("accepted", "correction") for i in range(len(res.tokens)) if i not in flips]
    return np.asarray(out, dtype=bool)


def _boundary(backend, caps, config, runs, excused, alpha):
    """DIST-ZERO's count of boundary tokens against the boundary mass of every
    emitted position (stats.boundary_excess): a float runtime flips boundary
    decisions now and then; a sampler that favours those tokens emits more."""
    sp, tol = DIST_CONFIGS[config], precision(caps).filter_margin
    raw_sp = sp.model_copy(update={"top_k": None, "top_p": None, "min_p": None})
    own = {(f["generation"], f["position"]): f["token"] for f in excused}
    masses = []
    for r, (prompt, res) in enumerate(runs):
        raws, laws = backend.target_distributions(prompt, res.tokens, raw_sp), backend.target_distributions(prompt, res.tokens, sp)
        for i, (raw, law) in enumerate(zip(raws, laws, strict=True)):
            m = boundary_mass(raw, law, sp, tol)
            if (r, i) in own:  # at least the excused token's own share, however its margin was rounded
                raw, t = np.asarray(raw, dtype=np.float64), own[(r, i)]
                m = max(m, float(raw[t] / (raw[np.asarray(law) > 0].sum() + raw[t])))
            masses.append(m)
    return boundary_excess(len(excused), masses, alpha)


@pytest.mark.contract("DIST-ZERO")
@pytest.mark.parametrize("config", list(DIST_CONFIGS))
def test_no_token_outside_the_target_support(mtp_backend, mtp_capabilities, samples, observed, mtp_record, config):
    caps, runs, excused = mtp_capabilities, samples(config), []
    obs = _obs(mtp_backend, caps, config, runs, excused, observed)
    n = caps.truncated_laws  # top-N laws: only provable zeros count
    alpha = subtest_alpha("test_no_token_outside_the_target_support")

    def zeros(obs):
        return truncated_zero_probability_violations(obs, n) if n else zero_probability_violations(obs)

    bad, edge = zeros(obs), None
    if excused:  # boundary tokens: counted, never more than the boundary mass allows
        edge = _boundary(mtp_backend, caps, config, runs, excused, alpha)
        mtp_record(config=config, boundary_tokens=len(excused), boundary_tokens_listed=excused[:20],
                   boundary=edge.as_dict(), precision=precision(caps).evidence())
    if not bad and (edge is None or edge.passed):
        return
    # the same requests on the plain path name the side: exact for zeros, at SIDE_ALPHA for the count
    plain_runs, plain_excused = samples(config, plain=True), []
    plain = zeros(_obs(mtp_backend, caps, config, plain_runs, plain_excused, observed))
    plain_edge = _boundary(mtp_backend, caps, config, plain_runs, plain_excused, SIDE_ALPHA) if plain_excused else None
    side = "both" if plain or (not bad and plain_edge is not None and not plain_edge.passed) else "speculative"
    mtp_record(config=config, deviating_side=side, plain_zero_probability_tokens=len(plain),
               plain_boundary=plain_edge.as_dict() if plain_edge else None)
    if bad:
        pytest.fail(f"{SIDE_WORDS[side]}: {len(bad)} of {len(obs)} emitted tokens have target probability 0 (first at "
                    f"observation {bad[0]}), beyond the precision rule's filter margin; the same requests with "
                    f"speculation off emit {len(plain)}")
    pytest.fail(f"{SIDE_WORDS[side]}: {edge.note} (p={edge.p_value:.3g} < alpha={alpha:.2g}): boundary tokens are "
                f"emitted more often than keeping all of them would; speculation off: "
                f"{plain_edge.note if plain_edge else 'no boundary token'}")


@pytest.mark.contract("DIST-EQUIV")
@pytest.mark.parametrize("config", list(DIST_CONFIGS))
def test_emitted_tokens_follow_the_target_law(mtp_backend, mtp_capabilities, mtp_profile, samples, observed, mtp_record,
                                              mtp_seed, config):
    runs = samples(config)
    used = sum(res.speculation.used for _, res in runs)
    if not used:
        pytest.skip("speculation was not used for this configuration (see REPORT-HONEST)")
    excused = []
    obs = _obs(mtp_backend, mtp_capabilities, config, runs, excused, observed)
    n = mtp_capabilities.truncated_laws  # top-N laws: ranks beyond N pool into one bin
    # A drafter that may draft fewer than k keeps or drops proposals; where that
    # choice depends on the token it drew, the tokens emitted where a proposal
    # stood carry the bias undiluted. Each token's law is the target's whatever
    # the choice that did not depend on it, so that stratum is tested on its own,
    # the two tests sharing the stage's alpha.
    strata = mtp_capabilities.drafting == "up_to_k"

    def one(obs, alpha, rng_seed):
        if n:
            return truncated_rank_gtest(obs, n, alpha=alpha), truncated_pit_ks(obs, n, rng_seed=rng_seed, alpha=alpha)
        return rank_gtest(obs, alpha=alpha), pit_ks(obs, rng_seed=rng_seed, alpha=alpha)

    def tests(obs, alpha, rng_seed, runs=None):
        if not strata or runs is None:
            return one(obs, alpha, rng_seed)
        g, ks = one(obs, alpha / 2, rng_seed)
        sg, sks = one(obs.take(_proposed_at(mtp_capabilities, config, runs, observed)), alpha / 2, rng_seed + 7)
        mtp_record(config=config, proposed_stratum={"gtest": sg.model_dump(), "pit_ks": sks.model_dump()})
        where = f"at alpha/2, the {sg.n} tokens emitted where a proposal stood: "
        sg, sks = (t.model_copy(update={"note": where + (t.note or "")}) for t in (sg, sks))
        return min((g, sg), key=lambda t: (t.passed, t.p_value)), min((ks, sks), key=lambda t: (t.passed, t.p_value))

    g, ks = tests(obs, DIST_STAGE1, mtp_seed, runs)
    accepted = sum(res.speculation.accepted for _, res in runs)
    stage, alpha = 1, DIST_STAGE1
    first = {"gtest_p": g.p_value, "pit_ks_p": ks.p_value}
    if g.passed and ks.passed and min(g.p_value, ks.p_value) <= SUSPICIOUS:
        stage, alpha = 2, DIST_STAGE2
        runs = samples(config, DIST_ESCALATE * mtp_profile.dist_runs)
        excused = []
        obs = _obs(mtp_backend, mtp_capabilities, config, runs, excused, observed)
        g, ks = tests(obs, DIST_STAGE2, mtp_seed + 1, runs)
    mtp_record(config=config, gtest=g.model_dump(), pit_ks=ks.model_dump(), accepted_proposals=accepted, stage=stage,
               stage1=first, generations=len(runs), boundary_flips_excused=excused,
               sampled_through=sampled_through(mtp_capabilities))
    where = f"stage {stage} of 2, {len(runs)} generations" + (f" (escalated: stage-1 p={min(first.values()):.3g})" if stage == 2 else "")
    if g.passed and ks.passed:
        return
    # the side: the same requests with speculation off, the same tests at SIDE_ALPHA (a label, not a verdict)
    pg, pks = tests(_obs(mtp_backend, mtp_capabilities, config, samples(config, len(runs), plain=True), [], observed),
                    SIDE_ALPHA, mtp_seed + 2)
    side = "both" if min(pg.p_value, pks.p_value) < SIDE_ALPHA else "speculative"
    mtp_record(deviating_side=side, plain={"gtest": pg.model_dump(), "pit_ks": pks.model_dump(), "alpha": SIDE_ALPHA})
    plain = f"; speculation off: G-test p={pg.p_value:.3g}, KS p={pks.p_value:.3g}"
    assert g.passed, (f"{SIDE_WORDS[side]}: rank G-test rejects the target law: {g.note or ''} p={g.p_value:.3g} < "
                      f"alpha={alpha:.2g} (n={g.n}, detectable TV {g.detectable_tv}; {where}){plain}")
    assert ks.passed, (f"{SIDE_WORDS[side]}: randomized PIT KS rejects uniformity: {ks.note or ''} p={ks.p_value:.3g} < alpha={alpha:.2g} "
                       f"(n={ks.n}; {where}){plain}")


@pytest.mark.contract("LOGPROBS")
def test_logprobs_are_the_targets(mtp_backend, mtp_capabilities, samples, mtp_record):
    # the first configuration the backend speculates on (top_k unless it serves top_k unaccelerated, as
    # vLLM does): logprobs of tokens that never met a verification judge nothing of speculation
    order = ["top_k", *(c for c in DIST_CONFIGS if c != "top_k")]
    config = next((c for c in order if any(res.speculation.used for _, res in samples(c)[:10])), None)
    if config is None:
        pytest.skip("speculation was not used in any sampling configuration (see REPORT-HONEST)")
    mtp_record(config=config)

    def problems_of(pairs):
        found = []
        for r, (prompt, res) in enumerate(pairs):
            laws = mtp_backend.target_distributions(prompt, res.tokens, DIST_CONFIGS[config])
            found += [f"run {r}, {p}" for p in logprob_problems(res, np.asarray(laws), mtp_capabilities.logprob_tolerance)]
        return found

    problems = problems_of(samples(config)[:10])
    if not problems:
        return
    # the side: the same seeded requests with speculation off, checked alike (an exact check: no alpha)
    plain = problems_of(samples(config, 10, plain=True)[:10])
    side = "both" if plain else "speculative"
    mtp_record(deviating_side=side, plain_problems=plain[:5])
    also = f"; speculation off: {len(plain)} differ too ({'; '.join(plain[:2])})" if plain else \
        "; speculation off: every logprob is the target's"
    assert not problems, (f"{SIDE_WORDS[side]}: {len(problems)} logprobs differ from the target law: "
                          + "; ".join(problems[:5]) + also)
