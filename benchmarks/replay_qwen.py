"""Replay of the real traces with the Qwen3.5 / Qwen3-Next cost models, next to the paper's
7B hybrid measured in the same run.

For each model: the bytes of one cached state (every Gated DeltaNet / SSM layer's recurrent
and conv state), the KV bytes of one token and their ratio, i.e. how many tokens of KV one
state costs. For each trace, cache size and system (vllm+, sglang+, marconi, marconi+ by
default): the token hit rate, the alpha marconi's tuner settled on, states admitted,
evictions, and the budget counted in states of that model.

    .venv/bin/python benchmarks/replay_qwen.py                   # defaults: 64 runs, ~2 min
    .venv/bin/python benchmarks/replay_qwen.py --unit states --sharegpt-sizes 25,125 \
        --swe-sizes 250,600                                      # same number of states

Writes OUT/replay_qwen.json (every run's record, the oracle per trace, the model table),
OUT/replay_qwen.md (the tables as printed) and OUT/hit_rates.png. Needs the shared data
folder (../shared/data or $MARCONI_DATA_DIR).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tqdm import tqdm

from marconi_ray.core.cache.systems import get_system
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.model.model_spec import ModelSpec
from marconi_ray.core.model.presets import PRESETS, get_preset
from marconi_ray.core.sim.replay import RunConfig, oracle_record, replay_sweep
from marconi_ray.traces.registry import load_trace

GB = 10**9
DEFAULT_MODELS = "paper-7b,qwen3.5-27b,qwen3.5-35b-a3b,qwen3-next-80b-a3b"
DEFAULT_SYSTEMS = "vllm+,sglang+,marconi,marconi+"
TRACES = ("sharegpt", "swebench")


def build_parser(
    description: str = __doc__.split("\n\n")[0],
    *,
    models: str = DEFAULT_MODELS,
    systems: str = DEFAULT_SYSTEMS,
    traces: str = ",".join(TRACES),
    sharegpt_sizes: str = "2,10",
    swe_sizes: str = "20,50",
    jobs: int = 2,
    out: str = "benchmarks/results/qwen_replay",
) -> argparse.ArgumentParser:
    """The command line of a replay of the real traces over presets; the keywords are its
    defaults (`benchmarks/replay_fleet.py` reuses it with its own)."""
    parser = argparse.ArgumentParser(
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--models",
        default=models,
        help=f"comma-separated presets to replay with (known: {', '.join(PRESETS)})",
    )
    parser.add_argument(
        "--systems",
        default=systems,
        help="comma-separated caching systems (as `marconi-ray replay --systems` takes them)",
    )
    parser.add_argument(
        "--traces",
        default=traces,
        help="comma-separated traces: sharegpt (the artifact's construction) and/or swebench "
        "(50 mini-swe-agent trajectories)",
    )
    parser.add_argument(
        "--unit",
        choices=("gb", "states"),
        default="gb",
        help="what the sizes count: GB (10^9 bytes, the same budget for every model) or "
        "states (each model gets that many of its own states' bytes)",
    )
    parser.add_argument(
        "--sharegpt-sizes",
        default=sharegpt_sizes,
        help="comma-separated cache sizes for ShareGPT, in --unit",
    )
    parser.add_argument(
        "--swe-sizes",
        default=swe_sizes,
        help="comma-separated cache sizes for the SWE-bench trace, in --unit",
    )
    parser.add_argument(
        "--sessions", type=int, default=100, help="ShareGPT sessions (conversations) replayed"
    )
    parser.add_argument(
        "--sessions-per-second",
        type=float,
        default=1.0,
        help="ShareGPT session arrival rate (sets how conversations interleave)",
    )
    parser.add_argument("--jobs", type=int, default=jobs, help="worker processes for the runs")
    parser.add_argument("--out", default=out, help="output folder (created)")
    return parser


def parse_args(
    argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None
) -> argparse.Namespace:
    """Parse and check `argv` with `parser` (default: `build_parser()`): lists split on
    commas, presets and systems looked up (ValueError naming an unknown one), sizes
    positive (SystemExit otherwise); `args.sizes` maps each trace to its sizes."""
    parser = build_parser() if parser is None else parser
    args = parser.parse_args(argv)
    for name in ("models", "systems", "traces"):
        setattr(args, name, [x for x in getattr(args, name).split(",") if x])
    for name in args.models:
        get_preset(name)  # ValueError naming an unknown preset
    for name in args.systems:
        get_system(name)
    for name in args.traces:
        if name not in TRACES:
            parser.error(f"--traces: unknown trace {name!r}; known: {', '.join(TRACES)}")
    args.sizes = {
        "sharegpt": sizes(parser, "--sharegpt-sizes", args.sharegpt_sizes),
        "swebench": sizes(parser, "--swe-sizes", args.swe_sizes),
    }
    if args.jobs < 1 or args.sessions < 1 or args.sessions_per_second <= 0:
        parser.error("--jobs and --sessions must be >= 1, --sessions-per-second > 0")
    return args


def sizes(parser: argparse.ArgumentParser, flag: str, text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x]
    except ValueError:
        parser.error(f"{flag}: not a list of numbers: {text!r}")
    if not values or any(v <= 0 for v in values):
        parser.error(f"{flag}: sizes must be positive numbers, got {text!r}")
    return values


def model_row(spec: ModelSpec) -> dict[str, Any]:
    """What one state and one token of KV cost for `spec`."""
    linear, quadratic = spec.flops_coeffs()
    return {
        "model": spec.name,
        "ssm_layers": spec.n_ssm,
        "attention_layers": spec.n_attention,
        "state_bytes": spec.ssm_state_bytes,
        "recurrent_bytes": spec.ssm_recurrent_bytes,
        "conv_bytes": spec.ssm_conv_bytes,
        "kv_bytes_per_token": spec.kv_bytes_per_token,
        # a pure SSM keeps no KV: one state is worth any number of tokens of it
        "tokens_of_kv_per_state": (
            spec.ssm_state_bytes / spec.kv_bytes_per_token if spec.kv_bytes_per_token else math.inf
        ),
        "flops_per_token_linear": linear,
        "flops_quadratic_coeff": quadratic,
    }


def capacity(spec: ModelSpec, size: float, unit: str) -> int:
    return int(size * GB) if unit == "gb" else int(size * spec.ssm_state_bytes)


def size_label(size: float, unit: str) -> str:
    return f"{size:g} GB" if unit == "gb" else f"{size:g} states"


def replay(args: argparse.Namespace) -> dict[str, Any]:
    specs = {name: get_preset(name) for name in args.models}
    report: dict[str, Any] = {
        "models": [model_row(s) for s in specs.values()],
        "unit": args.unit,
        "systems": args.systems,
        "traces": {},
    }
    for trace in args.traces:
        options = (
            {"n_sessions": args.sessions, "sessions_per_second": args.sessions_per_second}
            if trace == "sharegpt"
            else {}
        )
        requests = list(load_trace(trace, **options).requests)
        runs: list[dict[str, Any]] = []
        for name, spec in specs.items():
            cost = CostModel.from_spec(spec)
            configs = [
                RunConfig(system, capacity(spec, size, args.unit))
                for size in args.sizes[trace]
                for system in args.systems
            ]
            with tqdm(total=len(configs), desc=f"{trace} {name}", leave=False) as bar:
                results = replay_sweep(
                    requests, cost, configs, jobs=args.jobs, on_result=lambda _: bar.update()
                )
            labels = [size_label(s, args.unit) for s in args.sizes[trace] for _ in args.systems]
            for label, result in zip(labels, results, strict=True):
                record = result.to_record()
                record.update(
                    model=name,
                    cache=label,
                    states_in_budget=result.cache_bytes / spec.ssm_state_bytes,
                )
                runs.append(record)
        n_in = sum(len(r.input_tokens) for r in requests)
        report["traces"][trace] = {
            "requests": len(requests),
            "mean_input_tokens": n_in / len(requests),
            "oracle": oracle_record(requests),
            "runs": runs,
        }
    return report


def state_in_tokens(value: float) -> str:
    """One state in tokens of KV, or "no KV" for a model that keeps none (a pure SSM)."""
    return "no KV" if math.isinf(value) else f"{value:,.0f}"


def tables(report: dict[str, Any]) -> str:
    """The model table and one hit-rate table per trace, as markdown."""
    lines = [
        "| model | GDN/SSM + attention layers | one state | KV per token | "
        "one state = tokens of KV | linear GFLOPs per token |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in report["models"]:
        lines.append(
            f"| {m['model']} | {m['ssm_layers']} + {m['attention_layers']} | "
            f"{m['state_bytes'] / 1e6:.1f} MB | {m['kv_bytes_per_token'] / 1024:g} KiB | "
            f"{state_in_tokens(m['tokens_of_kv_per_state'])} | "
            f"{m['flops_per_token_linear'] / 1e9:.1f} |"
        )
    systems = report["systems"]
    for trace, data in report["traces"].items():
        oracle = 100 * float(data["oracle"]["token_hit_rate"])
        lines += [
            "",
            f"{trace}: {data['requests']:,} requests, mean input "
            f"{data['mean_input_tokens']:,.0f} tokens; token hit rate (%), oracle {oracle:.2f}%"
            " (alpha marconi picked)",
            "",
            "| model | cache | states it holds | " + " | ".join(systems) + " |",
            "| --- | --- | --- | " + " | ".join("---" for _ in systems) + " |",
        ]
        by = {(r["model"], r["cache"], r["system"]): r for r in data["runs"]}
        keys = list(dict.fromkeys((r["model"], r["cache"]) for r in data["runs"]))
        for model, cache in keys:
            row = [by[(model, cache, s)] for s in systems]
            cells = [
                f"{100 * r['token_hit_rate']:.2f}"
                + (f" ({r['alpha']:.1f})" if r["system"] == "marconi" else "")
                for r in row
            ]
            held = row[0]["states_in_budget"]
            lines.append(f"| {model} | {cache} | {held:,.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """One panel per (trace, cache size): bars of token hit rate per model and system."""
    panels = [
        (trace, cache)
        for trace, data in report["traces"].items()
        for cache in dict.fromkeys(r["cache"] for r in data["runs"])
    ]
    fig = Figure(figsize=(4.2 * len(panels), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    models = [m["model"] for m in report["models"]]
    systems = report["systems"]
    width = 0.8 / len(systems)
    for k, (trace, cache) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        rate = {
            (r["model"], r["system"]): 100 * r["token_hit_rate"]
            for r in report["traces"][trace]["runs"]
            if r["cache"] == cache
        }
        for j, system in enumerate(systems):
            xs = [i + (j - (len(systems) - 1) / 2) * width for i in range(len(models))]
            ax.bar(xs, [rate[(m, system)] for m in models], width, label=system)
        oracle = 100 * float(report["traces"][trace]["oracle"]["token_hit_rate"])
        ax.axhline(oracle, linestyle="--", color="black", linewidth=1)
        ax.set_xticks(range(len(models)), models, rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, 100)
        ax.set_title(f"{trace}, {cache}", fontsize=10)
        if k == 0:
            ax.set_ylabel("token hit rate (%)")
            ax.legend(fontsize=8)
    fig.savefig(path, format="png", dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = replay(args)
    text = tables(report)
    (out / "replay_qwen.json").write_text(json.dumps(report, indent=1, default=float))
    (out / "replay_qwen.md").write_text(text)
    plot(report, out / "hit_rates.png")
    sys.stdout.write(text)
    sys.stdout.write(f"wrote {out}/replay_qwen.json, replay_qwen.md and hit_rates.png\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
