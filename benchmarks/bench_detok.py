"""The ingress's detokenizer per streamed token: incremental windows vs whole decodes.

The service's `Detokenizer` decodes a window of the latest ids per `add`; the floor it
replaced decoded the whole output after every token (kept here, `WholeDecode`, as the
comparison). Both run side by side in one process on the same ids: ShareGPT replies
tokenized with Llama-2's SentencePiece (a transformers tokenizer), fed one id at a time,
for outputs of each `--lengths` value. Prints microseconds per token of each and their
ratio, and checks that both release the same text.

Needs the shared data folder (`tokenizers/llama2`, `sharegpt`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from marconi_ray.serve.ingress.generation import REPLACEMENT, Detokenizer
from marconi_ray.traces.paths import default_data_dir
from marconi_ray.traces.tokenizer import LLAMA2_RELPATH

SHAREGPT = Path("sharegpt") / "ShareGPT_V3_unfiltered_cleaned_split.head4000.json"


class WholeDecode:
    """The floor: the whole output decoded after every id (no stop strings)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = 0

    def add(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        end = len(text.rstrip(REPLACEMENT))
        out, self.sent = text[self.sent : end], max(self.sent, end)
        return out


def per_token_us(make: Any, ids: list[int], rounds: int) -> tuple[float, str]:
    """Best of `rounds` runs: microseconds per id, and the text released."""
    best, text = float("inf"), ""
    for _ in range(rounds):
        detok = make()
        t0 = time.perf_counter()
        pieces = [detok.add(t) for t in ids]
        best = min(best, (time.perf_counter() - t0) / len(ids) * 1e6)
        text = "".join(p if isinstance(p, str) else p[0] for p in pieces)
    return best, text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    p.add_argument(
        "--lengths", default="64,512,2048", help="output lengths in tokens [%(default)s]"
    )
    p.add_argument("--rounds", type=int, default=3, help="runs per length, best kept [%(default)s]")
    args = p.parse_args(argv)
    args.lengths = [int(n) for n in args.lengths.split(",") if n.strip()]
    if not args.lengths or min(args.lengths) < 1 or args.rounds < 1:
        p.error(
            f"--lengths must be counts >= 1 and --rounds >= 1, got {args.lengths}, {args.rounds}"
        )
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from transformers import LlamaTokenizer

    data = default_data_dir()
    tok = LlamaTokenizer.from_pretrained((data / LLAMA2_RELPATH).parent)
    convs = json.loads((data / SHAREGPT).read_text())
    replies = [t["value"] for c in convs[:200] for t in c["conversations"] if t["from"] == "gpt"]
    ids = tok.encode(" ".join(replies), add_special_tokens=False)
    print(
        f"{'tokens':>7} | {'whole decode':>12} {'incremental':>11} | {'ratio':>6}  (us per token)"
    )
    for n in args.lengths:
        out = ids[:n]
        whole, text_w = per_token_us(lambda: WholeDecode(tok), out, args.rounds)
        inc, text_i = per_token_us(lambda: Detokenizer(tok), out, args.rounds)
        assert text_i.rstrip(REPLACEMENT) == text_w, "the two released different text"
        print(f"{n:>7} | {whole:>12.1f} {inc:>11.1f} | {whole / inc:>5.1f}x")


if __name__ == "__main__":
    main()
