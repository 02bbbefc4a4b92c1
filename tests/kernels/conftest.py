"""Kernel tests run single-threaded (see DESIGN.md: busy 2-core machines)."""

import torch

torch.set_num_threads(1)
