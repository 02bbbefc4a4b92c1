"""Shared helpers for engine tests: reference models, random prompts, greedy params."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from marconi_ray.protocol.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def make_small_jamba(out: Path, seed: int = 0) -> Path:
    """A small dense Jamba (2 Mamba-1 + 2 attention layers) saved with transformers, for
    the Triton-interpreter tests, where each Mamba-1 layer costs seconds."""
    from transformers import JambaConfig, JambaForCausalLM

    cfg = JambaConfig(
        vocab_size=300,
        hidden_size=64,
        num_hidden_layers=4,
        attn_layer_period=2,
        attn_layer_offset=1,
        num_experts=1,
        expert_layer_period=1,
        expert_layer_offset=0,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        mamba_d_state=8,
        mamba_dt_rank=8,
        initializer_range=0.2,
        use_mamba_kernels=False,
        eos_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        JambaForCausalLM(cfg).eval().save_pretrained(out)
    return out


def hf_model(model_dir: Path):
    """transformers' own model for a checkpoint dir (the reference): the class its
    config.json names (a multimodal Qwen3.5 checkpoint is no `AutoModelForCausalLM`)."""
    import json

    import transformers

    arch = json.loads((Path(model_dir) / "config.json").read_text())["architectures"][0]
    cls = getattr(transformers, arch)
    return cls.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_logits(model, ids: list[int] | np.ndarray) -> torch.Tensor:
    """Logits [L, V] of the transformers model over one sequence."""
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(ids), dtype=torch.long)[None]).logits[0].float()


def prompts(seed: int, n: int, length: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, length).tolist() for _ in range(n)]
