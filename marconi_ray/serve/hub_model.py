"""A model named by its Hugging Face id, `ORG/NAME[@REVISION]`, and its folder on this node.

Every node that reads the model's files (the driver validating the config, the ingress,
the coordinator, each tensor-parallel shard) resolves the id through its own Hugging Face
cache with `huggingface_hub.snapshot_download`: downloaded once per node where the
network allows, read from the cache otherwise. The driver pins the revision to the commit
it resolved (`HubModel.commit`), so every node loads the same snapshot.

The cache and offline mode are read from the environment at each call, as
`huggingface_hub` reads them at import: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
`$XDG_CACHE_HOME/huggingface/hub` (default `~/.cache/huggingface/hub`);
`HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) set to 1/ON/YES/TRUE forbids downloading.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

HUB_FILES: Final = ("*.json", "*.safetensors", "*.jinja", "tokenizer.model")
"""The files of a repository a model needs (config, weights, tokenizer, chat template)."""
DEFAULT_REVISION: Final = "main"
_TRUE: Final = frozenset({"1", "ON", "YES", "TRUE"})
_HUB_ID: Final = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[^@\s]+))?$")
_COMMIT: Final = re.compile(r"^[0-9a-f]{40}$")
_REASON_CHARS: Final = 300


def hub_offline() -> bool:
    """Whether `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) forbids downloading, now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def hub_cache_dir() -> Path:
    """This process's Hugging Face hub cache folder, from the environment now (see the
    module docstring)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.path.expandvars(os.environ[name])).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface"
    )
    return Path(os.path.expandvars(home)).expanduser() / "hub"


@dataclass(frozen=True)
class HubModel:
    """A Hugging Face model repository at a revision.

    Attributes:
        repo_id: `ORG/NAME`.
        revision: the branch, tag or commit as written (`main` when none was).
        commit: the commit the revision resolved to where the model was first resolved,
            or None before that; `local_dir` then loads exactly that snapshot.
    """

    repo_id: str
    revision: str = DEFAULT_REVISION
    commit: str | None = None

    @property
    def spec(self) -> str:
        """`ORG/NAME@REVISION` as a user writes it."""
        return f"{self.repo_id}@{self.revision}"

    def pinned(self, snapshot: Path) -> HubModel:
        """This model pinned to the commit of `snapshot` (a `snapshots/<commit>` folder)."""
        commit = snapshot.name
        return HubModel(self.repo_id, self.revision, commit if _COMMIT.match(commit) else None)

    def local_dir(self) -> Path:
        """The snapshot folder on this node: from the cache, downloaded first when it is
        not there and the environment allows.

        Raises:
            ValueError: one line naming the model (and the cache folder) when it is
                neither cached nor downloadable, or its snapshot has no `config.json`.
        """
        from huggingface_hub import snapshot_download

        cache = hub_cache_dir()
        offline = hub_offline()
        try:
            folder = Path(
                snapshot_download(
                    self.repo_id,
                    revision=self.commit or self.revision,
                    cache_dir=cache,
                    local_files_only=offline,
                    allow_patterns=list(HUB_FILES),
                )
            )
        except (OSError, ValueError) as exc:  # huggingface_hub's HTTP, cache, id errors
            raise ValueError(self._unavailable(cache, offline, exc)) from None
        if not (folder / "config.json").is_file():
            raise ValueError(
                f"Hugging Face model {self.spec!r} has no config.json in {str(folder)!r}; "
                "it is not a model checkpoint"
            )
        return folder

    def _unavailable(self, cache: Path, offline: bool, exc: Exception) -> str:
        where = f"not in the Hugging Face cache {str(cache)!r}"
        if offline:
            return f"model {self.spec!r} is {where}, and HF_HUB_OFFLINE=1 forbids downloading it"
        reason = " ".join(str(exc).split()) or type(exc).__name__
        if len(reason) > _REASON_CHARS:
            reason = reason[: _REASON_CHARS - 3] + "..."
        return f"model {self.spec!r} is {where} and could not be downloaded: {reason}"


def parse_hub_id(spec: str) -> HubModel | None:
    """The `HubModel` that `spec` names (`ORG/NAME` or `ORG/NAME@REVISION`), or None
    when `spec` does not have that shape (a path such as `/models/x` or `./x` does not).

    Raises ValueError naming `spec` when it has the shape but is not a valid repository id
    (Hugging Face forbids `--` and `..`, and more than 96 characters).
    """
    match = _HUB_ID.match(spec)
    if match is None:
        return None
    repo = match["repo"]
    if "--" in repo or ".." in repo or len(repo) > 96 or repo.endswith(".git"):
        raise ValueError(f"model {spec!r}: {repo!r} is not a valid Hugging Face repository id")
    return HubModel(repo, match["rev"] or DEFAULT_REVISION)
