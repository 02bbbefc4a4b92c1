"""The P/D systems: prefill replicas prefill, decode replicas decode, one coordinator.

A prefill replica prefills a prompt from a hit and samples its first token; the prompt's
KV and its state then move to a decode replica (the handoff: the KV that replica lacks and
one state, at `transfer_gbps`), which decodes. The decode replica is the router rule's
pick among the decode replicas (a replica holding the session's last state keeps it).

- `prefill_only` (what vLLM, SGLang and Dynamo ship for hybrids): the prefill replicas
  cache, each an equal share of all the bytes; a prefill replica admits what it computed
  (branch states and the state at the prompt's end); decode replicas keep nothing, so the
  end-of-turn state is lost and every next turn recomputes the previous output.
- `prefill_only_own` (context, not at equal bytes): `prefill_only` with each prefill
  replica holding only its own share, 1 / (P + D) of the total, as on a cluster whose
  replicas all have the same memory: the decode replicas' share goes unused.
- `both` (issue 50): every replica caches an equal share. Decode replicas admit what they
  hold after decoding (the prompt's and output's KV, the state after the last token).
  For the next turn the coordinator finds the deepest hit in either role and takes the
  option that finishes first by the clock (bytes at `transfer_gbps`, prefill FLOPs at
  `prefill_tflops`, each replica's queue): prefill from the router's prefill replica's
  own hit (`recompute` when 0), prefill the suffix on a decode replica holding the deepest
  hit (which then decodes it too: no handoff), or pull the deepest hit to a prefill
  replica first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.sim.cluster_config import ClusterConfig
from marconi_ray.core.sim.cluster_replica import Replica
from marconi_ray.core.sim.cluster_result import Served
from marconi_ray.core.sim.cluster_route import Probe
from marconi_ray.core.sim.cluster_system import (
    ClusterSystem,
    Option,
    Tokens,
    cheapest,
    deepest,
    turn_tokens,
)


class PrefillOnly(ClusterSystem):
    """Caches on the prefill replicas only (module docstring)."""

    name: ClassVar[str] = "prefill_only"
    decode_caches: ClassVar[bool] = False

    def __init__(self, cost: CostModel, cfg: ClusterConfig) -> None:
        super().__init__(cost, cfg)
        self.prefill = self._build("prefill")
        self.decode = self._build("decode")

    @classmethod
    def roles(cls, cfg: ClusterConfig) -> dict[str, tuple[int, bool]]:
        return {
            "prefill": (cfg.prefill_replicas, True),
            "decode": (cfg.decode_replicas, cls.decode_caches),
        }

    def replicas(self) -> list[Replica]:
        return [*self.prefill, *self.decode]

    def serve(self, prompt: Tokens, output: Tokens, now: float) -> Served:
        probes = [r.probe(prompt) for r in self.prefill]
        i = self._route(self.prefill, probes, now)
        opt = self._local(self.prefill[i], probes[i].hit, len(prompt), now)
        return self._finish(
            opt, prompt, output, now, opt.finish, [d.probe(prompt) for d in self.decode]
        )

    def _finish(
        self,
        opt: Option,
        prompt: Tokens,
        output: Tokens,
        now: float,
        best_local: float,
        decode_probes: Sequence[Probe],
    ) -> Served:
        """Prefill `opt` on its prefill replica, hand the prompt off to the routed decode
        replica, which decodes it (and, when it caches, admits the turn)."""
        hit, end = self._prefill(opt, prompt, prompt)
        opt.replica.hold(end)
        j = self._route(self.decode, decode_probes, now)
        dec = self.decode[j]
        pd_bytes = self.clock.entry_bytes(self.cost, len(prompt), decode_probes[j].matched)
        pd_s = self.clock.transfer_seconds(pd_bytes)
        if dec.cache is not None:
            dec.serve(prompt, turn_tokens(prompt, output), prefilled=False)
        self._decode(dec, end + pd_s, len(output))
        return self._served(opt, hit, end, now, best_local, pd_bytes, pd_s)


class PrefillOnlyOwn(PrefillOnly):
    """`prefill_only` on its own replicas' shares (module docstring)."""

    name: ClassVar[str] = "prefill_only_own"

    @classmethod
    def split_over(cls, cfg: ClusterConfig) -> int:
        return cfg.replicas


class Both(PrefillOnly):
    """Caches on both sides, the deepest hit anywhere (module docstring)."""

    name: ClassVar[str] = "both"
    decode_caches: ClassVar[bool] = True

    def serve(self, prompt: Tokens, output: Tokens, now: float) -> Served:
        n = len(prompt)
        pre = [r.probe(prompt) for r in self.prefill]
        dec = [r.probe(prompt) for r in self.decode]
        i = self._route(self.prefill, pre, now)
        options = [self._local(self.prefill[i], pre[i].hit, n, now)]
        everyone, probes = [*self.prefill, *self.decode], [*pre, *dec]
        top = deepest(probes)
        deep = 0 if top is None else probes[top].hit
        if top is not None and deep > pre[i].hit:
            options += [
                self._local(r, deep, n, now, "decode_suffix")
                for r, p in zip(self.decode, dec, strict=True)
                if p.hit == deep
            ]
            options += [
                self._pull(r, p, everyone[top], deep, n, now)
                for r, p in zip(self.prefill, pre, strict=True)
                if p.hit < deep
            ]
        best_local = min(o.finish for o in options if o.source is None)
        opt = cheapest(options)
        if opt.route != "decode_suffix":
            return self._finish(opt, prompt, output, now, best_local, dec)
        hit, end = self._prefill(opt, prompt, turn_tokens(prompt, output))
        self._decode(opt.replica, end, len(output))
        return self._served(opt, hit, end, now, best_local)
