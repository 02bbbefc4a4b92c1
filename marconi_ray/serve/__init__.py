"""Ray Serve layer: OpenAI ingress, cache-coordinator actor, tensor-parallel model replicas
(placement groups of shard actors), tuner actor, metrics, config and app builder."""
