"""A round as short functions over explicit state:

  propose      draft k proposals (or reuse a promoted lookahead branch)
  target_laws  one target pass over [pending, d_1..d_k] -> k+1 processed laws
  uniforms     the positioned acceptance and target uniforms
  (the acceptance rule, acceptance.py, turns these into a Verdict)
  roll_back    trim the target cache to the committed tokens; the drafter follows
  count        the speculation statistics of one verified round
  trace        the round's RoundTrace, a function of the finished Round

`Engine.verify` strings them together with its seams (the target law, the
randomness source, the rule, the commit/stop rule).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from mtpcheck.contracts import RoundTrace, SamplingParams
from mtpcheck.contracts.models import history_digest

from . import lookahead
from .acceptance import Verdict
from .cache import cache_length, trim_cache
from .constraints import Cursor, masked
from .draft import DraftBlock
from .model import Model
from .sampling import STREAM_ACCEPT, STREAM_TARGET
from .state import InFlight, RequestState, Stats


@dataclass
class Round:
    """One verified block: what the commit, the statistics and the trace read."""

    block: DraftBlock  # [k] proposals and the laws q [k, V] they were drawn from
    ps: np.ndarray  # [k+1, V] processed target laws at the block's positions
    au: np.ndarray  # [k] acceptance uniforms
    tu: np.ndarray  # [k+1] target uniforms
    verdict: Verdict
    pending: int  # the token that led the target pass
    target_len: int  # target cache length before the pass; history[target_len] is pending
    draft_len: int  # draft cache length before proposing
    digest: str  # sampler history digest before the commit
    events: int  # output events before the commit
    draft_time: float
    verify_time: float
    committed: list[int] = field(default_factory=list)  # the allowed prefix of `emitted`

    @property
    def emitted(self) -> list[int]:
        """The accepted proposals, then the correction or the bonus."""
        return self.block.tokens[: self.verdict.accepted] + [self.verdict.next_token]


def block_size(st: RequestState) -> int:
    """Proposals this round: the depth, cut so the bonus still fits the budget."""
    return min(st.plan.depth, st.req.max_tokens - len(st.out.tokens) - 1) if st.plan.used else 0


def propose(st: RequestState, vocab: int) -> InFlight:
    """Draft this round's block, reusing a promoted branch when there is one."""
    n = len(st.history) - 1  # == target cache length; history[n] is pending
    k = block_size(st)
    before = st.drafter.length if st.drafter else 0
    t0 = time.perf_counter()
    if st.promoted is not None:
        block = lookahead.reuse(st, n, k)
    elif k > 0:
        block = st.drafter.draft(st.history, n, k, st.req.sampling, st.seed, st.cursor)
    else:
        block = DraftBlock.empty(n + 1, vocab)
    return InFlight(block, before, time.perf_counter() - t0)


def target_laws(target: Model, law: Callable, history: list[int], cache: list, block: DraftBlock,
                sp: SamplingParams, cursor: Cursor) -> tuple[np.ndarray, mx.array]:
    """One target pass over [pending, d_1..d_k] -> (ps [k+1, V], hidden [k+1, D]).
    Row j is masked and processed at its exact history (a transaction-local cursor)."""
    k = len(block.tokens)
    hidden, logits = target(mx.array([history[-1]] + block.tokens)[None], cache)  # [1, k+1, V]
    rows = np.array(logits[0], dtype=np.float64)
    cursors = [cursor]
    for d in block.tokens:  # a forbidden proposal (p = 0) is surely rejected: rows after it go unused
        c = cursors[-1]
        cursors.append(c.advance(d) if c.mask is None or c.mask[d] else c)
    ps = np.stack([law(masked(rows[j], cursors[j].mask), sp, history + block.tokens[:j]) for j in range(k + 1)])
    return ps, hidden[0]


def uniforms(uniform: Callable, seed: int, block: DraftBlock) -> tuple[np.ndarray, np.ndarray]:
    """Acceptance uniforms [k] and target uniforms [k+1], keyed by logical position."""
    positions = range(block.position, block.position + len(block.tokens) + 1)
    au = np.array([uniform(seed, STREAM_ACCEPT, pos) for pos in positions[:-1]])
    tu = np.array([uniform(seed, STREAM_TARGET, pos) for pos in positions])
    return au, tu


def logprob(p: np.ndarray, tok: int) -> float:
    return math.log(p[tok]) if p[tok] > 0 else -math.inf


def roll_back(cache: list, drafter, rnd: Round, hidden: mx.array) -> None:
    """Keep the inputs x_n, d_1..d_{c-1}: the last committed token is pending.
    The drafter drops its speculative entries and keeps the verified hidden rows."""
    n, c = rnd.target_len, len(rnd.committed)
    trim_cache(cache, n + c)
    if drafter is not None:
        drafter.after_verify(n, n + c, hidden)


def count(stats: Stats, rnd: Round) -> None:
    """A bonus or a correction counts only when the stop rule kept it."""
    v, whole = rnd.verdict, len(rnd.committed) == len(rnd.emitted)
    stats.rounds += 1
    stats.accept_lens.append(v.accepted)
    stats.draft_lens.append(len(rnd.block.tokens))
    stats.bonus += v.next_kind == "bonus" and whole
    stats.corrections += v.next_kind == "correction" and whole
    stats.draft_time += rnd.draft_time
    stats.verify_time += rnd.verify_time


def trace(rnd: Round, index: int, st: RequestState) -> RoundTrace:
    """The white-box record of a finished round; `st` supplies the state after it."""
    b, v = rnd.block, rnd.verdict
    return RoundTrace(
        round=index,
        position=b.position,
        pending_token=rnd.pending,
        proposals=b.tokens,
        draft_probs=b.probs.tolist(),
        target_probs=rnd.ps.tolist(),
        draft_uniforms=b.uniforms,
        accept_uniforms=rnd.au.tolist(),
        target_uniforms=rnd.tu.tolist(),
        accepted=v.accepted,
        next_token=v.next_token,
        next_kind=v.next_kind,
        next_law=v.next_law.tolist(),
        committed=rnd.committed,
        target_len_before=rnd.target_len,
        target_len_after=cache_length(st.cache),
        draft_len_before=rnd.draft_len,
        draft_len_after=st.drafter.length if st.drafter else 0,
        sampler_digest_before=rnd.digest,
        sampler_digest_after=history_digest(st.history),
        events=list(range(rnd.events, len(st.out.events))),
    )
