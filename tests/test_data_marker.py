"""The `data` marker (tests/conftest.py): a test naming an absent data file is skipped
with a reason naming the file, one whose files are all there runs, and a bare marker or
an unknown name stops the collection."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
CONFTEST = (Path(__file__).parent / "conftest.py").read_text()


def test_absent_files_skip_by_name_present_ones_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    (data / "mooncake").mkdir(parents=True)
    (data / "mooncake" / "synthetic_trace.jsonl").write_text("")
    monkeypatch.setenv("MARCONI_DATA_DIR", str(data))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.data("mooncake")
        def test_present():
            pass

        @pytest.mark.data("mooncake", "llama2_tokenizer")
        def test_absent():
            pass

        @pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.data("swebench"))])
        def test_param(n):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-rs")
    result.assert_outcomes(passed=2, skipped=2)
    absent = f"{data}/tokenizers/llama2/tokenizer.model"
    result.stdout.fnmatch_lines(
        [
            f"SKIPPED *:7: needs shared data, absent: llama2_tokenizer ({absent})",
            "SKIPPED *:11: needs shared data, absent: swebench (*/trajs)",
        ]
    )


@pytest.mark.parametrize("mark", ["pytest.mark.data", 'pytest.mark.data("nope")'])
def test_a_bare_marker_or_an_unknown_name_is_a_usage_error(
    pytester: pytest.Pytester, mark: str
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(f"import pytest\n\n@{mark}\ndef test_x():\n    pass\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_x*"])
