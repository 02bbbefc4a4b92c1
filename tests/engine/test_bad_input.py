"""Bad input gets a ValueError naming the value and changes nothing (invariant 5)."""

from __future__ import annotations

import json
import shutil

import pytest
from engine_helpers import GREEDY, prompts
from safetensors.torch import load_file, save_file

from marconi_ray.core.cache import cache_codec
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.loader import load_model
from marconi_ray.protocol.sampling import SamplingParams


@pytest.fixture(scope="module")
def warm_engine(model_dirs):
    engine = Engine(model_dirs["nemotron_h"], system="marconi", cache_bytes=50_000_000)
    for p in prompts(1, 3, 30, engine.config.vocab_size):
        engine.generate(p, GREEDY)
    return engine


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "empty"),
        ([5, 10_000, 6], "10000"),
        ([5, -1], "-1"),
        ([[1, 2], [3, 4]], "one-dimensional"),
        ([1.5, 2.0], "integers"),
        ("hello", "string"),
    ],
)
def test_bad_prompt_changes_nothing(warm_engine, prompt, message):
    before = (cache_codec.snapshot(warm_engine.cache), warm_engine.store.bytes_used)
    with pytest.raises(ValueError, match=message):
        warm_engine.generate(prompt, GREEDY)
    assert (cache_codec.snapshot(warm_engine.cache), warm_engine.store.bytes_used) == before
    assert warm_engine.num_running == 0


def test_prompt_over_context_limit(warm_engine):
    limit = warm_engine.config.max_position
    before = cache_codec.snapshot(warm_engine.cache)
    with pytest.raises(ValueError, match=str(limit)):
        warm_engine.generate([7] * limit, GREEDY)
    assert cache_codec.snapshot(warm_engine.cache) == before


def test_generation_stops_at_context_limit(model_dirs):
    engine = Engine(model_dirs["nemotron_h"], system="marconi", cache_bytes=50_000_000)
    limit = engine.config.max_position
    out = engine.generate(
        [7] * (limit - 3), SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    )
    assert len(out.tokens) == 3 and out.finish_reason == "length"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"seed": -5}, "seed"),
    ],
)
def test_bad_sampling_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_bad_params_object_and_stop_ids(warm_engine):
    before = cache_codec.snapshot(warm_engine.cache)
    with pytest.raises(ValueError, match="SamplingParams"):
        warm_engine.generate([7, 8, 9], {"max_tokens": 3})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="99999"):
        warm_engine.generate([7, 8, 9], SamplingParams(stop_token_ids=(99999,)))
    with pytest.raises(ValueError, match="2 sampling params"):
        warm_engine.generate_many([[7, 8], [9, 10], [11]], [GREEDY, GREEDY])
    assert cache_codec.snapshot(warm_engine.cache) == before


def test_unknown_system_and_dtype(model_dirs):
    with pytest.raises(ValueError, match="lru-only"):
        Engine(model_dirs["nemotron_h"], system="lru-only")
    with pytest.raises(ValueError, match="float8"):
        Engine(model_dirs["nemotron_h"], dtype="float8")


def test_unknown_architecture_names_the_file(model_dirs, tmp_path):
    bad = tmp_path / "llama"
    shutil.copytree(model_dirs["nemotron_h"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"] = "llama"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config\.json.*'llama'"):
        load_model(bad)


def _with_weights(src, dst, edit):
    """Copy checkpoint `src` to `dst` with its safetensors passed through `edit(dict)`."""
    shutil.copytree(src, dst)
    weights = load_file(str(dst / "model.safetensors"))
    edit(weights)
    save_file(weights, str(dst / "model.safetensors"))
    return dst


def test_missing_weight_names_file_and_key(model_dirs, tmp_path):
    key = "model.layers.0.mamba.A_log"
    bad = _with_weights(model_dirs["bamba"], tmp_path / "missing", lambda w: w.pop(key))
    with pytest.raises(ValueError, match=rf"model\.safetensors.*{key}"):
        load_model(bad)


def test_mis_shaped_and_unused_weights(model_dirs, tmp_path):
    key = "backbone.layers.0.mixer.in_proj.weight"

    def shorten(w):
        w[key] = w[key][:-1]

    def add(w):
        w["backbone.layers.99.mixer.foo"] = w[key][:1].clone()

    with pytest.raises(ValueError, match=rf"model\.safetensors.*{key}.*shape"):
        load_model(_with_weights(model_dirs["nemotron_h"], tmp_path / "shape", shorten))
    with pytest.raises(ValueError, match=r"layers\.99"):
        load_model(_with_weights(model_dirs["nemotron_h"], tmp_path / "extra", add))


def test_missing_model_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_model(tmp_path / "nowhere")


def test_failure_mid_request_releases_everything(model_dirs, monkeypatch):
    """A model error during decode (injected) aborts the plan, frees the request's states
    and leaves no lock: the cache and store agree and later requests are still exact."""
    engine = Engine(model_dirs["nemotron_h"], system="marconi", cache_bytes=50_000_000)
    prompt = prompts(21, 1, 40, engine.config.vocab_size)[0]
    first = engine.generate(prompt, GREEDY)
    before = (engine.cache.bytes_used, engine.store.bytes_used)
    real_decode = engine.model.decode_batch  # the worker's decode step
    calls = {"n": 0}

    def flaky(ids, states):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected device error")
        return real_decode(ids, states)

    monkeypatch.setattr(engine.model, "decode_batch", flaky)
    follow_up = prompt + list(first.tokens) + [9, 10, 11]
    with pytest.raises(RuntimeError, match="injected"):
        engine.generate(follow_up, GREEDY)
    assert engine.cache.open_plans == 0 and engine.num_running == 0
    assert all(n.lock == 0 for n in engine.cache.tree.iter_nodes())
    assert (engine.cache.bytes_used, engine.store.bytes_used) == before
    monkeypatch.setattr(engine.model, "decode_batch", real_decode)
    again = engine.generate(follow_up, GREEDY)
    assert again.usage.cached_tokens == len(prompt) + len(first.tokens)
    reference = Engine(model_dirs["nemotron_h"], system="vanilla")
    assert again.tokens == reference.generate(follow_up, GREEDY).tokens
