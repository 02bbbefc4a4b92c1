"""The mixture-of-experts hybrids (NemotronH with MoE layers, Jamba with experts, Granite
4.0-H): the router against transformers' router modules, and the engine against
transformers on the same random fp32 weights, through the real serving path (`Engine`
with the Marconi cache), and resumption from SSM states at any depth."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from engine_helpers import prompts
from family_checks import check_greedy_and_second_turn, check_resume_at_depths

from marconi_ray.engine.model.layers.moe import route
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.model_config import MoEConfig
from marconi_ray.engine.presets.model_presets import MOE_HYBRIDS

N_TOKENS, D, E, K = 64, 32, 8, 2


def _sorted(weights: torch.Tensor, experts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, experts) with each row's experts in increasing order."""
    order = experts.argsort(dim=-1)
    return weights.gather(1, order), experts.gather(1, order)


def _hf_router(name: str, cfg: SimpleNamespace, weight: torch.Tensor) -> torch.nn.Module:
    from transformers.models.granitemoehybrid import modeling_granitemoehybrid as granite
    from transformers.models.jamba import modeling_jamba as jamba
    from transformers.models.nemotron_h import modeling_nemotron_h as nemotron

    cls = {
        "nemotron_h": nemotron.NemotronHTopkRouter,
        "jamba": jamba.JambaTopKRouter,
        "granitemoehybrid": granite.GraniteMoeHybridTopKRouter,
    }[name]
    router = cls(cfg)
    with torch.no_grad():
        router.weight.copy_(weight)
    return router


ROUTERS = {
    "nemotron_h": MoEConfig(
        16, E, K, "relu2", gated=False, scoring="sigmoid", selection_bias=True, n_group=4,
        topk_group=2, norm_topk=True, routed_scale=2.5,
    ),
    "jamba": MoEConfig(16, E, K, "silu", gated=True),
    "granitemoehybrid": MoEConfig(16, E, K, "silu", gated=True, norm_topk=True),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_route_equals_transformers_router(name: str) -> None:
    """`route` picks the experts transformers' router picks, with the same weights:
    NemotronH's grouped sigmoid with a selection bias, Jamba's unnormalised softmax,
    Granite's softmax over the top-k logits."""
    cfg = ROUTERS[name]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(N_TOKENS, D, generator=g)
    weight = torch.randn(E, D, generator=g) * 0.3
    bias = torch.randn(E, generator=g) * 0.5
    hf_cfg = SimpleNamespace(
        num_experts_per_tok=K, num_local_experts=E, num_experts=E, hidden_size=D,
        routed_scaling_factor=cfg.routed_scale, n_group=cfg.n_group,
        topk_group=cfg.topk_group, norm_topk_prob=cfg.norm_topk,
    )  # fmt: skip
    router = _hf_router(name, hf_cfg, weight)
    if cfg.selection_bias:
        router.e_score_correction_bias.copy_(bias)
    with torch.no_grad():
        _, want_w, want_e = router(x)
    got_w, got_e = route(x @ weight.T, cfg, bias if cfg.selection_bias else None)
    want_w, want_e = _sorted(want_w.float(), want_e)
    got_w, got_e = _sorted(got_w, got_e)
    assert torch.equal(got_e, want_e)
    torch.testing.assert_close(got_w, want_w, atol=1e-6, rtol=1e-6)
    if name == "nemotron_h":  # the bias and the groups change the choice
        assert not torch.equal(got_e, _sorted(*route(x @ weight.T, cfg))[1])


@pytest.mark.parametrize("family", MOE_HYBRIDS)
def test_greedy_and_cached_second_turn_equal_transformers(model_dirs, family):
    """See `family_checks.check_greedy_and_second_turn`."""
    engine = check_greedy_and_second_turn(model_dirs[family])
    assert "moe" in engine.config.blocks


@pytest.mark.parametrize("family", MOE_HYBRIDS)
def test_resume_from_states_at_any_depth_equals_uncached(model_dirs, family):
    """Resuming from KV slices and conv + SSM states at any depth (see
    `family_checks.check_resume_at_depths`)."""
    check_resume_at_depths(model_dirs[family])


def test_granite_multipliers_and_nemotron_latent_reach_the_model(model_dirs):
    """The presets exercise what these families add: Granite's muP multipliers and
    attention scale, NemotronH's latent projections, plain experts and selection bias."""
    granite = load_model(model_dirs["granitemoehybrid"]).cfg
    assert granite.scales.embedding != 1.0 and granite.scales.logits != 1.0
    assert granite.attention is not None and granite.attention.scale is not None
    assert granite.attention.rotary_dim == 0
    nemotron = load_model(model_dirs["nemotron_h_moe"])
    moe = nemotron.cfg.moe
    assert moe is not None and moe.latent_dim and not moe.gated and moe.n_group > 1
    (block,) = [b for b in nemotron.layers if b.kind == "moe"][:1]
    assert block.mixer.selection_bias is not None and block.mixer.selection_bias.abs().max() > 0


def test_dense_granite_with_rope_equals_transformers(tmp_path):
    """Granite without experts (the fused shared MLP alone is the feed-forward) and with
    `position_embedding_type` "rope": logits equal transformers' on 40 tokens."""
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    cfg = GraniteMoeHybridConfig(
        vocab_size=300, hidden_size=32, num_hidden_layers=2, layer_types=["mamba", "attention"],
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=0,
        shared_intermediate_size=48, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8,
        mamba_chunk_size=16, position_embedding_type="rope", embedding_multiplier=3.0,
        residual_multiplier=0.5, logits_scaling=0.25, attention_multiplier=0.2,
        initializer_range=0.2,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        ref = GraniteMoeHybridForCausalLM(cfg).eval()
    ref.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    assert ours.cfg.blocks == ("mamba2", "mlp", "attention", "mlp")
    assert ours.cfg.attention is not None and ours.cfg.attention.rotary_dim == 8
    ids = prompts(34, 1, 40, 300)[0]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    got = ours.forward_logits(torch.tensor(ids))
    assert want.std() > 0.5
    assert (got - want).abs().max().item() <= 1e-4


@pytest.mark.triton
@pytest.mark.parametrize("family", ["qwen3_next", "nemotron_h_moe", "jamba"])
def test_grouped_dispatch_on_the_triton_kernel_equals_the_reference(model_dirs, family):
    """A prefill-sized input through each MoE block's grouped dispatch: the Triton
    grouped matmul (no host sync) gives the reference's output, and both the gathered
    dispatch's (the decode path)."""
    from marconi_kernels import get_kernels
    from marconi_ray.engine.model.layers.moe import MoE

    model = load_model(model_dirs[family])
    blocks = [b.mixer for b in model.layers if isinstance(b.mixer, MoE)]
    assert blocks
    triton_set = get_kernels("cpu", prefer="triton")
    g = torch.Generator().manual_seed(3)
    for moe in blocks:
        x = torch.randn(48, model.cfg.hidden_size, generator=g)
        logits = torch.nn.functional.linear(x.to(moe.router.dtype), moe.router)
        weights, experts = route(logits, moe.cfg, moe.selection_bias)
        h = x if moe.latent_in is None else torch.nn.functional.linear(x, moe.latent_in)
        want = moe._grouped(h, experts, weights.to(x.dtype))
        moe.kernels = triton_set
        got = moe._grouped(h, experts, weights.to(x.dtype))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        gathered = moe._gathered(h, experts, weights.to(x.dtype))
        torch.testing.assert_close(gathered, want, rtol=1e-4, atol=1e-5)
