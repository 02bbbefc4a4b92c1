"""Tensor parallelism at world size 2 on CPU: two spawned processes joined by gloo, each
running one `TPGroup` rank, compared with world size 1 computed in the test process.

One spawn serves the whole module (a module-scoped fixture): the children run every job
in the same order (they must: each job's collectives pair up across ranks), put each
job's result, or their traceback on the first error, on a queue, and exit. The parent
fails the test with a child's traceback, a child's exit code, or a timeout; it never
waits on a child without a deadline.

Cache byte accounting at TP > 1: `cache_bytes` budgets one device. Each rank's prefix
cache prices a token's KV and a checkpoint's SSM states at what that rank's store really
holds: `n_kv_heads / world` KV heads per attention block, and per Mamba-2 block
`heads / world` recurrent states plus a conv state over
`d_inner / world + 2 * (n_groups / world or n_groups) * d_state` channels (Mamba-1:
`d_inner / world` channels of both; an LFM2 short conv: a conv window over
`hidden_size / world` channels and no recurrent state; a MiniMax lightning layer:
`heads / world` recurrent states and no conv state). So on every rank `store.bytes_used ==
cache.bytes_used <= cache_bytes` after every request; when everything splits evenly a
rank's per-token and per-state bytes are exactly the whole model's / world, and with
replicated B/C groups (n_groups % world != 0) a state costs
`2 * n_groups * d_state * d_conv * dtype_bytes` more per Mamba-2 block than that.
"""

from __future__ import annotations

import dataclasses
import queue as queue_mod
import socket
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from engine_helpers import GREEDY, prompts
from llguidance import LLMatcher

from marconi_ray.core.model.hf.parse import spec_from_hf_config
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.loader import load_model, read_config
from marconi_ray.engine.model.parallel import TPGroup
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.engine.presets.mtp_weights import add_mtp_weights
from marconi_ray.engine.spec.drafters import OracleDrafter
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.protocol.speculative import SpeculativeConfig

pytestmark = pytest.mark.slow

WORLD = 2
TOL = 1e-4
PROMPT_LEN = 45
DEADLINE_S = 120.0
LOGIT_MODELS = (
    "nemotron_h",
    "bamba",
    "jamba",
    "nemotron_h_g1",
    "qwen3_5_moe_text",
    "qwen3_next",
    "falcon_h1",
    "zamba2",
    "lfm2",
    "lfm2_moe",
    "nemotron_h_moe",
    "granitemoehybrid",
    "mamba",
    "falcon_mamba",
    "mamba2",
    "olmo_hybrid",
    "recurrent_gemma",
    "kimi_linear",
    "minimax",
    "bailing_hybrid",
    "lfm3",
    "xlstm",
)
# Per-device budgets (bytes, as each rank's cache counts them) that force evictions in the
# conversation below yet keep the last turn's final state (so the last prompt is fully
# cached): about 3/4 to 9/10 of what one rank would hold with no eviction.
CACHE_BYTES = {
    "nemotron_h": 125_000,
    "bamba": 125_000,
    "jamba": 96_000,
    "nemotron_h_g1": 130_000,
    "qwen3_next": 232_000,
    "falcon_h1": 180_000,
    "zamba2": 354_000,
    "lfm2": 59_000,
    "minimax": 85_000,
}
ENGINE_MODELS = tuple(CACHE_BYTES)
SPEC_MODELS = ("nemotron_h", "qwen3_next", "lfm2")
"""Families whose TP=2 engine also runs with speculative decoding (Mamba-2, Gated
DeltaNet, short convolutions)."""
MTP_MODELS = ("qwen3_next", "nemotron_h_moe")
"""Families whose TP=2 engine also drafts with its MTP layers (heads and experts split)."""


# ---------------------------------------------------------------------- models
@pytest.fixture(scope="module")
def nemotron_g1_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny NemotronH shape with n_groups=1: at TP=2 the B/C conv channels are
    replicated and the gated norm's single group spans both ranks."""
    from transformers import NemotronHForCausalLM

    from marconi_ray.engine.presets.factory import _separate_logits, check_logit_separation
    from marconi_ray.engine.presets.family_configs import preset_config

    cfg = preset_config("tiny", "nemotron_h")
    cfg.n_groups = 1
    out = tmp_path_factory.mktemp("nemotron_h_g1")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = NemotronHForCausalLM(cfg).eval()
        _separate_logits(model, cfg.hidden_size)
        check_logit_separation(model)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def dirs(
    model_dirs: dict[str, Path], nemotron_g1_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """The tiny checkpoints, the n_groups=1 NemotronH, and MTP_MODELS' folders with
    random multi-token-prediction layers added (`<family>_mtp`)."""
    root = tmp_path_factory.mktemp("mtp_tp")
    mtp = {f"{f}_mtp": add_mtp_weights(make_model("tiny", f, root / f), seed=3) for f in MTP_MODELS}
    return {**model_dirs, "nemotron_h_g1": nemotron_g1_dir, **mtp}


# ---------------------------------------------------------------------- jobs (any rank)
def _prompt(name: str, vocab: int) -> list[int]:
    return prompts(LOGIT_MODELS.index(name) + 11, 1, PROMPT_LEN, vocab)[0]


def _logits_job(model_dir: str, ids: list[int], tp: TPGroup) -> np.ndarray:
    model = load_model(model_dir, tp=tp)
    return model.forward_logits(torch.tensor(ids)).numpy()


def _conversation_segments(seed: int) -> dict[str, list[list[int]]]:
    """New tokens for each turn of a conversation and for two branches off its start."""
    rng = np.random.default_rng(seed)

    def new(n: int) -> list[int]:
        return rng.integers(3, 259, n).tolist()

    return {"turns": [new(50), new(20), new(20), new(20)], "branches": [new(30), new(30)]}


def _run_conversation(engine: Engine, seed: int) -> list[dict[str, Any]]:
    """Turns (prompt = previous prompt + previous output + new tokens), two branches
    sharing the first 40 tokens, then the whole last turn (prompt + output) again: a
    prompt that is fully cached when its final state survived eviction. Returns, per
    request, the prompt, the tokens, the hit and the byte counts after it."""
    seg = _conversation_segments(seed)
    requests: list[list[int]] = []
    out: list[dict[str, Any]] = []

    def run(prompt: list[int]) -> list[int]:
        result = engine.generate(prompt, GREEDY)
        out.append(
            {
                "prompt": list(prompt),
                "tokens": list(result.tokens),
                "cached": result.usage.cached_tokens,
                "store_bytes": engine.store.bytes_used,
                "cache_bytes": engine.cache.bytes_used,
                "live_states": engine.store.live_states,
                "evictions": engine.cache.stats.evictions,
            }
        )
        return list(result.tokens)

    prompt: list[int] = []
    output: list[int] = []
    for new in seg["turns"]:
        prompt = prompt + output + new
        requests.append(prompt)
        output = run(prompt)
    for new in seg["branches"]:
        run(requests[0][:40] + new)
    run(prompt + output)
    return out


def _engine_job(model_dir: str, cache_bytes: int, seed: int, tp: TPGroup) -> dict[str, Any]:
    engine = Engine(model_dir, system="marconi", cache_bytes=cache_bytes, tp=tp)
    return {
        "requests": _run_conversation(engine, seed),
        "kv_bytes_per_token": engine.store.kv_bytes_per_token,
        "state_bytes": engine.store.state_bytes,
    }


def _spec_job(model_dir: str, seed: int, tp: TPGroup) -> dict[str, Any]:
    """The conversation without speculation, then again on a new engine with an oracle
    drafter (60% of its drafts right, from the first run's outputs): both runs' tokens
    and hits, and the drafts kept."""
    plain = _run_conversation(Engine(model_dir, system="marconi", tp=tp), seed)
    futures = {tuple(r["prompt"]): r["tokens"] for r in plain}
    vocab = read_config(model_dir)[0].vocab_size
    spec = Engine(
        model_dir,
        system="marconi",
        tp=tp,
        speculative=SpeculativeConfig(num_speculative_tokens=3),
        drafter=OracleDrafter(futures, 0.6, vocab),
    )
    runs = _run_conversation(spec, seed)
    return {
        "plain": [(r["tokens"], r["cached"]) for r in plain],
        "spec": [(r["tokens"], r["cached"]) for r in runs],
        "store_bytes": [r["store_bytes"] for r in runs],
        "plain_store_bytes": [r["store_bytes"] for r in plain],
        "kept": spec.worker.spec_stats.accepted,
        "drafted": spec.worker.spec_stats.drafted,
    }


def _mtp_job(model_dir: str, seed: int, tp: TPGroup) -> dict[str, Any]:
    """The conversation without speculation, then drafting with the folder's MTP layers
    (never backing off): both runs' tokens and hits, and the drafts made and kept."""
    plain = _run_conversation(Engine(model_dir, system="marconi", tp=tp), seed)
    config = SpeculativeConfig(method="mtp", num_speculative_tokens=3, backoff=0)
    spec = Engine(model_dir, system="marconi", tp=tp, speculative=config)
    runs = _run_conversation(spec, seed)
    stats = spec.worker.spec_stats
    return {
        "plain": [(r["tokens"], r["cached"]) for r in plain],
        "spec": [(r["tokens"], r["cached"]) for r in runs],
        "drafts": (stats.drafted, stats.accepted, tuple(stats.drafted_at)),
    }


def _mixed_job(model_dir: str, seed: int, tp: TPGroup) -> dict[str, Any]:
    """Three requests at once, an oracle drafting (100%) for the first only: every step
    verifies it in the forward that decodes the other two (`decode_and_prefill`). The
    tokens with and without speculation, and the one-forward steps taken."""
    vocab = read_config(model_dir)[0].vocab_size
    batch = prompts(seed, 3, 30, vocab)
    plain = Engine(model_dir, system="marconi", tp=tp).generate_many(batch, [GREEDY] * 3)
    futures = {tuple(batch[0]): list(plain[0].tokens)}
    spec = Engine(
        model_dir,
        system="marconi",
        tp=tp,
        speculative=SpeculativeConfig(num_speculative_tokens=3, backoff=0),
        drafter=OracleDrafter(futures, 1.0, vocab),
    )
    mixed = []
    real = spec.worker.model.decode_and_prefill

    def counted(*args: Any) -> Any:
        mixed.append(len(args[2]))
        return real(*args)

    spec.worker.model.decode_and_prefill = counted  # type: ignore[method-assign]
    got = spec.generate_many(batch, [GREEDY] * 3)
    return {
        "plain": [list(r.tokens) for r in plain],
        "spec": [list(r.tokens) for r in got],
        "mixed_steps": len(mixed),
        "kept": spec.worker.spec_stats.accepted,
    }


SCHEMA_GRAMMAR = LLMatcher.grammar_from_json_schema(
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
        "required": ["n"],
        "additionalProperties": False,
    },
    overrides={"whitespace_flexible": False},
)


def _grammar_job(model_dir: str, seed: int, tp: TPGroup) -> dict[str, Any]:
    """Constrained requests (a JSON schema) with speculation: an oracle drafting the
    constrained run's tokens, 70% of them right (the wrong ones mostly refused by the
    grammar). Rank 0 masks the verified positions; the tokens with and without it."""
    vocab = read_config(model_dir)[0].vocab_size
    batch = prompts(seed, 2, 20, vocab)
    params = SamplingParams(max_tokens=40, temperature=0.0, grammar=SCHEMA_GRAMMAR)
    plain = Engine(model_dir, system="marconi", tp=tp).generate_many(batch, [params] * 2)
    futures = {tuple(p): list(r.tokens) for p, r in zip(batch, plain, strict=True)}
    spec = Engine(
        model_dir,
        system="marconi",
        tp=tp,
        speculative=SpeculativeConfig(num_speculative_tokens=3, backoff=0),
        drafter=OracleDrafter(futures, 0.7, vocab),
    )
    got = spec.generate_many(batch, [params] * 2)
    return {
        "plain": [list(r.tokens) for r in plain],
        "spec": [list(r.tokens) for r in got],
        "kept": spec.worker.spec_stats.accepted,
        "stopped": [r.finish_reason for r in got],
    }


# ---------------------------------------------------------------------- spawning
def _worker(rank: int, port: int, jobs: list[tuple[str, Any, tuple]], results: Any) -> None:
    """One rank: run `jobs` in order, putting (rank, name, "ok", result) per job, then
    (rank, None, "done", None); on any error (rank, name, "error", traceback)."""
    name = "init_process_group"
    try:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=WORLD,
            timeout=timedelta(seconds=60),
        )
        tp = TPGroup(rank, WORLD, None)
        for name, fn, args in jobs:
            results.put((rank, name, "ok", fn(*args, tp)))
        name = "destroy_process_group"
        dist.destroy_process_group()
        results.put((rank, None, "done", None))
    except BaseException:
        results.put((rank, name, "error", traceback.format_exc()))
        raise SystemExit(1) from None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_tp2(jobs: list[tuple[str, Any, tuple]], deadline_s: float = DEADLINE_S) -> dict:
    """Run `jobs` on WORLD spawned ranks; returns {job name: [result of each rank]}.

    Fails (pytest.fail) with a child's traceback, a child that died without reporting,
    or the deadline; every child still alive is killed on the way out."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, port, jobs, results), daemon=True)
        for r in range(WORLD)
    ]
    out: dict[str, list[Any]] = {}
    done: set[int] = set()
    end = time.monotonic() + deadline_s
    try:
        for p in procs:
            p.start()
        while len(done) < WORLD:
            left = end - time.monotonic()
            if left <= 0:
                pytest.fail(f"TP={WORLD} ranks timed out after {deadline_s}s; got {sorted(out)}")
            try:
                rank, name, status, payload = results.get(timeout=min(left, 0.5))
            except queue_mod.Empty:
                for r, p in enumerate(procs):
                    if r not in done and p.exitcode is not None:
                        pytest.fail(f"rank {r} exited with code {p.exitcode} without reporting")
                continue
            if status == "error":
                pytest.fail(f"rank {rank} failed in {name}:\n{payload}")
            if status == "done":
                done.add(rank)
            else:
                out.setdefault(name, [None] * WORLD)[rank] = payload
        for r, p in enumerate(procs):
            p.join(timeout=max(end - time.monotonic(), 5.0))
            assert p.exitcode == 0, f"rank {r} exit code {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        results.close()
        results.join_thread()
    return out


@pytest.fixture(scope="module")
def tp2(dirs: dict[str, Path]) -> dict[str, list[Any]]:
    """Every TP=2 job of the module, run by one spawn of two ranks."""
    jobs: list[tuple[str, Any, tuple]] = []
    for name in LOGIT_MODELS:
        vocab = read_config(dirs[name])[0].vocab_size
        jobs.append((f"logits:{name}", _logits_job, (str(dirs[name]), _prompt(name, vocab))))
    for i, name in enumerate(ENGINE_MODELS):
        jobs.append((f"engine:{name}", _engine_job, (str(dirs[name]), CACHE_BYTES[name], i)))
    for i, name in enumerate(SPEC_MODELS):
        jobs.append((f"spec:{name}", _spec_job, (str(dirs[name]), 40 + i)))
    for i, name in enumerate(MTP_MODELS):
        jobs.append((f"mtp:{name}", _mtp_job, (str(dirs[f"{name}_mtp"]), 50 + i)))
    for i, name in enumerate(SPEC_MODELS):
        jobs.append((f"mixed:{name}", _mixed_job, (str(dirs[name]), 60 + i)))
    jobs.append(("grammar:nemotron_h", _grammar_job, (str(dirs["nemotron_h"]), 70)))
    return run_tp2(jobs)


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", LOGIT_MODELS)
def test_tp2_logits_match_tp1(tp2, dirs, name):
    model = load_model(dirs[name])
    ref = model.forward_logits(torch.tensor(_prompt(name, model.cfg.vocab_size)))
    assert ref.shape[0] == PROMPT_LEN
    assert ref.std() > 0.5, "weights should give separated logits"
    for rank, got in enumerate(tp2[f"logits:{name}"]):
        diff = (torch.from_numpy(got) - ref).abs().max().item()
        assert diff <= TOL, f"rank {rank}: max abs diff {diff:.2e}"


@pytest.mark.parametrize(("name", "groups_split"), [("nemotron_h", True), ("nemotron_h_g1", False)])
def test_tp2_mamba2_shard_layout(dirs, name, groups_split):
    """A rank-0-of-2 shard (built without a process group: nothing communicates before a
    forward) splits B/C by groups when n_groups is even, else replicates them and makes
    the gated norm all-reduce across ranks; so the logits test above covers both paths."""
    cfg = read_config(dirs[name])[0]
    m = cfg.mamba2
    assert m is not None
    shard = HybridModel(cfg, TPGroup(0, WORLD))
    mixer = shard.blocks[shard.ssm_blocks[0]].mixer
    groups = m.n_groups // WORLD if groups_split else m.n_groups
    assert mixer.groups == groups
    assert mixer.conv_dim == m.d_inner // WORLD + 2 * groups * m.d_state
    assert mixer.heads == m.n_heads // WORLD
    assert mixer.norm.groups_local is groups_split


def test_tp2_short_conv_shard_layout(dirs):
    """A rank-0-of-2 LFM2 shard splits the short conv by channel: in_proj keeps its half of
    each of B, C and x, the conv and its state half of the D channels; out_proj reads that
    half (row-parallel). An odd width is refused by name."""
    cfg = read_config(dirs["lfm2"])[0]
    assert cfg.shortconv is not None
    shard = HybridModel(cfg, TPGroup(0, WORLD))
    mixer = shard.ssm(shard.ssm_blocks[0])
    half = cfg.hidden_size // WORLD
    assert mixer.in_proj.weight.shape == (3 * half, cfg.hidden_size)
    assert mixer.out_proj.weight.shape == (cfg.hidden_size, half)
    conv, ssm = mixer.empty_state(torch.device("cpu"))
    assert conv.shape == (half, cfg.shortconv.d_conv) and ssm.numel() == 0
    conv_only = dataclasses.replace(cfg, blocks=("shortconv",), hf_layer=(0,))
    with pytest.raises(ValueError, match=r"hidden_size \(short-conv channels\)=64"):
        conv_only.check_tp(3)


@pytest.mark.parametrize("name", ENGINE_MODELS)
def test_tp2_engine_matches_vanilla_tp1(tp2, dirs, name):
    """Marconi at TP=2 under a budget that evicts gives the tokens of an uncached TP=1
    engine on every request: cache hits (partial, at the branch point, and a fully cached
    prompt) resume exactly, and both ranks agree."""
    rank0, rank1 = (r["requests"] for r in tp2[f"engine:{name}"])
    assert [(r["tokens"], r["cached"]) for r in rank0] == [
        (r["tokens"], r["cached"]) for r in rank1
    ], "ranks diverged"
    vanilla = Engine(dirs[name], system="vanilla")
    for i, req in enumerate(rank0):
        ref = vanilla.generate(req["prompt"], GREEDY)
        assert list(ref.tokens) == req["tokens"], f"request {i}: TP=2 cached != TP=1 vanilla"
    hits = [r["cached"] for r in rank0]
    assert any(0 < h < len(r["prompt"]) for h, r in zip(hits, rank0, strict=True)), hits
    assert hits[-1] == len(rank0[-1]["prompt"]), "the last prompt should be fully cached"
    assert rank0[-1]["evictions"] > 0, "the budget should force evictions"


@pytest.mark.parametrize("name", ENGINE_MODELS)
def test_tp2_store_bytes_vs_cache_accounting(tp2, dirs, name):
    """See the module docstring: each rank's cache accounts exactly what its store holds,
    and a rank holds 1/world of the model's bytes, plus replicated B/C conv channels."""
    per_rank = tp2[f"engine:{name}"]
    cfg, raw = read_config(dirs[name])
    elem = 4  # float32
    spec = spec_from_hf_config(raw, dtype_bytes=elem)
    excess_per_state = 0
    if cfg.mamba2 is not None and cfg.mamba2.n_groups % WORLD:
        m = cfg.mamba2
        n_mamba2 = len(cfg.layers_of("mamba2"))
        excess_per_state = 2 * m.n_groups * m.d_state * m.d_conv * elem * n_mamba2 // WORLD
    for rank in per_rank:
        assert rank["kv_bytes_per_token"] * WORLD == spec.kv_bytes_per_token
        assert rank["state_bytes"] * WORLD == spec.ssm_state_bytes + WORLD * excess_per_state
    for i, reqs in enumerate(zip(*(r["requests"] for r in per_rank), strict=True)):
        for r in reqs:
            assert r["store_bytes"] == r["cache_bytes"], f"request {i}"
        assert reqs[0]["store_bytes"] == reqs[1]["store_bytes"], f"request {i}"


@pytest.mark.parametrize("name", SPEC_MODELS)
def test_tp2_speculation_is_exact_and_ranks_agree(tp2, name):
    """Speculative decoding at TP=2: the ranks agree on every accepted length (rank 0's
    tokens are broadcast), and the greedy tokens, the cached tokens per request and the
    bytes stored equal the run without speculation."""
    rank0, rank1 = tp2[f"spec:{name}"]
    assert rank0["spec"] == rank1["spec"], "ranks diverged"
    assert rank0["spec"] == rank0["plain"]
    assert rank0["store_bytes"] == rank0["plain_store_bytes"]
    assert 0 < rank0["kept"] < rank0["drafted"], (rank0["kept"], rank0["drafted"])


@pytest.mark.parametrize("name", MTP_MODELS)
def test_tp2_mtp_drafting_is_exact_and_ranks_draft_alike(tp2, name):
    """MTP drafting at TP=2 (the layers' heads and experts split like the target's):
    every rank drafts the same number of tokens at every position (their drafts agree),
    and the greedy and cached tokens equal the run without speculation."""
    rank0, rank1 = tp2[f"mtp:{name}"]
    assert rank0["drafts"] == rank1["drafts"], "ranks drafted differently"
    assert rank0["spec"] == rank1["spec"] == rank0["plain"]
    assert rank0["drafts"][0] > 0


@pytest.mark.parametrize("name", SPEC_MODELS)
def test_tp2_verified_and_plain_sequences_in_one_forward(tp2, name):
    """At TP=2 a step verifying one sequence and decoding two others runs one forward
    on both ranks, and the tokens equal the run without speculation."""
    rank0, rank1 = tp2[f"mixed:{name}"]
    assert rank0 == rank1, "ranks diverged"
    assert rank0["spec"] == rank0["plain"]
    assert rank0["mixed_steps"] > 0 and rank0["kept"] > 0


def test_tp2_constrained_requests_speculate_exactly(tp2):
    """At TP=2 rank 0 masks each verified position by the grammar and broadcasts the
    tokens: both ranks emit the constrained run's tokens, drafts kept."""
    rank0, rank1 = tp2["grammar:nemotron_h"]
    assert rank0 == rank1, "ranks diverged"
    assert rank0["spec"] == rank0["plain"] and rank0["kept"] > 0
    assert rank0["stopped"] == ["stop", "stop"]  # each grammar completed
