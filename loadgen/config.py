"""What a load run is (`LoadConfig`) and what it records per request (`RequestRecord`).

Shared by the runner (`marconi-loadgen run`) and the comparison
(`benchmarks/compare_systems.py`, also reached as `marconi-loadgen compare`). Frozen
dataclasses; the CLI validates its arguments into them once.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoadConfig:
    """One run of multi-turn sessions against an OpenAI-compatible endpoint.

    Attributes:
        url: server base URL (e.g. http://127.0.0.1:8000); loopback unless `allow_hosts`
            names the host.
        model: the `model` field sent (None: the first id of GET /v1/models).
        trace: `sharegpt`, `sharegpt-rejoined`, `swebench`, `sample`, a JSONL path, or
            `mooncake[-chained][:FILE]` (token ids made from block hash ids; see
            `marconi_ray.traces.mooncake`).
        sessions: sessions to run (the first N of the trace).
        session_rate: new sessions per second (Poisson, or gamma with `burstiness`);
            None with `concurrency` set: a fixed number of users, each starting its next
            session when the previous ends.
        burstiness: gamma shape of inter-arrival times (1.0 = Poisson).
        arrivals: `rate` (sessions start at `session_rate`) or `trace` (each session at
            its first request's time in the trace, times `time_scale`, as production
            replays in DistServe and Splitwise do; `session_rate` is then unused).
        time_scale: with `trace` arrivals, the factor on the trace's clock (0.5: twice
            as fast).
        concurrency: most sessions in flight (a fixed-users run when rate is None).
        think: `trace` (the trace's gaps), `fixed:S` or `exp:MEAN` seconds between a
            turn's completion and the next turn.
        history: `live` (append the model's actual reply, as returned in `token_ids`)
            or `trace` (send the recorded replies; decode exactly their length).
        prompt_mode: `tokens` (send token ids to /v1/completions, mapped into the
            model's vocabulary) or `text` (detokenize with the trace's tokenizer).
        vocab_size: model vocabulary for `tokens` mode (None: no remapping).
        max_output: cap on decoded tokens per turn; max_prompt: sessions stop at the
            first turn whose prompt would exceed it.
        warmup: first N requests excluded from statistics.
        max_requests, max_seconds: bounds; the run stops by itself at either.
        slo_ttft_ms, slo_tpot_ms, slo_e2el_ms: goodput thresholds (None: unused).
        seed: arrivals and think-time sampling.
    """

    url: str
    trace: str = "sharegpt"
    model: str | None = None
    sessions: int = 30
    session_rate: float | None = 1.0
    burstiness: float = 1.0
    arrivals: str = "rate"
    time_scale: float = 1.0
    concurrency: int | None = None
    think: str = "fixed:0"
    history: str = "live"
    prompt_mode: str = "tokens"
    vocab_size: int | None = None
    max_output: int = 32
    max_prompt: int = 2048
    warmup: int = 0
    max_requests: int | None = None
    max_seconds: float | None = None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_e2el_ms: float | None = None
    seed: int = 0
    allow_hosts: tuple[str, ...] = ()
    timeout_s: float = 600.0


@dataclass
class RequestRecord:
    """One request as the client saw it (one line of `requests.jsonl`).

    Times are seconds since the run started; latencies in ms. `error` is None on success,
    else the error kind (`connect`, `http_4xx`, `http_5xx`, `timeout`, `stream`, ...).
    `input_ids`/`output_ids` are the exact token ids sent and generated (tokens mode, with
    the server's `return_token_ids`), kept so the simulator can replay the same requests.
    """

    session_id: int
    turn: int
    start_s: float
    prompt_tokens: int
    output_tokens: int = 0
    cached_tokens: int = 0
    ttft_ms: float | None = None
    e2el_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    error: str | None = None
    error_detail: str | None = None
    warmup: bool = False
    input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)

    @property
    def tpot_ms(self) -> float | None:
        """Time per output token after the first (None with fewer than 2 tokens)."""
        if self.e2el_ms is None or self.ttft_ms is None or self.output_tokens < 2:
            return None
        return (self.e2el_ms - self.ttft_ms) / (self.output_tokens - 1)
