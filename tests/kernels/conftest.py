"""Kernel tests run single-threaded (see docs/ARCHITECTURE.md: busy 2-core machines)."""

import torch

torch.set_num_threads(1)
