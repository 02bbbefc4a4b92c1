"""Serving a model by its Hugging Face id, offline (`HF_HUB_OFFLINE=1`), from a local
Hugging Face cache: a sharded bfloat16 checkpoint with the real Llama-2 tokenizer, a chat
template and a generation config (see `tests/hub_checkpoint.py`).

The service runs on a local Ray behind the real Serve app. The driver validates the
config against one cache, which is then moved away: the ingress, the coordinator and the
model shard find the model only through their own node's cache (`HF_HUB_CACHE` of the Ray
workers), not through the driver's path.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hub_checkpoint import COMMIT, build_checkpoint, place_in_hub_cache, write_generation_config
from ray import serve
from serve_helpers import SERVE_PORT, local_ray
from transformers import AutoTokenizer

from marconi_ray.cli.main import main
from marconi_ray.engine.engine import Engine
from marconi_ray.protocol.generation_defaults import read_generation_defaults
from marconi_ray.protocol.model_files import checkpoint_dtype
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.app import build_app, shutdown_app, start_actors
from marconi_ray.serve.config import config_from_mapping
from marconi_ray.serve.hub_model import HubModel, parse_hub_id
from marconi_ray.serve.ingress.prepare import ServedModel, prepare_chat, prepare_completion
from marconi_ray.serve.model_source import resolve_model

PORT = SERVE_PORT
REPO = "marconi-test/tiny-hybrid"
BASE = f"http://127.0.0.1:{PORT}/v1"
MESSAGES = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "Hello there!"},
]
GEN = {"temperature": 0.7, "top_p": 0.9, "top_k": 1, "max_new_tokens": 6, "do_sample": True}
"""generation_config.json's sampling fields; top_k 1 makes a default request greedy."""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The checkpoint, in a Hugging Face cache, with a generation config whose second
    end-of-sequence id is a token the greedy answer to `MESSAGES` writes (not its first)."""
    root = tmp_path_factory.mktemp("hub")
    folder = build_checkpoint(root / "ckpt")
    auto = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    out = auto.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    prompt = [int(t) for t in out["input_ids"]]
    greedy = Engine(folder, system="vanilla").generate(
        prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    )
    tokens = list(greedy.tokens)
    stop_at = next(i for i in range(1, len(tokens)) if tokens[i] not in tokens[:i])
    write_generation_config(folder, eos_token_id=[2, tokens[stop_at]], **GEN)
    cache = root / "node-cache"
    snapshot = place_in_hub_cache(folder, cache, REPO)
    return {
        "root": root,
        "cache": cache,
        "snapshot": snapshot,
        "prompt": prompt,
        "greedy": tokens,
        "stop_at": stop_at,
        "auto": auto,
    }


@pytest.fixture(scope="module")
def service(checkpoint: dict[str, Any]) -> Any:
    """The app serving `REPO`, validated against a copy of the cache that is deleted
    before Ray starts: its workers see only the node cache."""
    driver_cache = checkpoint["root"] / "driver-cache"
    shutil.copytree(checkpoint["cache"], driver_cache, symlinks=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_HUB_CACHE", str(driver_cache))
        settings = config_from_mapping(
            {"model": REPO, "port": PORT, "cache_bytes": 10**8}
        ).to_settings()
        assert settings.hub_model == HubModel(REPO, "main", COMMIT)
        assert Path(settings.model_dir).is_relative_to(driver_cache)
        shutil.rmtree(driver_cache)
        mp.setenv("HF_HUB_CACHE", str(checkpoint["cache"]))
        with local_ray(fresh=True):  # its workers see only HF_HUB_CACHE set above
            start_actors(settings)
            serve.run(build_app(settings), name=settings.app_name, route_prefix="/")
            yield settings
            shutdown_app(settings)


def _post(path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        BASE + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        out: dict[str, Any] = json.loads(reply.read())
    return out


# ---------------------------------------------------------------------- without Ray
def test_hub_ids_parse_and_paths_do_not() -> None:
    assert parse_hub_id("org/name") == HubModel("org/name", "main")
    assert parse_hub_id("org/name@v1.0") == HubModel("org/name", "v1.0")
    for not_an_id in ("/models/x", "./x", "~/x", "tiny", "tiny:bamba", "a/b/c"):
        assert parse_hub_id(not_an_id) is None
    with pytest.raises(ValueError, match="'a--b/c'"):
        parse_hub_id("a--b/c")


def test_unknown_id_offline_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ValueError) as err:
        config_from_mapping({"model": "nobody/missing@v2"}).to_settings()
    message = str(err.value)
    assert "'nobody/missing@v2'" in message and "HF_HUB_OFFLINE" in message
    assert str(tmp_path) in message and "\n" not in message
    assert main(["serve", "--model", "nobody/missing"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and "'nobody/missing@main'" in stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.data("llama2_tokenizer")
def test_cached_id_resolves_offline_and_a_folder_still_wins(
    checkpoint: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = checkpoint["cache"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    snapshot = cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    assert resolve_model(REPO) == snapshot
    assert resolve_model(f"{REPO}@{COMMIT}") == snapshot
    with pytest.raises(ValueError, match=r"'marconi-test/tiny-hybrid@v9'.*not in the Hugging"):
        resolve_model(f"{REPO}@v9")
    monkeypatch.chdir(cache)  # a folder named like the id is a folder, not an id
    local = Path(REPO)
    local.mkdir(parents=True)
    (local / "config.json").write_text((snapshot / "config.json").read_text())
    assert resolve_model(REPO) == local.resolve()


@pytest.mark.data("llama2_tokenizer")
def test_dtype_auto_is_the_checkpoints(checkpoint: dict[str, Any], tmp_path: Path) -> None:
    """A bfloat16 checkpoint runs in bfloat16 with `dtype: auto` (float32 by default)."""
    folder = str(checkpoint["snapshot"])
    assert config_from_mapping({"model": folder, "dtype": "auto"}).to_settings().dtype == (
        "bfloat16"
    )
    assert config_from_mapping({"model": folder}).to_settings().dtype == "float32"
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    assert checkpoint_dtype(tmp_path) == "float16"
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float8_e4m3fn"}))
    assert checkpoint_dtype(tmp_path) == "float32"


@pytest.mark.data("llama2_tokenizer")
def test_service_prompt_and_defaults_come_from_the_checkpoint(
    checkpoint: dict[str, Any],
) -> None:
    """The service's chat prompt is transformers' `apply_chat_template` on the same
    messages; a request without sampling settings takes generation_config's."""
    snapshot = checkpoint["snapshot"]
    model = ServedModel.load(snapshot, REPO)
    chat = prepare_chat({"model": REPO, "messages": MESSAGES}, model)
    assert chat.prompt.tolist() == checkpoint["prompt"]
    p = chat.params
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (0.7, 0.9, 1, 6)
    eos2 = checkpoint["greedy"][checkpoint["stop_at"]]
    assert p.stop_token_ids == (2, eos2)
    own = prepare_chat(
        {"model": REPO, "messages": MESSAGES, "temperature": 0, "top_k": 5, "max_tokens": 9},
        model,
    ).params
    assert (own.temperature, own.top_p, own.top_k, own.max_tokens) == (0.0, 0.9, 5, 9)
    text = prepare_completion({"model": REPO, "prompt": "Hi", "ignore_eos": True}, model)
    assert text.prompt.tolist() == checkpoint["auto"].encode("Hi")
    assert (text.params.max_tokens, text.params.stop_token_ids) == (6, ())
    defaults = read_generation_defaults(snapshot, 32000)
    assert defaults.eos_token_ids == (2, eos2)


def test_generation_config_values_are_checked(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    write_generation_config(tmp_path, eos_token_id=9, temperature=1.0, top_k=50, top_p=0.5)
    defaults = read_generation_defaults(tmp_path, 100)
    assert defaults.eos_token_ids == (2, 7, 9)
    assert defaults.sampling() == {"top_p": 0.5}  # transformers' defaults are not applied
    for bad, needle in (({"top_p": 0}, "top_p 0"), ({"eos_token_id": "x"}, "eos_token_id")):
        write_generation_config(tmp_path, **bad)
        with pytest.raises(ValueError, match=needle):
            read_generation_defaults(tmp_path, 100)
    write_generation_config(tmp_path, eos_token_id=[2, 100])
    with pytest.raises(ValueError, match="eos_token_id 100"):
        read_generation_defaults(tmp_path, 100)


# ---------------------------------------------------------------------- over HTTP
@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.data("llama2_tokenizer")
def test_served_by_id_with_the_checkpoint_defaults_and_eos(
    service: Any, checkpoint: dict[str, Any]
) -> None:
    greedy, stop_at = checkpoint["greedy"], checkpoint["stop_at"]
    with urllib.request.urlopen(BASE + "/models", timeout=30) as reply:
        assert [m["id"] for m in json.loads(reply.read())["data"]] == [REPO]
    body = {"model": REPO, "messages": MESSAGES, "return_token_ids": True}
    # no sampling settings: generation_config's (top_k 1: greedy; max_new_tokens 6)
    whole = _post("/chat/completions", {**body, "ignore_eos": True})
    choice = whole["choices"][0]
    assert choice["token_ids"] == greedy and choice["finish_reason"] == "length"
    assert whole["usage"]["prompt_tokens"] == len(checkpoint["prompt"])
    assert choice["message"]["content"] == checkpoint["auto"].decode(greedy)
    # the second end-of-sequence id, listed only in generation_config.json, ends it
    stopped = _post("/chat/completions", body)["choices"][0]
    assert stopped["finish_reason"] == "stop"
    assert stopped["token_ids"] == greedy[: stop_at + 1]
    # a request's own settings win over the defaults
    sampled = _post(
        "/chat/completions",
        {**body, "ignore_eos": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 3},
    )["choices"][0]
    assert len(sampled["token_ids"]) == 6 and sampled["token_ids"] != greedy
