"""The request's way in: the OpenAI-compatible HTTP ingress (`api`), its request and
response schemas (`openai_protocol`, `prepare`, `responses`, `generation`), security and
metrics, and the backends that plan at the coordinator and stream from a replica
(`ray_backend` with its `plan_batcher`; `local_backend` runs the engine in process)."""
