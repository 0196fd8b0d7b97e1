"""Acceptance of the real-backend fixtures as each library reports it, through
the adapters: the mlx-vlm pair (qwen3_5_text + qwen3_5_mtp) and the mlx-lm
pair (llama + llama draft) that ``python -m mtpcheck.fixture.realbackends``
built, on held-out corpus prompts, greedy and at temperature 1 (seeded).

    MLX_DISABLE_COMPILE=1 python -m mtpcheck.fixture.realbackends --out mtpcheck/fixture/real
    MLX_DISABLE_COMPILE=1 python -m research.real_acceptance --out mtpcheck/fixture/real

Records the figures as ``measured`` in ``<out>/realbackends.json`` (``--print``:
only prints them). Needs mlx-vlm and mlx-lm (``pip install
mtpcheck[mlx-vlm,mlx-lm]``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

NOTE = "acceptance reported by each library through the adapters, 8 held-out prompts x 48 tokens, depth 3"


def measure(out: Path, prompts: list[list[int]], max_tokens: int = 48, depth: int = 3) -> dict[str, Any]:
    """Acceptance as each library reports it, through the adapters, on held-out
    prompts: greedy and temperature 1 (seeded)."""
    from mtpcheck.backends.mlx_lm import load_mlx_lm
    from mtpcheck.backends.mlx_vlm import load_mlx_vlm
    from mtpcheck.contracts import GenerationRequest, SamplingParams

    result: dict[str, Any] = {}
    for name, backend in (("mlx_vlm", load_mlx_vlm(path=str(out / "mlx_vlm"))),
                          ("mlx_lm", load_mlx_lm(path=str(out / "mlx_lm")))):
        row = {}
        for label, temp in (("greedy", 0.0), ("t1", 1.0)):
            drafted = accepted = rounds = emitted = 0
            for i, p in enumerate(prompts):
                req = GenerationRequest(prompt_tokens=p, max_tokens=max_tokens, stop_token_ids=[],
                                        sampling=SamplingParams(temperature=temp, seed=1000 + i),
                                        speculation={"mode": "native_mtp", "num_draft_tokens": depth})
                s = backend.generate(req).speculation
                drafted, accepted, rounds = drafted + s.drafted, accepted + s.accepted, rounds + s.rounds
                emitted += max_tokens
            row[label] = {"acceptance_rate": round(accepted / max(drafted, 1), 4),
                          "accepted_per_round": round(accepted / max(rounds, 1), 4),
                          "tokens_per_round": round(emitted / max(rounds, 1), 4)}
        result[name] = row
    return result


def main(argv: list[str] | None = None) -> int:
    from mtpcheck.fixture import FIXTURE_DIR, REAL_DIR, load_tokenizer
    from mtpcheck.fixture.realbackends import heldout_prompts

    ap = argparse.ArgumentParser(prog="python -m research.real_acceptance", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REAL_DIR, help="the built fixture folder (default: %(default)s)")
    ap.add_argument("--tokenizer-dir", type=Path, default=None, help="default: the tiny fixture's folder")
    ap.add_argument("--print", dest="print_only", action="store_true",
                    help="print the figures, leave realbackends.json as it is")
    args = ap.parse_args(argv)
    measured = {"note": NOTE, **measure(args.out, heldout_prompts(load_tokenizer(args.tokenizer_dir or FIXTURE_DIR)))}
    print(json.dumps(measured, indent=2))
    if not args.print_only:
        path = args.out / "realbackends.json"
        meta = json.loads(path.read_text()) if path.exists() else {}
        meta["measured"] = measured
        path.write_text(json.dumps(meta, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
