"""The control plane runs without torch: importing the coordinator, the ingress, the
routers, the journal, the config or the protocol layer in a fresh interpreter loads no
torch (import-linter checks the same statically, `make contracts`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

TORCH_FREE = (
    "marconi_ray.serve.coordinator.actor",
    "marconi_ray.serve.ingress.api",
    "marconi_ray.serve.ingress.pinned_router",
    "marconi_ray.serve.coordinator.routing.routers",
    "marconi_ray.serve.coordinator.journal",
    "marconi_ray.serve.config",
    "marconi_ray.protocol.planner",
    "marconi_ray.protocol.ops",
    "marconi_kernels.choices",
)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_without_torch(module: str) -> None:
    heavy = ("torch", "marconi_kernels.dispatch")
    code = f"import sys, {module}; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", (module, out.stdout, out.stderr[-2000:])


def test_the_check_sees_torch_when_it_is_imported() -> None:
    code = "import sys, marconi_ray.engine.engine; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "True"
