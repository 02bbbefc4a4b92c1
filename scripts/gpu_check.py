"""One-shot GPU check of the engine's CUDA path (run by scripts/gpu_check.sh; no Ray).

Sections, each recorded even when another fails (its error is kept in the JSON):
  kernels   every op of the "triton" set against its torch reference, fp32 and bf16, at
            serving shapes, with the time of each (triton vs ref, CUDA events);
  exactness the `small` preset (nemotron_h, bamba) in fp32 on the triton set: greedy tokens
            resumed from a mid-prompt checkpoint equal those of a full run (16 tokens) and
            those of the reference kernels;
  prefill   the `paper-7b-shape` model in bf16: prefill tokens/s of a 4k-token prompt,
            ours (triton) vs transformers' implementation of the same weights;
            With it, `packed`: 8 prompts of 256 tokens (`--packed-len`) on the KV pool in one
            forward (`prefill_many`: one attention and one varlen conv and scan call per
            layer for all of them) vs one forward each: seconds of each, and the largest
            logit difference between them;
  ttft      time to first token of a turn whose 90% prefix is cached vs a cold prompt;
  decode    decode tokens/s at batch 1, 16 and 64 (model steps, and the engine end to end);
  tiers     the state store's host tier on the `small` preset: `--tier-mb` MB of KV slots
            and as many of SSM states demoted to pinned host memory and promoted back
            (`apply_moves`), GB/s per direction by the store's copy-stream events, the
            host time the call takes (it only queues the copies), data equal afterwards;
  graphs    the `small` preset's decode step replayed as CUDA graphs vs eager
            (`cuda_graphs` on / off): greedy tokens equal, decode tokens/s at each batch
            of `--batches` (engine end to end), graphs recorded (on CPU: the static step
            run eagerly against the plain one).
Writes <out>/gpu_check.json and <out>/summary.md. `--device cpu --preset tiny --quick`
runs the same code on a CPU under TRITON_INTERPRET=1 (a dry run of the script itself).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# The triton set first: it registers mamba-ssm's kernel package before transformers looks.
from marconi_kernels import OPS, get_kernels
from marconi_kernels.mamba_ssm_import import mamba_ssm_version
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.paged_kv import ScratchKV
from marconi_ray.engine.model.prefill_part import PrefillPart
from marconi_ray.engine.model.seq_state import SeqState
from marconi_ray.engine.presets.factory import build_model, make_model
from marconi_ray.engine.store.state_store import StateStore
from marconi_ray.protocol.orders import Move
from marconi_ray.protocol.sampling import SamplingParams

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default=str(REPO / "benchmarks/results/gpu"), help="result folder")
    p.add_argument("--device", default="cuda", help="torch device (cpu: a dry run)")
    p.add_argument("--preset", default="paper-7b-shape", help="model of prefill/ttft/decode")
    p.add_argument("--prompt-len", type=int, default=4096, help="prefill prompt tokens")
    p.add_argument(
        "--packed-len", type=int, default=256, help="tokens of each of the 8 packed prompts"
    )
    p.add_argument("--batches", default="1,16,64", help="decode batch sizes")
    p.add_argument("--quick", action="store_true", help="small kernel shapes (CPU dry run)")
    p.add_argument(
        "--sections",
        default="kernels,exactness,tiers,transfer,graphs,prefill,ttft,decode",
        help="comma-separated sections to run",
    )
    p.add_argument("--tier-mb", type=int, default=256, help="MB of KV (and of states) moved")
    return p.parse_args(argv)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, reps: int = 3) -> tuple[float, Any]:
    """Median seconds of `reps` calls after one warm-up call, and the last result."""
    out = fn()
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def scaled_err(a: torch.Tensor, e: torch.Tensor) -> float:
    """max |a - e| / max(1, max |e|) in float64."""
    a64, e64 = a.double(), e.double()
    if not e64.numel():
        return 0.0
    return float((a64 - e64).abs().max() / max(1.0, float(e64.abs().max())))


# ---------------------------------------------------------------------------- kernels
def kernel_cases(dev: torch.device, dtype: torch.dtype, quick: bool) -> dict[str, Any]:
    """op -> (args, kwargs, in-place state index or None) at serving-like shapes."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape: int, scale: float = 1.0, dt: torch.dtype = dtype) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(dev, dt)

    L, H, P, G, N, cs = (40, 4, 8, 2, 16, 16) if quick else (2048, 32, 64, 8, 128, 128)
    C = 24 if quick else 4096 + 2 * G * N
    Dm, N1 = (20, 6) if quick else (2048, 16)
    B = 3 if quick else 64
    emit = [1, cs, L // 2 + 3, L]
    f32 = torch.float32
    S, n = 8, L // 8  # the varlen ops: 8 requests of L / 8 tokens packed
    cu = [s * n for s in range(S + 1)]
    emits = [[1, n // 2, n]] * S
    T, KV, hd = S * n, 2 if quick else 8, 16 if quick else 128
    return {
        "ssd_chunk_scan_varlen": (
            (
                rnd(T, H, P),
                rnd(T, H),
                -torch.rand(H, generator=g).to(dev) - 0.5,
                rnd(T, G, N),
                rnd(T, G, N),
            ),
            {
                "cu_seqlens": cu,
                "chunk_size": cs,
                "D": rnd(H, dt=f32),
                "dt_bias": rnd(H, dt=f32),
                "dt_limit": (0.001, 100.0),
                "initial_states": rnd(S, H, P, N, dt=f32),
                "emit_at": emits,
            },
        ),
        "causal_conv1d_varlen": (
            (rnd(C, T), rnd(C, 4), rnd(C)),
            {"cu_seqlens": cu, "initial_states": rnd(S, C, 4), "emit_at": emits},
        ),
        "selective_scan_varlen": (
            (
                rnd(Dm, T),
                rnd(Dm, T),
                -torch.rand(Dm, N1, generator=g).to(dev) - 0.5,
                rnd(N1, T),
                rnd(N1, T),
            ),
            {
                "cu_seqlens": cu,
                "D": rnd(Dm, dt=f32),
                "z": rnd(Dm, T),
                "delta_bias": rnd(Dm, dt=f32),
                "initial_states": rnd(S, Dm, N1, dt=f32),
                "emit_at": emits,
            },
        ),
        "gated_delta_chunk_varlen": (
            (
                rnd(T, H, hd),
                rnd(T, H, hd),
                rnd(T, H, hd),
                -torch.rand(T, H, generator=g).to(dev),
                torch.rand(T, H, generator=g).to(dev, dtype),
            ),
            {
                "cu_seqlens": cu,
                "chunk_size": 64,
                "initial_states": rnd(S, H, hd, hd, dt=f32, scale=0.1),
                "emit_at": emits,
            },
        ),
        "paged_prefill_attention": (
            (
                rnd(T, 4 * KV, hd),
                rnd(KV, T + 16, hd),
                rnd(KV, T + 16, hd),
                torch.randperm(T + 16, generator=g)[:T].view(S, n).to(dev),
                torch.tensor(cu, device=dev),
                torch.full((S,), n, device=dev),
                n,
            ),
            {},
        ),
        "ssd_chunk_scan": (
            (
                rnd(1, L, H, P),
                rnd(1, L, H),
                -torch.rand(H, generator=g).to(dev) - 0.5,
                rnd(1, L, G, N),
                rnd(1, L, G, N),
            ),
            {
                "chunk_size": cs,
                "D": rnd(H, dt=f32),
                "dt_bias": rnd(H, dt=f32),
                "dt_limit": (0.001, 100.0),
                "initial_state": rnd(1, H, P, N, dt=f32),
                "emit_at": emit,
            },
        ),
        "mamba2_state_update": (
            (
                rnd(B, H, P, N, dt=f32),
                rnd(B, H, P),
                rnd(B, H),
                -torch.rand(H, generator=g).to(dev) - 0.5,
                rnd(B, G, N),
                rnd(B, G, N),
            ),
            {"D": rnd(H, dt=f32), "dt_bias": rnd(H, dt=f32), "dt_limit": (0.001, 100.0)},
        ),
        "causal_conv1d": (
            (rnd(1, C, L), rnd(C, 4), rnd(C)),
            {"initial_state": rnd(1, C, 4), "emit_at": emit},
        ),
        "causal_conv1d_update": ((rnd(B, C), rnd(B, C, 4), rnd(C, 4), rnd(C)), {}),
        "selective_scan": (
            (
                rnd(1, Dm, L),
                rnd(1, Dm, L),
                -torch.rand(Dm, N1, generator=g).to(dev) - 0.5,
                rnd(1, N1, L),
                rnd(1, N1, L),
            ),
            {
                "D": rnd(Dm, dt=f32),
                "z": rnd(1, Dm, L),
                "delta_bias": rnd(Dm, dt=f32),
                "initial_state": rnd(1, Dm, N1, dt=f32),
                "emit_at": emit,
            },
        ),
        "mamba1_state_update": (
            (
                rnd(B, Dm, N1, dt=f32),
                rnd(B, Dm),
                rnd(B, Dm),
                -torch.rand(Dm, N1, generator=g).to(dev) - 0.5,
                rnd(B, N1),
                rnd(B, N1),
            ),
            {"D": rnd(Dm, dt=f32), "z": rnd(B, Dm), "delta_bias": rnd(Dm, dt=f32)},
        ),
    }


def call_op(ks: Any, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run `op` of kernel set `ks`; an in-place step gets a fresh copy of its state and
    returns (y, new state) so both can be compared."""
    if not op.endswith("update"):
        return getattr(ks, op)(*args, **kwargs)
    state_arg = 1 if op == "causal_conv1d_update" else 0
    args = tuple(t.clone() if i == state_arg else t for i, t in enumerate(args))
    return getattr(ks, op)(*args, **kwargs), args[state_arg]


def run_kernels(dev: torch.device, quick: bool) -> dict[str, Any]:
    fast, ref = get_kernels(dev, "triton"), get_kernels(dev, "ref")
    out: dict[str, Any] = {"backends": dict(fast.backends)}
    for dtype, tol in ((torch.float32, 5e-3), (torch.bfloat16, 5e-2)):
        name = str(dtype).removeprefix("torch.")
        for op, (args, kwargs) in kernel_cases(dev, dtype, quick).items():
            t_fast, got = timed(lambda o=op, a=args, k=kwargs: call_op(fast, o, a, k), dev)
            t_ref, want = timed(lambda o=op, a=args, k=kwargs: call_op(ref, o, a, k), dev)
            errs = [scaled_err(a, e) for a, e in zip(got, want, strict=True)]
            out[f"{op}/{name}"] = {
                "max_scaled_err": max(errs),
                "tol": tol,
                "ok": max(errs) <= tol,
                "triton_ms": round(1e3 * t_fast, 3),
                "ref_ms": round(1e3 * t_ref, 3),
                "speedup": round(t_ref / t_fast, 2) if t_fast > 0 else None,
            }
            print(f"  kernels {op}/{name}: {out[f'{op}/{name}']}", flush=True)
    out["ok"] = all(v["ok"] for k, v in out.items() if "/" in k)
    return out


# ---------------------------------------------------------------------------- models
def hf_on_device(preset: str, family: str, dev: torch.device, dtype: str) -> tuple[Any, Path]:
    """transformers' random-weight model of `preset` on `dev` and a folder with its
    config.json (our loader reads the config there and takes the weights from memory)."""
    hf = build_model(preset, family, dtype=dtype, device=str(dev))
    folder = Path(tempfile.mkdtemp(prefix=f"gpu-check-{preset}-{family}-"))
    hf.config.save_pretrained(folder)
    return hf, folder


def run_exactness(dev: torch.device, preset: str) -> dict[str, Any]:
    """Resume from a mid-prompt checkpoint == full run, 16 greedy tokens, fp32, for a
    Mamba-2 hybrid of each layout (NemotronH, Bamba; the factory makes no Jamba)."""
    out: dict[str, Any] = {}
    for family in ("nemotron_h", "bamba"):
        hf, folder = hf_on_device(preset, family, dev, "float32")
        weights = hf.state_dict()
        fast = load_model(folder, device=dev, kernels=get_kernels(dev, "triton"), weights=weights)
        ref = load_model(folder, device=dev, kernels=get_kernels(dev, "ref"), weights=weights)
        del hf, weights
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(3, 258, (300,), generator=g).to(dev)
        full = fast.new_state()
        ckpts = fast.prefill(ids, full, emit_at=[77, 200])
        want = fast.greedy(full, 16)
        ref_state = ref.new_state()
        ref.prefill(ids, ref_state)
        res: dict[str, Any] = {"full": want, "ref_equal": ref.greedy(ref_state, 16) == want}
        state0 = fast.new_state()
        fast.prefill(ids, state0)  # fresh KV for the slices below
        for ck in ckpts:
            st = SeqState.resumed(ck, state0)
            fast.prefill(ids[ck.depth :], st)
            res[f"resume_at_{ck.depth}_equal"] = fast.greedy(st, 16) == want
        res["ok"] = all(v for k, v in res.items() if k.endswith("equal"))
        out[family] = res
        print(f"  exactness {family}: {res}", flush=True)
        del fast, ref
    out["ok"] = all(v["ok"] for v in out.values() if isinstance(v, dict))
    return out


def run_tiers(dev: torch.device, preset: str, mb: int, reps: int = 3) -> dict[str, Any]:
    """Host tier copies of a `StateStore` (NemotronH `preset`, bf16): `mb` MB of KV slots
    and about as many of SSM states, each kind moved on its own to the host and back
    `reps` times. Per kind and direction (medians): GB/s by the store's copy-stream events
    (`tier_stats`), GB/s by wall time to a device sync, and the host time `apply_moves`
    took to return. Then the data is checked: read straight from the host and after the
    round trips it equals what was stored, and the store's invariant holds."""
    hf, folder = hf_on_device(preset, "nemotron_h", dev, "bfloat16")
    model = load_model(
        folder,
        dtype=torch.bfloat16,
        device=dev,
        kernels=get_kernels(dev, "ref"),
        weights=hf.state_dict(),
    )
    del hf
    store = StateStore(model)
    n_slots = max(16, mb * 2**20 // store.kv_bytes_per_token)
    n_states = max(1, mb * 2**20 // store.state_bytes)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(3, model.cfg.vocab_size, (16,), generator=g).to(dev)
    (ckpt,) = model.prefill(ids, model.new_state(), [16])
    sids = tuple(store.put_state(ckpt) for _ in range(n_states))
    slots = store.alloc_slots(n_slots)
    for t in store.device_kv.tensors():
        t.normal_()

    def probe() -> list[torch.Tensor]:
        out = []
        for part, sid in ((slots[:16], sids[0]), (slots[-16:], sids[-1])):
            st = store.load(part, sid, 16)
            out += [t for kv in st.kv.values() for t in kv.view()]
            out += [*st.conv.values(), *st.ssm.values(), st.logits]
        return out

    want = probe()
    result: dict[str, Any] = {
        "preset": preset,
        "kv_slots": n_slots,
        "kv_mb": round(n_slots * store.kv_bytes_per_token / 2**20, 1),
        "states": n_states,
        "states_mb": round(n_states * store.state_bytes / 2**20, 1),
    }
    for kind, slot_ids, state_ids in (("kv", slots, ()), ("states", slots[:0], sids)):
        runs: dict[str, list[tuple[float, float, float]]] = {"to_host": [], "to_device": []}
        for _ in range(reps):
            for to_host in (True, False):
                key = "to_host" if to_host else "to_device"
                before = store.tier_stats()
                sync(dev)
                t0 = time.perf_counter()
                store.apply_moves([Move(to_host, state_ids, slot_ids)])
                call_s = time.perf_counter() - t0
                sync(dev)
                wall_s = time.perf_counter() - t0
                after = store.tier_stats()
                n_bytes = after[f"bytes_{key}"] - before[f"bytes_{key}"]
                event_s = after[f"seconds_{key}"] - before[f"seconds_{key}"]
                runs[key].append((n_bytes / max(event_s, 1e-12), n_bytes / wall_s, call_s))
        for key, rows in runs.items():
            result[f"{kind}_{key}"] = {
                "gbps": round(statistics.median(r[0] for r in rows) / 1e9, 2),
                "wall_gbps": round(statistics.median(r[1] for r in rows) / 1e9, 2),
                "call_ms": round(1e3 * statistics.median(r[2] for r in rows), 2),
            }
        print(
            f"  tiers {kind}: {result[f'{kind}_to_host']} / {result[f'{kind}_to_device']}",
            flush=True,
        )
    store.apply_moves([Move(True, sids, slots)])
    result["host_read_equal"] = all(torch.equal(a, b) for a, b in zip(probe(), want, strict=True))
    store.apply_moves([Move(False, sids, slots)])
    result["round_trip_equal"] = all(torch.equal(a, b) for a, b in zip(probe(), want, strict=True))
    store.check()
    result["stats"] = store.tier_stats()
    result["ok"] = result["host_read_equal"] and result["round_trip_equal"]
    print(
        f"  tiers: equal after the host read {result['host_read_equal']}, after the round "
        f"trips {result['round_trip_equal']}",
        flush=True,
    )
    return result


def run_graphs(dev: torch.device, preset: str, batches: list[int]) -> dict[str, Any]:
    """Decode with the step's CUDA graphs vs eager, the same requests (see the module
    docstring); on CPU the graphed engine runs the static step eagerly."""
    from marconi_ray.engine.model.step_graphs import StepGraphs

    with tempfile.TemporaryDirectory() as tmp:
        folder = make_model(preset, "nemotron_h", Path(tmp) / "m")
        on_cuda = dev.type == "cuda"
        cap = max(batches)
        engines = {
            mode: Engine(folder, "vanilla", device=str(dev), max_batch=cap, cuda_graphs=mode)
            for mode in ("off", "on" if on_cuda else "off")
        }
        if not on_cuda:  # a dry run: the static step, eagerly
            graphed = Engine(folder, "vanilla", device=str(dev), max_batch=cap)
            graphed.worker.graphs = StepGraphs(graphed.model, graphed.worker._batch, False)
            engines["on"] = graphed
        out: dict[str, Any] = {}
        g = torch.Generator().manual_seed(5)
        for b in batches:
            prompts = [torch.randint(3, 258, (64,), generator=g).tolist() for _ in range(b)]
            sp = [SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)] * b
            row: dict[str, Any] = {}
            tokens = {}
            for mode, engine in engines.items():
                engine.generate_many(prompts[:1], sp[:1])  # records bucket 1, warms up
                sync(dev)
                t0 = time.perf_counter()
                tokens[mode] = [r.tokens for r in engine.generate_many(prompts, sp)]
                sync(dev)
                row[f"{mode}_tok_s"] = round(32 * b / (time.perf_counter() - t0), 1)
            row["tokens_equal"] = tokens["on"] == tokens["off"]
            row["graphs_over_eager"] = round(row["on_tok_s"] / row["off_tok_s"], 2)
            out[f"batch_{b}"] = row
            print(f"  graphs batch {b}: {row}", flush=True)
        worker = engines["on"].worker
        out["recorded"] = worker.graphs.captured if worker.graphs is not None else 0
        out["ok"] = all(r["tokens_equal"] for k, r in out.items() if k.startswith("batch_"))
        return out


def hf_prefill(hf: Any, ids: torch.Tensor, dev: torch.device) -> tuple[float, torch.Tensor]:
    """Median seconds of transformers' forward over `ids` and its logits [L, V] (fp32)."""
    with torch.no_grad():
        seconds, out = timed(lambda: hf(input_ids=ids[None], use_cache=False).logits, dev)
    return seconds, out[0].float()


def run_engine_sections(args: argparse.Namespace, dev: torch.device) -> dict[str, Any]:
    """prefill (vs transformers), ttft and decode on the big model in bf16."""
    sections = set(args.sections.split(","))
    out: dict[str, Any] = {}
    hf, folder = hf_on_device(args.preset, "nemotron_h", dev, "bfloat16")
    weights = hf.state_dict()
    n = args.prompt_len
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 258, (n,), generator=g).to(dev)
    if "prefill" in sections:
        try:
            ours = load_model(
                folder,
                dtype=torch.bfloat16,
                device=dev,
                kernels=get_kernels(dev, "triton"),
                weights=weights,
            )
            t_ours, logits = timed(lambda: ours.forward_logits(ids), dev)
            t_hf, hf_logits = hf_prefill(hf, ids, dev)
            agree = float((logits.argmax(-1) == hf_logits.argmax(-1)).float().mean())
            out["prefill"] = {
                "prompt_tokens": n,
                "ours_tok_s": round(n / t_ours, 1),
                "transformers_tok_s": round(n / t_hf, 1),
                "speedup": round(t_hf / t_ours, 2),
                "top1_agreement": round(agree, 4),
                "max_abs_logit_diff": float((logits - hf_logits).abs().max()),
            }
            print(f"  prefill: {out['prefill']}", flush=True)
            out["packed"] = packed_prefill(ours, dev, 8, args.packed_len)
            print(f"  packed: {out['packed']}", flush=True)
            del ours
        except Exception:
            out["prefill"] = {"error": traceback.format_exc()}
    del hf
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    engine = Engine(
        folder,
        "marconi",
        40 * 2**30,
        dtype="bfloat16",
        device=str(dev),
        kernels="triton",
        weights=weights,
        max_batch=64,
    )
    del weights
    if "ttft" in sections:
        try:
            out["ttft"] = ttft(engine, ids.tolist(), n)
            print(f"  ttft: {out['ttft']}", flush=True)
        except Exception:
            out["ttft"] = {"error": traceback.format_exc()}
    if "decode" in sections:
        try:
            out["decode"] = decode(engine, [int(b) for b in args.batches.split(",")], dev)
            print(f"  decode: {out['decode']}", flush=True)
        except Exception:
            out["decode"] = {"error": traceback.format_exc()}
    return out


def packed_prefill(model: Any, dev: torch.device, n: int, length: int) -> dict[str, Any]:
    """`n` prompts of `length` tokens prefilled on a scratch KV pool in one forward vs
    one forward each (the section `packed` of the module docstring)."""
    vocab = model.cfg.vocab_size
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, vocab, (length,), generator=g).to(dev) for _ in range(n)]
    pool = ScratchKV(model.kv_shapes(), n * length, model.dtype, dev)
    rows = torch.arange(n * length, device=dev).view(n, length)

    def parts() -> list[PrefillPart]:
        return [PrefillPart(p, SeqState(rows=r)) for p, r in zip(prompts, rows, strict=True)]

    t_one, together = timed(lambda: model.prefill_many(parts(), pool), dev)
    t_each, alone = timed(lambda: [model.prefill_many([p], pool)[0] for p in parts()], dev)
    diff = max(float((a[1] - b[1]).abs().max()) for a, b in zip(together, alone, strict=True))
    return {
        "prompts": n,
        "prompt_tokens": length,
        "one_forward_s": round(t_one, 4),
        "one_forward_each_s": round(t_each, 4),
        "speedup": round(t_each / t_one, 2),
        "max_abs_logit_diff": diff,
    }


def ttft(engine: Engine, prompt: list[int], n: int) -> dict[str, Any]:
    """TTFT of a turn whose first 90% is a cached conversation vs a cold prompt."""
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    head = prompt[: int(0.9 * n)]
    first = engine.generate(head, one)  # caches the state after the whole first turn
    turn = head + list(first.tokens)
    turn += prompt[len(turn) :] if len(turn) < n else []
    warm = engine.generate(turn, one)
    cold_prompt = [3 + (t + 7) % 250 for t in prompt]
    cold = engine.generate(cold_prompt, one)
    return {
        "prompt_tokens": len(turn),
        "cached_tokens": warm.usage.cached_tokens,
        "ttft_cached_ms": round(1e3 * warm.timings.ttft, 2),
        "ttft_cold_ms": round(1e3 * cold.timings.ttft, 2),
        "cold_over_cached": round(cold.timings.ttft / max(warm.timings.ttft, 1e-9), 2),
    }


def decode(engine: Engine, batches: list[int], dev: torch.device) -> dict[str, Any]:
    """Decode tokens/s: bare model steps over a batch (no sampling or planning), and the
    engine end to end (64 greedy tokens per request, prefill of 128 tokens included)."""
    model = engine.model
    out: dict[str, Any] = {}
    g = torch.Generator().manual_seed(3)
    for b in batches:
        prompts = [torch.randint(3, 258, (128,), generator=g).tolist() for _ in range(b)]
        states = []
        for p in prompts:
            st = model.new_state()
            model.prefill(torch.tensor(p, device=dev), st)
            states.append(st)
        tok = torch.zeros(b, dtype=torch.long, device=dev)
        model.decode(tok, states)
        sync(dev)
        steps = 32
        t0 = time.perf_counter()
        for _ in range(steps):
            model.decode(tok, states)
        sync(dev)
        step_s = (time.perf_counter() - t0) / steps
        params = [SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)] * b
        t0 = time.perf_counter()
        results = engine.generate_many(prompts, params)
        sync(dev)
        wall = time.perf_counter() - t0
        out[f"batch_{b}"] = {
            "model_step_ms": round(1e3 * step_s, 2),
            "model_tok_s": round(b / step_s, 1),
            "engine_tok_s": round(sum(len(r.tokens) for r in results) / wall, 1),
        }
    return out


def run_transfer(dev: torch.device, preset: str, prompt_len: int, reps: int = 3) -> dict[str, Any]:
    """A cache entry moved between two engines on the device (`export_prefix` /
    `import_prefix`, what a replica's shards do at each end of a move): export GB/s (the
    copy of its KV and state into one flat tensor per dtype, with the checksum), import
    GB/s (the checksum again, the writes into the receiver's pool), each next to the
    floor of one device-to-device copy of the same bytes; and the receiver's next turn
    equal to an uncached engine's. Between GPUs the bytes go over NIXL / NCCL (Ray
    Direct Transport), which this one-GPU image cannot show: the exporter's and the
    importer's device work bound what a move costs on top of the link."""
    hf, folder = hf_on_device(preset, "nemotron_h", dev, "bfloat16")
    weights = hf.state_dict()
    del hf

    def engine(system: str) -> Engine:
        return Engine(folder, system, 8 * 2**30, dtype="bfloat16", device=str(dev), weights=weights)

    source, receiver, reference = engine("marconi"), engine("marconi"), engine("vanilla")
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    g = torch.Generator().manual_seed(6)
    chat = torch.randint(3, 258, (prompt_len,), generator=g).tolist()
    history = chat + list(source.generate(chat, params).tokens)
    export_s, payload = timed(lambda: source.export_prefix(history), dev, reps)
    assert payload is not None
    nbytes = payload.meta.nbytes
    flat = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    copy_s, _ = timed(lambda: flat.clone(), dev, reps)
    sync(dev)
    t0 = time.perf_counter()
    depth = receiver.import_prefix(payload)
    sync(dev)
    import_s = time.perf_counter() - t0
    follow = history + torch.randint(3, 258, (16,), generator=g).tolist()
    got = receiver.generate(follow, params)
    want = reference.generate(follow, params)
    result = {
        "preset": preset,
        "entry_tokens": depth,
        "entry_mb": round(nbytes / 2**20, 2),
        "export_gbps": round(nbytes / export_s / 1e9, 2),
        "import_gbps": round(nbytes / import_s / 1e9, 2),
        "device_copy_gbps": round(nbytes / copy_s / 1e9, 2),
        "export_over_copy": round(copy_s / export_s, 3),
        "cached_tokens": got.usage.cached_tokens,
        "next_turn_equal": got.tokens == want.tokens,
    }
    result["ok"] = result["next_turn_equal"] and result["cached_tokens"] == depth
    print(f"  transfer: {result}", flush=True)
    return result


def summary(result: dict[str, Any]) -> str:
    lines = ["# GPU check", "", f"device: {result['env'].get('device_name')}", ""]
    for section in (
        "kernels",
        "exactness",
        "tiers",
        "transfer",
        "graphs",
        "prefill",
        "packed",
        "ttft",
        "decode",
    ):
        value = result.get(section)
        if value is None:
            continue
        lines += [f"## {section}", "", "```", json.dumps(value, indent=1)[:6000], "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "mamba_ssm": mamba_ssm_version(),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "ops": list(OPS),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError as exc:
        env["triton"] = f"missing: {exc}"
    result: dict[str, Any] = {"env": env, "args": vars(args)}
    sections = args.sections.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    path = out_dir / "gpu_check.json"

    def save() -> None:
        path.write_text(json.dumps(result, indent=1) + "\n")
        (out_dir / "summary.md").write_text(summary(result))

    for name, fn in (
        ("kernels", lambda: run_kernels(dev, args.quick)),
        ("exactness", lambda: run_exactness(dev, "tiny" if args.quick else "small")),
        ("tiers", lambda: run_tiers(dev, "tiny" if args.quick else "small", args.tier_mb)),
        ("transfer", lambda: run_transfer(dev, "tiny" if args.quick else "small", 2048)),
        ("graphs", lambda: run_graphs(dev, "tiny" if args.quick else "small", batches)),
    ):
        if name in sections:
            print(f"[gpu_check] {name}", flush=True)
            t0 = time.perf_counter()
            try:
                result[name] = fn()
            except Exception:
                result[name] = {"error": traceback.format_exc()}
            result[name]["seconds"] = round(time.perf_counter() - t0, 1)
            save()
    if {"prefill", "ttft", "decode"} & set(sections):
        print("[gpu_check] prefill / ttft / decode", flush=True)
        try:
            result.update(run_engine_sections(args, dev))
        except Exception:
            result["engine_sections_error"] = traceback.format_exc()
        save()
    save()
    print(f"[gpu_check] wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
