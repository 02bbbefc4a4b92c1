"""The torch-free protocol between the cache side and the tensor side.

What the coordinator, the ingress and the engine exchange, with no torch, Ray or Redis:
sampling parameters (`sampling`), the orders a planner hands a worker and what comes back
(`orders`, `results`), prompt validation (`validation`), the `Planner` (a prefix cache,
its tuner, and the request bookkeeping around plan / commit / abort), and the typed
operations the coordinator journals and replays (`ops`). Imports point down only:
core <- protocol <- engine / serve.
"""
