import os

os.environ.setdefault("MLX_DISABLE_COMPILE", "1")

import pytest  # noqa: E402

# pytester's in-process runs restore sys.modules afterwards; numpy 2 and scipy's
# extension modules cannot be loaded twice in one process, so a first import of
# scipy inside such a run broke the next one ("cannot load module more than once
# per process"). Load them here, once, for the whole session.
import scipy.optimize  # noqa: E402, F401
import scipy.stats  # noqa: E402, F401


class CharTokenizer:
    """A stand-in tokenizer for engine tests: token t -> one letter."""

    def decode(self, tokens, skip_special_tokens=False):
        return "".join(chr(ord("a") + t % 26) for t in tokens)


def make_models(seed=0, vocab=48):
    import mlx.core as mx

    from mtpcheck.engine.model import Model, ModelArgs

    mx.random.seed(seed)
    target = Model(ModelArgs(vocab_size=vocab, dim=32, n_layers=3, n_heads=4, hidden_dim=64,
                             layer_kinds=["attn", "gla", "attn"], mtp_layers=1))
    assistant = Model(ModelArgs(vocab_size=vocab, dim=16, n_layers=2, n_heads=2, hidden_dim=32))
    mx.eval(target.parameters(), assistant.parameters())
    return target, assistant


@pytest.fixture(scope="session")
def random_models():
    return make_models()


@pytest.fixture(scope="session")
def char_tokenizer():
    return CharTokenizer()


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run the tests that take minutes (the full mutant zoo in tests/test_mutants.py)")
