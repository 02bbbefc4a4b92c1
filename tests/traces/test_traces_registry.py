"""Trace specs, the packaged sample, data-folder discovery and tokenizer loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marconi_ray.traces import mooncake, sharegpt, swebench
from marconi_ray.traces.paths import (
    DATA_FILES,
    data_path,
    default_data_dir,
    missing_data,
    require_file,
)
from marconi_ray.traces.registry import load_sample, load_trace
from marconi_ray.traces.tokenizer import LLAMA2_RELPATH, HFTokenizer, Tokenizer, load_tokenizer
from marconi_ray.traces.trace import Trace, write_jsonl


def test_sample_loads_without_data_dir(isolated_env: Path) -> None:
    assert default_data_dir() == isolated_env
    t = load_trace("sample")
    assert t.n_sessions == 20 and t.name == "sample" and len(t) == 257
    assert sorted(r.ts for r in t if r.turn_id == 0) == [float(i) for i in range(20)]
    small = load_trace("sample", n_sessions=3, sessions_per_second=2.0)
    assert small.n_sessions == 3
    assert sorted(r.ts for r in small if r.turn_id == 0) == [0.0, 0.5, 1.0]


def test_sample_file_is_small() -> None:
    from importlib import resources

    ref = resources.files("marconi_ray.data").joinpath("sharegpt_sample.jsonl.gz")
    assert len(ref.read_bytes()) < 2_000_000


@pytest.mark.data("sharegpt", "llama2_tokenizer")
def test_sample_equals_first_20_sessions(sharegpt100: Trace) -> None:
    ref = sharegpt100.first_sessions(20)
    sample = load_sample()
    assert len(ref) == len(sample)
    for a, b in zip(ref, sample, strict=True):
        assert (a.session_id, a.turn_id, a.ts) == (b.session_id, b.turn_id, b.ts)
        assert a.input_tokens.tolist() == b.input_tokens.tolist()
        assert a.output_tokens.tolist() == b.output_tokens.tolist()


def test_jsonl_file_spec(tmp_path: Path, isolated_env: Path) -> None:
    path = write_jsonl(load_sample().first_sessions(2), tmp_path / "two.jsonl")
    t = load_trace(str(path))
    assert t.n_sessions == 2 and t.name == "two"
    with pytest.raises(ValueError, match="gaps"):
        load_trace(str(path), gaps="poisson")


def test_unknown_spec_lists_choices(isolated_env: Path) -> None:
    with pytest.raises(ValueError, match=r"'lmsys'.*sharegpt-rejoined.*swebench.*sample"):
        load_trace("lmsys")


def test_builder_without_data_names_missing_file(isolated_env: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.model"):
        load_trace("sharegpt")


@pytest.mark.data("sharegpt", "sharegpt_head4000", "swebench", "llama2_tokenizer")
def test_builder_specs(tmp_path: Path, llama: Tokenizer, data_dir: Path) -> None:
    t = load_trace("sharegpt", n_sessions=4, tokenizer=llama, cache_dir=tmp_path)
    assert t.n_sessions == 4 and t.name == "sharegpt"
    r = load_trace(
        "sharegpt-rejoined",
        n_sessions=3,
        sessions_per_second=2.0,
        data_dir=data_dir,
        tokenizer=llama,
        cache_dir=tmp_path,
        seed=1,
    )
    assert r.n_sessions == 3 and r.name == "sharegpt-rejoined"
    s = load_trace(
        "swebench", n_sessions=2, tokenizer=llama, use_cache=False, max_turns=3, gaps="poisson"
    )
    assert len(s) == 6 and s.name == "swebench"
    with pytest.raises(ValueError, match="bogus"):
        load_trace("swebench", bogus=1)
    with pytest.raises(ValueError, match="mode"):
        load_trace("sharegpt", mode="rejoined")


def test_default_data_dir_env_and_repo_relative(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARCONI_DATA_DIR", "/some/where")
    assert default_data_dir() == Path("/some/where")
    monkeypatch.delenv("MARCONI_DATA_DIR")
    import marconi_ray.traces.paths as paths

    repo = Path(paths.__file__).resolve().parents[2]
    assert default_data_dir() == repo.parent / "shared" / "data"


def test_the_data_table_is_what_the_builders_read(tmp_path: Path) -> None:
    """`DATA_FILES` (what the tests' `data` marker checks) names each builder's default."""
    assert data_path("sharegpt", tmp_path) == sharegpt.default_path("artifact", tmp_path)
    assert data_path("sharegpt_head4000", tmp_path) == sharegpt.default_path("rejoined", tmp_path)
    assert data_path("swebench", tmp_path) == swebench.default_path(tmp_path)
    assert data_path("mooncake", tmp_path) == mooncake.default_path(tmp_path)
    assert data_path("llama2_tokenizer", tmp_path) == tmp_path / LLAMA2_RELPATH
    assert data_path("mooncake") == default_data_dir() / DATA_FILES["mooncake"]


def test_missing_data_names_each_absent_file(tmp_path: Path) -> None:
    have = data_path("mooncake", tmp_path)
    have.parent.mkdir(parents=True)
    have.write_text("")
    assert missing_data(["mooncake", "llama2_tokenizer"], tmp_path) == {
        "llama2_tokenizer": tmp_path / "tokenizers" / "llama2" / "tokenizer.model"
    }
    assert missing_data(["mooncake"], tmp_path) == {}
    with pytest.raises(KeyError, match="'nope'; known: sharegpt, "):
        data_path("nope")


def test_require_file_names_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="absent"):
        require_file(tmp_path / "absent")


def test_load_tokenizer_rejects_unknown(tmp_path: Path) -> None:
    other = tmp_path / "vocab.txt"
    other.write_text("x")
    with pytest.raises(ValueError, match="vocab"):
        load_tokenizer(other)
    with pytest.raises(ValueError, match="nothing-here"):
        load_tokenizer(tmp_path / "nothing-here")


def test_hf_tokenizer_folder(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as HF
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    hf = HF(WordLevel({"<unk>": 0, "<s>": 1, "hello": 2, "world": 3}, unk_token="<unk>"))
    hf.pre_tokenizer = Whitespace()
    hf.add_special_tokens(["<s>"])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, HFTokenizer) and isinstance(tok, Tokenizer)
    assert tok.encode("hello world", True) == [1, 2, 3]
    assert tok.encode("hello world", False) == [2, 3]
    assert tok.vocab_size == 4 and len(tok.fingerprint) == 64
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "world"}))
    assert load_tokenizer(tmp_path / "tokenizer.json").encode("hello", True) == [3, 2]


@pytest.mark.data("llama2_tokenizer")
def test_llama_tokenizer(llama: Tokenizer) -> None:
    assert llama.vocab_size == 32000
    assert llama.encode("hello world", True) == [1, 22172, 3186]
    assert llama.fingerprint == load_tokenizer(None).fingerprint
