"""A reference engine over small random models (built-in name "toy").

No tokenizer, no training, instant to build: for the suite's own tests and
for mutants. Random weights accept few proposals; `twin=1` makes the
assistant the target itself, so that blocks are fully accepted."""

from __future__ import annotations

from mtpcheck.contracts import SpeculationRequest

from .reference import ReferenceBackend


def build_toy_engine(seed: int = 0, vocab: int = 48, acceptance: str = "rejection", drafter: str = "mtp",
                     depth: int = 3, twin: bool = False):
    import mlx.core as mx

    from mtpcheck.engine.decode import Engine
    from mtpcheck.engine.model import Model, ModelArgs

    mx.random.seed(seed)
    target = Model(ModelArgs(vocab_size=vocab, dim=32, n_layers=3, n_heads=4, hidden_dim=64,
                             layer_kinds=["attn", "gla", "attn"], mtp_layers=1))
    assistant = Model(ModelArgs(vocab_size=vocab, dim=16, n_layers=2, n_heads=2, hidden_dim=32))
    mx.eval(target.parameters(), assistant.parameters())
    return Engine(target, target if twin else assistant, eos_ids=(0,), acceptance=acceptance,
                  default_speculation=SpeculationRequest(drafter=drafter, num_draft_tokens=depth))


def load_toy(seed: str = "0", vocab: str = "48", acceptance: str = "rejection", drafter: str = "mtp",
             depth: str = "3", twin: str = "0", context: str = "2048") -> ReferenceBackend:
    """context: the longest prompt accepted (random weights have no trained
    context; the bound keeps a forward's memory small)."""
    return ReferenceBackend(build_toy_engine(int(seed), int(vocab), acceptance, drafter, int(depth), twin not in ("0", "false", "")),
                            context_length=int(context))
