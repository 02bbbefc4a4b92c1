"""`scripts/train_mtp.py`'s training path: gradients reach the MTP layers through the
engine's own modules (the attention's causal prefill, the FFN, the final norm) with the
target frozen, a few steps on one window lower its loss, and the saved weights load back
as the drafter's (the same logits)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from train_mtp import save_head, window_loss

from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.mtp import load_mtp
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.engine.presets.mtp_weights import add_mtp_weights

torch.set_num_threads(1)


def test_training_lowers_the_loss_and_the_weights_load_back(tmp_path: Path) -> None:
    folder = add_mtp_weights(make_model("tiny", "qwen3_5_text", tmp_path / "m"), seed=1)
    model = load_model(folder)
    head = load_mtp(model, folder)
    for p in head.parameters():
        p.requires_grad_(True)
    frozen = {n: p.clone() for n, p in model.named_parameters()}
    window = torch.arange(7, 7 + 33) % model.cfg.vocab_size
    opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
    losses = []
    for _ in range(12):
        loss = window_loss(head, window)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters())
    save_head(head, folder)
    again = load_mtp(load_model(folder), folder)
    ids, hidden = window[1:5], torch.randn(4, model.cfg.hidden_size)
    want, _ = head.prefill(ids, hidden, torch.arange(4), head.new_kv())
    got, _ = again.prefill(ids, hidden, torch.arange(4), again.new_kv())
    torch.testing.assert_close(got, want)
