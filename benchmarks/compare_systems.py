"""The end-to-end comparison of the caching systems on our service (formerly the body of
`marconi-loadgen compare`, which now forwards here; see `loadgen/compare.py`).

    python benchmarks/compare_systems.py --out runs/cmp [options]   # --help: every option
    marconi-loadgen compare --out runs/cmp [options]                # the same, from a checkout

One local Ray instance; for each system in turn our service is deployed (its own app,
coordinator and tuner), the SAME `LoadConfig` is run against it over HTTP (`prompt_mode
tokens`, the model's vocabulary, `history live`), its run is written under
`OUT/<system>/`, and it is torn down before the next one. Beside each measured hit rate
stands the replay simulator's prediction over exactly the requests that system served
(their input/output ids, in completion order) with the live cache's cost model and
capacity. Concurrent requests interleave plans and commits, which the simulator (one
request at a time) does not do, and the live tuner adopts alpha asynchronously: the two
hit rates can differ slightly under load; with one request at a time they are equal.

Writes `OUT/compare.json`, `OUT/compare.md`, `OUT/ttft_cdf.png`, `OUT/ttft_by_turn.png`.

The deployment (Ray, Serve, `ServeSettings`, the coordinator's cost model) lives here, on
the serving side; the load generator (`loadgen/`) only speaks HTTP (import-linter
contract "loadgen speaks HTTP only"): the load runs are `loadgen.runner.run_load`, the
report is `loadgen.compare_report.write_report`, given the cost model and the replay run
matching each deployment as plain values.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from loadgen.compare_report import SystemRun, markdown_table, parse_systems, write_report
from loadgen.config import LoadConfig
from loadgen.options import add_load_options, add_options, load_kwargs
from marconi_ray.core.cache.tuner import TunerConfig
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.sim.replay import RunConfig
from marconi_ray.serve.settings import ServeSettings

DEFAULT_SYSTEMS = "vanilla,vllm+,sglang+,marconi"
EXIT_USAGE = 2
# The program name shown in usage and errors; `marconi-loadgen compare` sets it when it
# forwards here (loadgen.compare.PROG_ENV, the same name).
PROG_ENV = "MARCONI_COMPARE_PROG"


@dataclass(frozen=True)
class CompareConfig:
    """One comparison: which systems, which service shape, and the one load run."""

    model: str
    systems: tuple[str, ...]
    cache_bytes: int
    out: Path
    load: LoadConfig
    tp: int = 1
    port: int = 8000
    max_batch: int = 8


def validate(args: argparse.Namespace) -> CompareConfig:
    """The options as a `CompareConfig` (the model is resolved, a preset built on first
    use); ValueError naming the bad value."""
    from loadgen.validate import validate_config
    from marconi_ray.serve.model_source import resolve_model

    systems = parse_systems(args.systems)
    for name, low in (("--cache-bytes", 1), ("--tp", 1), ("--max-batch", 1), ("--port", 1)):
        value = getattr(args, name[2:].replace("-", "_"))
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    if args.port > 65535:
        raise ValueError(f"--port must be <= 65535, got {args.port}")
    load = LoadConfig(
        url=f"http://127.0.0.1:{args.port}", prompt_mode="tokens", **load_kwargs(args)
    )
    validate_config(load)  # ValueError naming the field
    model_dir = resolve_model(args.model)
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    return CompareConfig(
        model=str(model_dir),
        systems=systems,
        cache_bytes=args.cache_bytes,
        out=Path(args.out),
        load=replace(load, vocab_size=vocab),
        tp=args.tp,
        port=args.port,
        max_batch=args.max_batch,
    )


# ---------------------------------------------------------------- the deployments
def settings_for(cfg: CompareConfig, system: str) -> ServeSettings:
    """Our service for one system of the comparison (its own app and actors)."""
    return ServeSettings(
        model_dir=cfg.model,
        model_name=Path(cfg.model).name,
        tp=cfg.tp,
        cache_bytes=cfg.cache_bytes,
        system=system,
        port=cfg.port,
        max_batch=cfg.max_batch,
        app_name=f"cmp-{system}",
    )


def sim_config(settings: ServeSettings, max_output: int | None = None) -> RunConfig:
    """The replay run matching a deployment: system, capacity, host tier, alpha and tuner
    window, and the output room each request's plan reserved (the load's `max_output`)."""
    t = settings.tuner
    tuner = TunerConfig(t.multiplier, tuple(t.grid), retune_every=t.retune_every)
    return RunConfig(
        settings.system,
        settings.cache_bytes,
        alpha=settings.alpha,
        tuner=tuner,
        max_output=max_output,
        host_bytes=settings.host_cache_bytes,
        host_gbps=settings.host_gbps,
        prefill_tflops=settings.prefill_tflops,
        placement=settings.host_placement,
    )


def serve_and_load(settings: ServeSettings, load: LoadConfig, progress: bool) -> SystemRun:
    """Deploy one system, run the load against it over HTTP, read its cost model from its
    coordinator, tear it down."""
    import ray
    from ray import serve

    from loadgen.runner import run_load
    from marconi_ray.serve.app import build_app, shutdown_app, start_actors
    from marconi_ray.serve.settings import NAMESPACE

    try:
        start_actors(settings)
        serve.run(build_app(settings), name=settings.app_name, route_prefix="/")
        coordinator = ray.get_actor(settings.coordinator_name, namespace=NAMESPACE)
        replicas: list[str] = ray.get(coordinator.replicas.remote())
        cost: CostModel = ray.get(coordinator.cost.remote(replicas[0]))
        result = run_load(replace(load, model=settings.model_name), progress=progress)
    finally:
        shutdown_app(settings)
    return SystemRun(result, cost, sim_config(settings, load.max_output))


def config_doc(cfg: CompareConfig) -> dict[str, Any]:
    """`compare.json`'s `config` (its `cost_model` is added by the report)."""
    return {
        **{k: v for k, v in asdict(cfg).items() if k not in ("load", "out")},
        "load": asdict(cfg.load),
    }


def compare(cfg: CompareConfig, progress: bool = True) -> dict[str, Any]:
    """The whole comparison on a local Ray started here (see the module docstring)."""
    import ray
    from ray import serve

    from loadgen.output import write_run
    from marconi_ray.cli.serve import cpus_needed
    from marconi_ray.serve.settings import NAMESPACE

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    first = settings_for(cfg, cfg.systems[0])
    started = not ray.is_initialized()
    if started:
        ray.init(
            address="local",
            num_cpus=max(os.cpu_count() or 1, cpus_needed(first)),
            include_dashboard=False,
            namespace=NAMESPACE,
            log_to_driver=False,
        )
    runs: dict[str, SystemRun] = {}
    try:
        serve.start(http_options={"host": first.host, "port": cfg.port})
        for system in cfg.systems:
            t0 = time.perf_counter()
            print(f"[compare] {system}: deploying and running the load", file=sys.stderr)
            runs[system] = serve_and_load(settings_for(cfg, system), cfg.load, progress)
            write_run(runs[system].result, cfg.out / system)
            print(f"[compare] {system}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    finally:
        if started:
            serve.shutdown()  # type: ignore[no-untyped-call]
            ray.shutdown()
    return write_report(runs, cfg.out, config_doc(cfg))


# ---------------------------------------------------------------- the command
def _bytes(text: str) -> int:
    return round(float(text))


# (flag, type, default, help); the help gets " [default]" appended when there is one.
OPTIONS: tuple[tuple[str, Any, Any, str], ...] = (
    ("--model", str, "small", "model folder or preset (tiny, small, tiny:bamba)"),
    ("--systems", str, DEFAULT_SYSTEMS, "comma-separated caching systems, run in this order"),
    ("--cache-bytes", _bytes, 250_000_000, "prefix-cache budget per replica, bytes (KV + SSM)"),
    ("--tp", int, 1, "tensor-parallel ranks per replica"),
    ("--port", int, 8000, "HTTP port the service listens on (127.0.0.1)"),
    ("--max-batch", int, 8, "most requests a replica decodes together"),
)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command's parser (`func=run`); `prog` names it in usage and errors (default:
    $MARCONI_COMPARE_PROG, else the script's name)."""
    p = argparse.ArgumentParser(
        prog=prog or os.environ.get(PROG_ENV) or None,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="output folder (one subfolder per system)")
    add_options(p, OPTIONS)
    add_load_options(p, rate_default=0.1)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run, prog=p.prog)
    return p


def run(args: argparse.Namespace) -> int:
    """Validate, compare, print the table and the headline ratios; 0 (2 on bad input)."""
    try:
        cfg = validate(args)
    except ValueError as exc:
        print(f"{args.prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    doc = compare(cfg, progress=not args.no_progress)
    print(markdown_table(doc["systems"]))
    for line in doc["relative"]:
        print(line)
    print(f"wrote {cfg.out / 'compare.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]) and run; the exit code (2: bad arguments, an
    unknown trace, missing data; one line naming the value)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"{args.prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return code


if __name__ == "__main__":
    sys.exit(main())
