"""`LocalBackend` driven from one event loop, then another (two `asyncio.run`s, as tests
and CLIs do): each loop's concurrent streams share the engine under that loop's lock,
and the second loop's requests run as the first's did."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import torch

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.messages import Completed

torch.set_num_threads(1)

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


async def _run(backend: LocalBackend, prompts: list[list[int]]) -> list[list[int]]:
    """The prompts' token ids, their streams consumed concurrently."""

    async def one(prompt: list[int]) -> list[int]:
        dispatch = await backend.plan(np.asarray(prompt, np.int32), GREEDY, 0.0)
        tokens = []
        async for event in backend.generate(dispatch):
            if isinstance(event, Completed):
                break
            tokens.append(event.token)
        return tokens

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def test_a_second_event_loop_drives_the_backend_too(tmp_path: Path) -> None:
    engine = Engine(make_model("tiny", "nemotron_h", tmp_path / "m"), system="vanilla")
    backend = LocalBackend(engine)
    prompts = [[7 + (i * 3 + j) % 200 for j in range(12)] for i in range(3)]
    first = asyncio.run(_run(backend, prompts))
    second = asyncio.run(_run(backend, prompts))
    assert first == second and all(len(t) == 6 for t in first)
