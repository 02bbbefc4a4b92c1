"""Model checkpoints shared by the engine tests (built once per session, random weights)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import make_jamba

from marconi_ray.engine.factory import make_model
from marconi_ray.engine.model_presets import LFM2_FAMILIES as LFM2
from marconi_ray.engine.model_presets import QWEN_FAMILIES as QWEN

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """family -> a tiny checkpoint dir (nemotron_h, bamba, the Gated DeltaNet and LFM2
    families, falcon_h1 and zamba2 from the factory, jamba by hand: the factory does not
    make Mamba-1 models)."""
    root = tmp_path_factory.mktemp("models")
    families = ("nemotron_h", "bamba", *QWEN, *LFM2, "falcon_h1", "zamba2")
    out = {fam: make_model("tiny", fam, root / fam) for fam in families}
    out["jamba"] = make_jamba(root / "jamba")
    return out
