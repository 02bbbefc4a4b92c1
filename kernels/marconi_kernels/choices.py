"""The kernel-set names a user can ask for (torch-free: configs and CLI parsers use it).

``auto`` picks ``triton`` on a CUDA device when it can run there, else ``ref``;
``dispatch.KERNEL_REGISTRY`` holds a builder for every other name.
"""

from __future__ import annotations

KERNEL_CHOICES: tuple[str, ...] = ("auto", "ref", "triton")
