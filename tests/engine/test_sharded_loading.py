"""Loading a sharded bfloat16 checkpoint (`model.safetensors.index.json`): each
tensor-parallel rank reads only its slice of every split weight, measured in bytes, and
bfloat16 weights reach a bfloat16 model bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hub_checkpoint import build_checkpoint
from safetensors import safe_open

from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.loader import load_weights, read_config
from marconi_ray.engine.model.parallel import TPGroup

WORLD = 2


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(tmp_path_factory.mktemp("sharded") / "ckpt", tokenizer=False)


def _file_tensors(folder: Path) -> dict[str, torch.Tensor]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    out: dict[str, torch.Tensor] = {}
    for name in sorted(set(index["weight_map"].values())):
        with safe_open(str(folder / name), framework="pt") as handle:
            out.update({k: handle.get_tensor(k) for k in handle.keys()})  # noqa: SIM118
    return out


def _rank(folder: Path, rank: int, world: int) -> tuple[HybridModel, int]:
    cfg, _ = read_config(folder)
    model = HybridModel(cfg, TPGroup(rank, world), torch.bfloat16)
    return model, load_weights(model, folder)


def test_tp2_rank_reads_half_of_the_split_weights(sharded: Path) -> None:
    """A tp-2 rank reads exactly half of every split weight plus every replicated one
    (the engine replicates the embedding and `lm_head`), a tp-1 load every byte."""
    files = _file_tensors(sharded)
    assert {t.dtype for t in files.values()} == {torch.bfloat16}
    total = sum(t.numel() * t.element_size() for t in files.values())
    whole, read_tp1 = _rank(sharded, 0, 1)
    assert read_tp1 == total
    specs = whole.weight_specs()
    prefix = next(p for p in ("model.", "backbone.", "") if p + specs["embed"].key in files)
    replicated = sum(
        files[key].numel() * files[key].element_size()
        for spec in specs.values()
        if spec.dim is None
        for k in spec.checkpoint_keys()
        for key in (k if k == "lm_head.weight" else prefix + k,)
    )
    split = total - replicated
    assert split > 0 and replicated > 0
    ranks = [_rank(sharded, r, WORLD) for r in range(WORLD)]
    for _, read in ranks:
        assert read == split // WORLD + replicated < total
    # the ranks' slices put together are the whole weights
    params = [dict(m.named_parameters()) for m, _ in ranks]
    for name, param in whole.named_parameters():
        spec = specs.get(name)
        if spec is None or spec.dim is None or spec.segments:
            continue
        joined = torch.cat([p[name] for p in params], dim=spec.dim)
        assert torch.equal(joined, param), name


def test_bfloat16_weights_load_bit_for_bit(sharded: Path) -> None:
    files = _file_tensors(sharded)
    model, _ = _rank(sharded, 0, 1)
    embed = model.weight_specs()["embed"].key
    key = next(k for k in files if k.endswith(embed))
    param = dict(model.named_parameters())["embed"]
    assert param.dtype == torch.bfloat16
    assert torch.equal(param, files[key])
