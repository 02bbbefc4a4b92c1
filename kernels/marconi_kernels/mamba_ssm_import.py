"""Import mamba-ssm's Triton kernels without its compiled CUDA extensions.

``mamba_ssm/__init__.py`` imports ``selective_scan_cuda`` (a compiled extension), so a
mamba-ssm built with ``MAMBA_SKIP_CUDA_BUILD=TRUE`` (what ``make install-gpu`` installs:
a pure-Python wheel, seconds to build, no nvcc) fails on ``import mamba_ssm``. The Triton
kernels under ``mamba_ssm.ops.triton`` need none of that. :func:`import_mamba_triton`
registers the installed package as a bare package (its ``__init__`` not run) when it is not
imported yet, imports just the two kernel modules we use, then takes the bare package out
of ``sys.modules`` again: other libraries that probe ``import mamba_ssm`` (transformers
picks mamba-ssm's kernels for its own Mamba-2 models when that import succeeds) see the
installed package as it is, not a half-initialised one. The kernel modules stay imported.
site-packages is not edited.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from types import ModuleType

MIN_VERSION = (2, 2, 0)  # selective_state_update with heads, mamba_chunk_scan_combined


def _version_tuple(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def mamba_ssm_version() -> str | None:
    """The installed mamba-ssm's version, or None when it is not installed."""
    try:
        return importlib.metadata.version("mamba-ssm")
    except importlib.metadata.PackageNotFoundError:
        return None


def import_mamba_triton() -> tuple[ModuleType, ModuleType]:
    """Return (``ssd_combined``, ``selective_state_update``) modules of mamba-ssm.

    Raises ImportError with the reason (not installed, too old, or a kernel module that
    fails to import, e.g. without ``triton`` or ``einops``).
    """
    version = mamba_ssm_version()
    if version is None:
        raise ImportError("mamba-ssm is not installed (run `make install-gpu`)")
    if _version_tuple(version) < MIN_VERSION:
        wanted = ".".join(map(str, MIN_VERSION))
        raise ImportError(f"mamba-ssm {version} is too old; need >= {wanted}")
    names = ("mamba_ssm.ops.triton.ssd_combined", "mamba_ssm.ops.triton.selective_state_update")
    if all(n in sys.modules for n in names):
        return sys.modules[names[0]], sys.modules[names[1]]
    bare = "mamba_ssm" not in sys.modules
    if bare:
        spec = importlib.util.find_spec("mamba_ssm")
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError("mamba-ssm is installed but its package folder was not found")
        package = importlib.util.module_from_spec(spec)  # not executed: no __init__ imports
        sys.modules["mamba_ssm"] = package
    try:
        ssd, ssu = (importlib.import_module(n) for n in names)
    except Exception as exc:
        raise ImportError(
            f"importing mamba-ssm {version}'s Triton kernels failed: {exc!r}"
        ) from exc
    finally:
        if bare:
            del sys.modules["mamba_ssm"]
    return ssd, ssu
