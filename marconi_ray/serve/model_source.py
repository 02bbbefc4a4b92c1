"""Where a deployment's model comes from: a model folder, a preset built on first use, or
a Hugging Face model id.

A model spec is, in this order of precedence,
- a folder holding `config.json` (a checkpoint, e.g. one written by `make-model`),
- the name of a model shipped in the package (`PACKAGED_MODELS`): `chat`, a small hybrid
  trained on ShareGPT conversations by `scripts/train_chat.py`, read in place (never
  written),
- a preset name, optionally with a family: `tiny`, `small`, `tiny:bamba`
  (family default `nemotron_h`), or
- a Hugging Face id `ORG/NAME[@REVISION]` (see `serve.hub_model`): the snapshot folder in
  the Hugging Face cache, downloaded first where the network allows; every node that loads
  the model resolves it again through its own cache (`hub_source`).

A preset resolves to `<root>/<preset>-<family>`, built with `engine.presets.factory.make_model`
the first time (seed 0, float32). A folder whose `marconi.json` (written last by
`make_model`) is missing or names another preset is rebuilt; a complete one is reused
untouched. Builds go to a temporary sibling folder that is renamed into place, so a crash
never leaves a folder that looks complete.

The root is `MARCONI_MODELS_DIR` when set, else `~/.cache/marconi_ray/models`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Final

from marconi_ray.engine.presets.model_presets import BUILD_VERSION, FAMILIES, PRESETS
from marconi_ray.serve.hub_model import HubModel, parse_hub_id

MODELS_DIR_ENV: Final = "MARCONI_MODELS_DIR"
"""Environment variable overriding the folder presets are built in."""

DEFAULT_FAMILY: Final = "nemotron_h"
RECORD_FILE: Final = "marconi.json"
_CONFIG_FILE: Final = "config.json"


PACKAGED_MODELS: Final = MappingProxyType({"chat": "chat"})
"""Name -> folder under `marconi_ray/data` of each model the package ships."""


def packaged_model(spec: str) -> Path | None:
    """The folder of the packaged model `spec` names, or None when it names none.

    ValueError naming the folder when the package lacks its `config.json` (an install
    without its package data)."""
    if spec not in PACKAGED_MODELS:
        return None
    folder = Path(str(resources.files("marconi_ray.data") / PACKAGED_MODELS[spec]))
    if not (folder / _CONFIG_FILE).is_file():
        raise ValueError(
            f"packaged model {spec!r}: {folder} has no {_CONFIG_FILE}; reinstall marconi-ray "
            "with its package data"
        )
    return folder


def default_models_root() -> Path:
    """`$MARCONI_MODELS_DIR` when set and non-empty, else `~/.cache/marconi_ray/models`."""
    env = os.environ.get(MODELS_DIR_ENV, "")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "marconi_ray" / "models"


def buildable_presets() -> list[str]:
    """Preset names `resolve_model` builds on the fly (large presets excluded)."""
    return sorted(name for name, p in PRESETS.items() if not p.large)


def parse_preset_spec(spec: str) -> tuple[str, str] | None:
    """`(preset, family)` when `spec` names a preset (`preset` or `preset:family`), else None.

    ValueError naming the family when the preset is known but the family is not, and
    naming the preset when it is too large to build on the fly (`paper-7b-shape`).
    """
    name, sep, family = spec.partition(":")
    if name not in PRESETS:
        return None
    family = family if sep else DEFAULT_FAMILY
    if family not in FAMILIES:
        raise ValueError(
            f"unknown model family {family!r} in model {spec!r}; valid families: {list(FAMILIES)}"
        )
    if PRESETS[name].large:
        raise ValueError(
            f"preset {name!r} is too large to build on the fly; build it once with "
            f"`marconi-ray make-model --preset {name} --family {family} --out DIR "
            "--allow-large` and pass DIR as the model"
        )
    return name, family


def default_model_name(spec: str) -> str:
    """The name clients pass as `model` by default: the preset spec as written
    (`tiny`, `tiny:bamba`), the Hugging Face id as written (`ORG/NAME[@REVISION]`), or
    the model folder's name."""
    name, _, _ = spec.partition(":")
    if name in PRESETS or spec in PACKAGED_MODELS or _is_hub_spec(spec):
        return spec
    return Path(spec).expanduser().resolve().name or spec


def resolve_model(spec: str, root: Path | None = None) -> Path:
    """The model folder of `spec` (see the module docstring), building a preset if needed.

    Args:
        spec: a folder with `config.json`, a packaged model name (`chat`),
            `preset[:family]`, or `ORG/NAME[@REVISION]`.
        root: where presets are built (default `default_models_root()`).

    Returns:
        An absolute folder path holding `config.json` (for a Hugging Face id, its snapshot
        in this node's Hugging Face cache).

    Raises:
        ValueError: naming `spec` when it is none of these (listing the presets), when a
            folder lacks `config.json`, when the preset is too large / the family unknown,
            or, in one line, when a Hugging Face id is neither cached nor downloadable.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"model must be a folder, a preset name or a Hugging Face id, got {spec!r}"
        )
    path = Path(spec).expanduser()
    if (path / _CONFIG_FILE).is_file():
        return path.resolve()
    packaged = packaged_model(spec)
    if packaged is not None:
        return packaged
    preset = parse_preset_spec(spec)
    if preset is not None:
        return _ensure_preset(*preset, root if root is not None else default_models_root())
    if path.is_dir():
        raise ValueError(f"model folder {str(path)!r} has no {_CONFIG_FILE}")
    hub = parse_hub_id(spec)
    if hub is not None:
        return hub.local_dir()
    raise ValueError(
        f"model {spec!r} is neither a model folder (with {_CONFIG_FILE}), a preset nor a "
        f"Hugging Face id (ORG/NAME[@REVISION]); packaged models: {list(PACKAGED_MODELS)}, "
        f"presets: {buildable_presets()} "
        f"(optionally 'preset:family', families: {list(FAMILIES)})"
    )


def _is_hub_spec(spec: str) -> bool:
    """Whether `resolve_model` reads `spec` as a Hugging Face id: it has the id's shape
    and no folder of that name exists."""
    try:
        hub = parse_hub_id(spec)
    except ValueError:
        return False
    path = Path(spec).expanduser()
    return hub is not None and not path.is_dir()


def hub_source(spec: str, model_dir: Path) -> HubModel | None:
    """The Hugging Face model `spec` names, pinned to the commit of `model_dir` (what
    `resolve_model(spec)` returned), or None when `spec` is a folder or a preset: the
    nodes that load the model resolve it through their own cache (`HubModel.local_dir`)."""
    if not _is_hub_spec(spec):
        return None
    hub = parse_hub_id(spec)
    return None if hub is None else hub.pinned(Path(model_dir))


def _is_complete(folder: Path, preset: str, family: str) -> bool:
    record = folder / RECORD_FILE
    if not (record.is_file() and (folder / _CONFIG_FILE).is_file()):
        return False
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict):
        return False
    built = (data.get("preset"), data.get("family"), data.get("build_version"))
    return built == (preset, family, BUILD_VERSION)


def _ensure_preset(preset: str, family: str, root: Path) -> Path:
    """`root/<preset>-<family>`, built by `make_model` unless already complete (same
    preset, family and `BUILD_VERSION`: a folder from an older build is rebuilt)."""
    target = (root / f"{preset}-{family}").resolve()
    if _is_complete(target, preset, family):
        return target
    from marconi_ray.engine.presets.factory import make_model  # torch: imported only to build

    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        make_model(preset, family, staging, overwrite=True)
        if _is_complete(target, preset, family):  # another process finished first
            return target
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_drafter(method: str, root: Path | None = None) -> str:
    """A speculative `method` with its draft model resolved: `draft:MODEL` (MODEL as
    `resolve_model` takes it) becomes `draft:<its folder>`; any other is returned as
    given (`SpeculativeConfig` validates it)."""
    prefix = "draft:"
    if not method.startswith(prefix) or len(method) == len(prefix):
        return method
    return prefix + str(resolve_model(method[len(prefix) :], root))
