"""Model checkpoints shared by the engine tests (built once per session, random weights)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from marconi_ray.engine.presets.factory import make_model
from marconi_ray.engine.presets.model_presets import FAMILIES

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> a tiny checkpoint dir from the factory, for every make-model family
    (`jamba` has experts, `nemotron_h_moe` is a NemotronH checkpoint with MoE layers)."""
    root = tmp_path_factory.mktemp("models")
    return {fam: make_model("tiny", fam, root / fam) for fam in FAMILIES}
