"""Zamba2: the engine against transformers on the same random fp32 weights, through the
real serving path (`Engine` with the Marconi cache), resumption from Mamba-2 states (and
each hybrid layer's own KV) at any depth, and the layout of the shared block's weights
(one copy per `num_mem_blocks`, loaded once, each hybrid layer's adapters its own)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import hf_logits, hf_model, prompts
from family_checks import check_greedy_and_second_turn, check_resume_at_depths

from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.layers.zamba_shared import SharedBlock
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.seq_state import SeqState, StateCheckpoint
from marconi_ray.engine.store.state_store import StateStore


def test_greedy_and_cached_second_turn_equal_transformers(model_dirs):
    """See `family_checks.check_greedy_and_second_turn`."""
    check_greedy_and_second_turn(model_dirs["zamba2"])


def _every_hybrid_layer_kv(model: HybridModel, ck: StateCheckpoint, resumed: SeqState) -> None:
    """Both hybrid layers' KV (the shared block's) is resumed at the checkpoint's depth."""
    assert len(model.attn_blocks) == model.cfg.blocks.count("shared_transformer") == 2
    assert [resumed.kv[i].length for i in model.attn_blocks] == [ck.depth] * 2


def test_resume_from_states_at_any_depth_equals_uncached(model_dirs):
    """Resuming from every hybrid layer's KV slice and the Mamba-2 states at any depth
    (see `family_checks.check_resume_at_depths`)."""
    check_resume_at_depths(model_dirs["zamba2"], on_checkpoint=_every_hybrid_layer_kv)


@pytest.fixture(scope="module")
def layout_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five hybrid layers over two copies of the shared weights (copy reuse), grouped KV
    heads, no q/k/v adapters, no RoPE: the branches the tiny preset does not take."""
    from transformers import Zamba2Config, Zamba2ForCausalLM

    cfg = Zamba2Config(
        vocab_size=300, hidden_size=32, num_hidden_layers=7,
        layers_block_type=["mamba", "hybrid", "hybrid", "mamba", "hybrid", "hybrid", "hybrid"],
        mamba_d_state=8, n_mamba_heads=4, mamba_ngroups=2, chunk_size=16,
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=48, adapter_rank=4,
        num_mem_blocks=2, initializer_range=0.2,
    )  # fmt: skip
    out = tmp_path_factory.mktemp("zamba2_layout")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Zamba2ForCausalLM(cfg).eval().save_pretrained(out)
    return out


def test_shared_weights_are_held_once_per_copy(layout_dir):
    """Hybrid layers 1, 2, 4, 5, 6 use copies 0, 1, 0, 1, 0 (stored under layers 1 and 2):
    the model holds two copies, loaded once each; each hybrid layer has its own adapters,
    linear and KV; the logits equal transformers' and a state-store round trip prices
    each hybrid layer's KV."""
    model = load_model(layout_dir)
    assert model.cfg.shared_copies == (1, 2)
    shared = [m for m in model.modules() if isinstance(m, SharedBlock)]
    assert [m.copy for m in shared] == [0, 1, 0, 1, 0]
    assert len(model.shared) == 2
    specs = model.weight_specs()
    keys = [s.key for s in specs.values()]
    assert len(keys) == len(set(keys)), "a checkpoint weight is loaded twice"
    assert specs["shared.1.q.weight"].key == "layers.2.shared_transformer.self_attn.q_proj.weight"
    adapter = specs[f"blocks.{model.attn_blocks[3]}.mixer.gate_up_adapter.up.weight"].key
    lists = "layers.2.shared_transformer.feed_forward.gate_up_proj_adapter_list"
    assert adapter == f"{lists}.3.1.weight"
    ids = prompts(34, 1, 40, model.cfg.vocab_size)[0]
    want = hf_logits(hf_model(layout_dir), ids)
    assert want.std() > 0.05
    assert (model.forward_logits(torch.tensor(ids)) - want).abs().max().item() <= 1e-4
    store = StateStore(model)
    attn = model.cfg.shared
    assert attn is not None
    per_layer = 2 * attn.attention.n_kv_heads * attn.attention.head_dim * 4
    assert store.kv_bytes_per_token == 5 * per_layer


def test_repeated_tied_copies_in_a_checkpoint_are_skipped(layout_dir):
    """A checkpoint that stores the shared block again under every hybrid layer (tied
    repeats) loads the same model; a key that is no repeat is still refused by name."""
    from safetensors.torch import load_file

    weights = load_file(str(layout_dir / "model.safetensors"))
    repeats = {  # hybrid layers 4 and 5 use the copies stored under layers 1 and 2
        k.replace(f"layers.{src}.", f"layers.{dst}."): v
        for src, dst in ((1, 4), (2, 5))
        for k, v in weights.items()
        if k.startswith(f"model.layers.{src}.shared_transformer.")
    }
    assert repeats
    model = load_model(layout_dir, weights={**weights, **repeats})
    ids = torch.tensor(prompts(35, 1, 20, model.cfg.vocab_size)[0])
    assert torch.equal(model.forward_logits(ids), load_model(layout_dir).forward_logits(ids))
    stray = {
        **weights,
        "model.layers.0.shared_transformer.linear.weight": weights["model.layers.1.linear.weight"],
    }
    with pytest.raises(ValueError, match=r"layers\.0\.shared_transformer\.linear"):
        load_model(layout_dir, weights=stray)
