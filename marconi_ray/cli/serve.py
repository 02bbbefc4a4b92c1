"""`marconi-ray serve`: deploy the OpenAI-compatible service on Ray Serve and block.

Settings come from an optional YAML file (`serve.config.ServeConfig`; no file: every
default), with the flags here applied on top. A bad key or value ends the command with
one line and exit code 2 before Ray starts. Otherwise it connects to Ray (the cluster
`ray start` made, or `RAY_ADDRESS`; else a local instance declaring enough logical CPUs
for the deployment), deploys with `serve.app.run_app`, prints the URL and ready-to-paste
client examples, and serves until SIGINT/SIGTERM, then tears the deployment down
(`serve.app.shutdown_app`) and disconnects. Ray and torch are imported only in `run`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import threading
from collections.abc import Sequence
from typing import Any

from marconi_kernels.choices import KERNEL_CHOICES
from marconi_ray.cli import values
from marconi_ray.core.cache.systems import SYSTEMS
from marconi_ray.serve.config import ServeConfig, config_from_mapping, load_serve_config
from marconi_ray.serve.coordinator.routing.routers import DEFAULT_ROUTING, ROUTERS
from marconi_ray.serve.ingress.tools.registry import SETTINGS as TOOL_PARSERS
from marconi_ray.serve.settings import NAMESPACE, ServeSettings

_FLAG_KEYS = (
    "model",
    "port",
    "host",
    "tp",
    "replicas",
    "prefill_replicas",
    "decode_replicas",
    "transfer",
    "transfer_gbps",
    "remote_hits",
    "coordinators",
    "system",
    "cache_bytes",
    "host_cache_bytes",
    "host_placement",
    "kv_memory_bytes",
    "kv_memory_fraction",
    "routing",
    "kernels",
    "tool_call_parser",
)


def add_parser(subparsers: Any) -> None:
    """Register the `serve` subcommand."""
    p = subparsers.add_parser(
        "serve",
        help="serve a hybrid model with Marconi prefix caching (OpenAI API on Ray Serve)",
        description="Deploy an OpenAI-compatible endpoint (/v1/chat/completions, "
        "/v1/completions, /v1/models) on Ray Serve: a cache coordinator, an alpha tuner "
        "and model replicas of tensor-parallel shards. Flags override the config file; "
        "without a file every setting has its default (see configs/serve-tiny.yaml). "
        "Stop with Ctrl-C.",
    )
    p.add_argument(
        "config",
        nargs="?",
        metavar="CONFIG.yaml",
        help="serve config file (YAML; see configs/serve-tiny.yaml for every key)",
    )
    p.add_argument(
        "--model",
        metavar="M",
        help="model folder (with config.json), the packaged trained model chat (what "
        "`make run` serves), preset: tiny, small, or preset:family such as tiny:bamba, "
        "built on first use (default: tiny), or Hugging Face id "
        "ORG/NAME[@REVISION] (from the Hugging Face cache; downloaded unless HF_HUB_OFFLINE=1)",
    )
    p.add_argument("--port", type=int, metavar="P", help="HTTP port (default: 8000)")
    p.add_argument("--host", metavar="H", help="HTTP bind address (default: 127.0.0.1)")
    p.add_argument(
        "--tp", type=int, metavar="N", help="tensor-parallel ranks per replica (default: 1)"
    )
    p.add_argument("--replicas", type=int, metavar="N", help="model replicas (default: 1)")
    p.add_argument(
        "--system",
        type=values.system,
        metavar="NAME",
        help=f"caching system: {', '.join(sorted(SYSTEMS))}, or marconi+:B (speculative "
        "checkpoints at B * 2**k tokens) (default: marconi)",
    )
    p.add_argument(
        "--cache-bytes",
        metavar="B",
        help="prefix-cache budget per replica in bytes, e.g. 1e9 (default: 1e9)",
    )
    p.add_argument(
        "--host-cache-bytes",
        metavar="B",
        help="host-memory tier of the prefix cache in bytes per replica and per TP rank, "
        "e.g. 8e9: device evictions are demoted there and promoted back on a hit; the "
        "start is refused when a model node's free memory cannot hold tp x B "
        "(default: 0, no host tier)",
    )
    p.add_argument(
        "--host-placement",
        choices=("flop_aware", "lru"),
        help="what a device eviction does with a host tier: flop_aware demotes a victim "
        "only when a hit on it saves more prefill time than copying it back costs "
        "(host_gbps, prefill_tflops in the config), else drops it; lru demotes every "
        "victim (default: flop_aware)",
    )
    p.add_argument(
        "--kv-memory-bytes",
        metavar="B",
        help="size each shard's device KV pool once at start from B bytes per TP rank, "
        "e.g. 4e9: the cache's budget inside it, the rest bounding the running requests' "
        "rows (a burst waits for rows instead of running out of memory); the setting for "
        "CPU (default: none, the pool grows as needed)",
    )
    p.add_argument(
        "--kv-memory-fraction",
        metavar="F",
        type=float,
        help="as --kv-memory-bytes, from this fraction (0-1] of each GPU's free memory "
        "after the weights load, like vLLM's --gpu-memory-utilization of what is left, "
        "e.g. 0.85; CUDA only (default: none)",
    )
    p.add_argument(
        "--tool-call-parser",
        choices=TOOL_PARSERS,
        help="how tool calls are read from chat replies: auto picks by the model's chat "
        "template (qwen3_coder when it writes <function=, else hermes); hermes reads "
        "<tool_call>{json}</tool_call> blocks (Qwen2.5/3, Hermes, our presets), qwen3_coder "
        "the XML calls of Qwen3.5 / Qwen3-Next / Qwen3-Coder templates, json_list a JSON list "
        "of {name, arguments} (default: auto)",
    )
    p.add_argument(
        "--prefill-replicas",
        type=int,
        metavar="P",
        help="replicas that prefill prompts (with their own caches) and hand the entry at "
        "the prompt's end to a decode replica; needs --decode-replicas; --replicas "
        "defaults to P + D (default: 0, mixed replicas)",
    )
    p.add_argument(
        "--decode-replicas",
        type=int,
        metavar="D",
        help="replicas that decode, each caching the state after its turns' last decoded "
        "token; a next turn is prefilled there when its suffix is short, or its hit is "
        "pulled to a prefill replica, whichever the cost model prices lower (default: 0)",
    )
    p.add_argument(
        "--transfer",
        choices=["auto", "nixl", "nccl", "gloo", "object_store"],
        help="how cache entries move between replicas over Ray Direct Transport: auto "
        "(NIXL where installed, else NCCL on CUDA, GLOO on CPU), or the one named; "
        "object_store goes through Ray's object store (default: auto)",
    )
    p.add_argument(
        "--transfer-gbps",
        type=float,
        metavar="GB/S",
        help="link speed a move is priced at against recomputing its tokens at "
        "--prefill-tflops' speed (default: 50, one 400 Gb/s link)",
    )
    p.add_argument(
        "--remote-hits",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mixed replicas pull a deeper cached prefix held by another replica when that "
        "beats recomputing it (default: off)",
    )
    p.add_argument(
        "--coordinators",
        type=int,
        help="coordinator actors in the group, each owning a share of the replicas; an "
        "ingress plans each request at the one the prompt's leading tokens hash to "
        "(default: 1)",
    )
    p.add_argument(
        "--routing",
        choices=sorted(ROUTERS),
        help="how requests are spread over replicas: cache_aware weighs the prefill FLOPs "
        "each replica's cached prefix saves against its queue and keeps a session on the "
        "replica holding its last state; round_robin cycles; least_loaded picks the "
        f"fewest open requests (default: {DEFAULT_ROUTING})",
    )
    p.add_argument(
        "--speculative",
        metavar="METHOD",
        help="speculative decoding in every shard: ngram drafts what followed the latest "
        "earlier occurrence of the last 2-4 tokens (prompt lookup); mtp drafts with the "
        "checkpoint's multi-token-prediction layers (Qwen3.5 / Qwen3-Next); draft:MODEL "
        "has a small model with the same tokenizer draft (MODEL as --model takes it, "
        "e.g. draft:chat); "
        "drafts are verified k + 1 positions in one forward; greedy output is unchanged "
        "(default: off)",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        metavar="K",
        help="with --speculative: tokens drafted per step at most, 1-16 (default: 4)",
    )
    p.add_argument(
        "--kernels",
        choices=KERNEL_CHOICES,
        help="kernels of the shards (SSM scans, convs, decode attention): auto (Triton on "
        "CUDA when installed, else the "
        "torch references, logged), ref, or triton (fails the shard's set-up with the reason "
        "when it cannot run) (default: auto)",
    )
    p.set_defaults(func=run)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out = {key: value for key in _FLAG_KEYS if (value := getattr(args, key, None)) is not None}
    method, k = getattr(args, "speculative", None), getattr(args, "num_speculative_tokens", None)
    if method is not None:
        out["speculative"] = {
            "method": method,
            **({} if k is None else {"num_speculative_tokens": k}),
        }
    elif k is not None:
        raise ValueError("--num-speculative-tokens needs --speculative")
    return out


def load_config(args: argparse.Namespace) -> ServeConfig:
    """The `ServeConfig` of the file (if any) with the flags applied (ValueError /
    FileNotFoundError naming the bad key or file)."""
    overrides = _overrides(args)
    if args.config is None:
        return config_from_mapping({}, "defaults and flags", overrides)
    return load_serve_config(args.config, overrides)


def cpus_needed(settings: ServeSettings) -> int:
    """Logical CPUs the deployment asks for: ingress, one per replica and per shard,
    the coordinator and the tuner's workers."""
    return 1 + settings.replicas * (1 + settings.tp) + 1 + settings.tuner.workers


def client_examples(settings: ServeSettings) -> str:
    """The base URL plus a `curl` and an `openai` client example, ready to paste."""
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    base = f"http://{host}:{settings.port}/v1"
    body = {
        "model": settings.model_name,
        "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": 32,
    }
    auth = ' -H "Authorization: Bearer $MARCONI_API_KEY"' if settings.api_key else ""
    curl = (
        f"curl {base}/chat/completions -H 'Content-Type: application/json'{auth} "
        f"-d {shlex.quote(json.dumps(body))}"
    )
    key = 'os.environ["MARCONI_API_KEY"]' if settings.api_key else '"unused"'
    script = (
        ("import os\n" if settings.api_key else "") + "from openai import OpenAI\n"
        f'client = OpenAI(base_url="{base}", api_key={key})\n'
        "reply = client.chat.completions.create(\n"
        f'    model="{settings.model_name}",\n'
        '    messages=[{"role": "user", "content": "Hello!"}],\n'
        "    max_tokens=32,\n"
        ")\n"
        "print(reply.choices[0].message.content)"
    )
    return (
        f"serving {settings.model_name!r} at {base}\n\n"
        f"curl:\n  {curl}\n\n"
        f"openai client (python):\n{script}\n\n"
        "Ctrl-C to stop."
    )


def _starts_local_ray() -> bool:
    """True when `ray.init()` would start a new local instance (no `RAY_ADDRESS`, no
    cluster started with `ray start`)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:  # private API moved: assume a local start
        return not os.environ.get("RAY_ADDRESS")
    address: Any = None  # "find one": RAY_ADDRESS, then the `ray start` cluster file
    try:
        return canonicalize_bootstrap_address(address) is None
    except Exception:  # unreadable cluster file etc.: let ray.init report it
        return False


log = logging.getLogger(__name__)


def _init_ray(settings: ServeSettings) -> bool:
    """Connect to Ray unless connected; True when this call connected.

    A local instance started here keeps Ray's token authentication on (its default for
    local instances since 2.59; a warning when `RAY_AUTH_MODE=disabled`): Ray 2.60 binds
    its GCS, raylet and worker gRPC ports on every interface and resolves a loopback node
    address to the machine's own (`services.resolve_ip_for_localhost`), so the token is
    what guards them. The token file is made readable by its owner only. A cluster
    address (`RAY_ADDRESS`, `ray start`) is used as it is."""
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"namespace": NAMESPACE, "ignore_reinit_error": True}
    local = _starts_local_ray()
    if local:
        kwargs["num_cpus"] = max(os.cpu_count() or 1, cpus_needed(settings))
        if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
            log.warning(
                "RAY_AUTH_MODE=disabled: the local Ray's ports (GCS, raylet, workers; bound "
                "on every interface) accept anyone who can reach this machine"
            )
    ray.init(**kwargs)
    if local:
        _owner_only(os.path.expanduser("~/.ray/auth_token"))
    return True


def _owner_only(path: str) -> None:
    """chmod 600 `path` if it exists (best effort: a failure is logged)."""
    try:
        if os.path.exists(path):
            os.chmod(path, 0o600)
    except OSError as exc:
        log.warning("could not restrict %s to its owner: %s", path, exc)


def _wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM, restoring the previous handlers afterwards."""
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    try:
        for sig in previous:
            signal.signal(sig, handler)
        while not stop.wait(0.5):
            pass
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Validate the config, deploy, print how to call it, serve until a signal; 0."""
    config = load_config(args)
    settings = config.to_settings()  # builds a preset model on first use (torch)
    import ray

    from marconi_ray.serve.app import run_app, shutdown_app

    connected = _init_ray(settings)
    try:
        run_app(settings)
        print(client_examples(settings), flush=True)
        _wait_for_signal()
        print("stopping...", flush=True)
    except KeyboardInterrupt:  # Ctrl-C while deploying
        print("interrupted; stopping...", flush=True)
    finally:
        try:
            shutdown_app(settings)
        finally:
            if connected:
                ray.shutdown()
    return 0
