"""End to end over HTTP with the official `openai` client: the marconi service (2
replicas of 2 TP shards) next to a vanilla one, both on one local Ray + Serve proxy."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families
from ray import serve
from serve_helpers import SERVE_PORT, local_ray

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.app import build_app, shutdown_app, start_actors
from marconi_ray.serve.model_source import resolve_model
from marconi_ray.serve.settings import NAMESPACE, ServeSettings

pytestmark = [pytest.mark.ray, pytest.mark.slow]
PORT = SERVE_PORT
QWEN = "tiny:qwen3_5"
PRESETS = {"qwen": QWEN}
"""Apps (route prefix /NAME) serving a make-model preset as `serve --model tiny:FAMILY`
does (Gated DeltaNet behind a multimodal wrapper; every other family's preset is served
through the same ingress app in tests/serve/test_family_presets_http.py)."""
BASE = f"http://127.0.0.1:{PORT}"


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    model_dir = str(make_model("tiny", "bamba", tmp_path_factory.mktemp("m") / "tiny"))
    marconi = ServeSettings(
        model_dir=model_dir,
        model_name="tiny",
        tp=2,
        replicas=2,
        cache_bytes=10**8,
        host_cache_bytes=10**8,  # checked against this node's free memory at start
        port=PORT,
        app_name="marconi",
    )
    vanilla = ServeSettings(
        model_dir=model_dir, model_name="tiny", system="vanilla", port=PORT, app_name="vanilla"
    )
    # `serve --model tiny:FAMILY`: each preset resolved (built) as the CLI does
    root = tmp_path_factory.mktemp("presets")
    preset_dirs = {name: resolve_model(spec, root=root) for name, spec in PRESETS.items()}
    presets = [
        ServeSettings(
            model_dir=str(preset_dirs[name]),
            model_name=spec,
            cache_bytes=10**8,
            port=PORT,
            app_name=name,
        )
        for name, spec in PRESETS.items()
    ]
    apps = ((marconi, "/"), (vanilla, "/vanilla"), *((p, f"/{p.app_name}") for p in presets))
    with local_ray():
        for settings, prefix in apps:
            start_actors(settings)
            serve.run(build_app(settings), name=settings.app_name, route_prefix=prefix)
        yield {
            "marconi": OpenAI(base_url=f"{BASE}/v1", api_key="unused", max_retries=0),
            "vanilla": OpenAI(base_url=f"{BASE}/vanilla/v1", api_key="unused", max_retries=0),
            **{
                name: OpenAI(base_url=f"{BASE}/{name}/v1", api_key="unused", max_retries=0)
                for name in PRESETS
            },
            "qwen_dir": preset_dirs["qwen"],
            "preset_dirs": preset_dirs,
            "model_dir": model_dir,
        }
        for settings, _ in apps:
            shutdown_app(settings)


def _chat(client, messages, stream=False, model="tiny"):
    kwargs = dict(model=model, messages=messages, max_tokens=8, temperature=0.0)
    if not stream:
        reply = client.chat.completions.create(**kwargs)
        return reply.choices[0].message.content, reply.usage
    chunks = client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    )
    text, usage = [], None
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    return "".join(text), usage


def test_multi_turn_chat_hits_and_matches_vanilla(services):
    marconi, vanilla = services["marconi"], services["vanilla"]
    messages = [{"role": "system", "content": "You are terse."}]
    for turn, user in enumerate(["Hello there!", "Tell me more.", "And then?"]):
        messages.append({"role": "user", "content": user})
        text, usage = _chat(marconi, messages)
        ref, _ = _chat(vanilla, messages)
        assert text == ref
        streamed, stream_usage = _chat(marconi, messages, stream=True)
        assert streamed == text
        assert stream_usage.completion_tokens == usage.completion_tokens
        if turn:
            assert usage.prompt_tokens_details.cached_tokens > 0
        messages.append({"role": "assistant", "content": text})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_family_preset_over_http_hits_and_matches_the_engine(services, name):
    """A `tiny:FAMILY` preset behind the OpenAI API (the multimodal Qwen3.5: Gated
    DeltaNet): later chat turns hit the cache, streamed equals whole, and a completion's
    tokens equal the in-process vanilla engine's on the same prompt ids."""
    client, model = services[name], PRESETS[name]
    messages = []
    for turn, user in enumerate(["Hello there!", "Tell me more."]):
        messages.append({"role": "user", "content": user})
        text, usage = _chat(client, messages, model=model)
        streamed, _ = _chat(client, messages, stream=True, model=model)
        assert streamed == text and usage.completion_tokens == 8
        if turn:
            assert usage.prompt_tokens_details.cached_tokens > 0
        messages.append({"role": "assistant", "content": text})
    prompt = list(range(40, 90))
    reply = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=8,
        temperature=0.0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    engine = Engine(services["preset_dirs"][name], system="vanilla")
    want = engine.generate(prompt, _greedy(8)).tokens
    assert list(reply.choices[0].token_ids) == list(want)


def _greedy(n: int):
    from marconi_ray.protocol.sampling import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def test_completions_and_models(services):
    """A repeated prompt: the first repeat finds the prompt inside an edge (no state there,
    SSM states only match exactly) and checkpoints that branch point; the next repeat is
    served wholly from the cache (its checkpoint kept the logits: no prefill)."""
    client = services["marconi"]
    assert [m.id for m in client.models.list().data] == ["tiny"]
    runs = [
        client.completions.create(model="tiny", prompt="Once upon", max_tokens=6, temperature=0)
        for _ in range(3)
    ]
    assert len({r.choices[0].text for r in runs}) == 1
    assert runs[0].usage.prompt_tokens_details.cached_tokens == 0
    assert runs[2].usage.prompt_tokens_details.cached_tokens == runs[2].usage.prompt_tokens


def test_logprobs_over_ray_equal_the_engine(services):
    """`logprobs` and `echo` through the TP-2 replicas and the official client: the values
    the in-process engine reports for the same request (tp 1), to float noise."""
    from marconi_ray.protocol.sampling import SamplingParams

    client = services["marconi"]
    prompt = list(range(60, 80))
    reply = client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=4,
        temperature=0.0,
        echo=True,
        logprobs=2,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    engine = Engine(services["model_dir"], system="vanilla")
    params = SamplingParams(
        max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=2, prompt_logprobs=2
    )
    want = engine.generate(prompt, params)
    choice = reply.choices[0]
    assert list(choice.token_ids) == list(want.tokens)
    got = choice.logprobs.token_logprobs
    assert got[0] is None and len(got) == len(prompt) + 4
    expected = [e.logprob for e in want.prompt_logprobs[1:]] + [e.logprob for e in want.logprobs]
    assert got[1:] == pytest.approx(expected, abs=1e-4)
    assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs[1:])
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0.0,
        logprobs=True,
        top_logprobs=3,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(e.top_logprobs) == 3 for e in content)
    assert all(e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-5) for e in content)


def _post(path: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(
        BASE + path, data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (json.dumps({"model": "nope", "prompt": "x"}).encode(), 404),
        (json.dumps({"model": "tiny", "prompt": ""}).encode(), 400),
        (json.dumps({"model": "tiny", "prompt": "x" * 5000}).encode(), 400),
        (json.dumps({"model": "tiny", "prompt": "x", "max_tokens": -1}).encode(), 400),
        (json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 10**9}).encode(), 400),
        (json.dumps({"model": "tiny", "prompt": "x", "temperature": -2}).encode(), 400),
        (json.dumps({"model": "tiny", "prompt": "x", "top_p": 7}).encode(), 400),
        (json.dumps({"model": "tiny", "prompt": [1, 99999]}).encode(), 400),
    ],
)
def test_bad_input_is_4xx_and_harmless(services, body, status):
    coordinator = ray.get_actor("marconi-coordinator-marconi", namespace="marconi")
    before = [
        (s.stats["requests"], s.bytes_used, s.in_flight)
        for s in ray.get(coordinator.stats.remote())
    ]
    code, payload = _post("/v1/completions", body)
    assert code == status
    assert set(payload["error"]) >= {"message", "type", "param", "code"}
    after = [
        (s.stats["requests"], s.bytes_used, s.in_flight)
        for s in ray.get(coordinator.stats.remote())
    ]
    assert after == before
    ok = services["marconi"].completions.create(model="tiny", prompt="still fine", max_tokens=2)
    assert ok.usage.completion_tokens == 2


def _scrape() -> dict[str, list]:
    with urllib.request.urlopen(BASE + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _counter(families: dict[str, list], name: str) -> float:
    return sum(s.value for s in families.get(name, []) if s.name == name + "_total")


def _stream_completion(client: OpenAI, prompt: str) -> tuple[list[list[int]], str, object]:
    """(token ids of each chunk with text, the text, usage) of one streamed completion."""
    chunks = client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    ids, text, usage = [], [], None
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].text:
            ids.append(chunk.choices[0].token_ids)
            text.append(chunk.choices[0].text)
        if chunk.usage is not None:
            usage = chunk.usage
    return ids, "".join(text), usage


def test_concurrent_streams_share_one_message_per_replica_step(services):
    """Eight clients stream at once from the one-replica app: their tokens reach the
    ingress over one multiplexed stream (fewer messages than tokens), every chunk's
    token ids add up to exactly the usage, and each text equals the whole answer."""
    client = services["vanilla"]

    def scrape() -> dict[str, list]:
        with urllib.request.urlopen(BASE + "/vanilla/metrics", timeout=30) as resp:
            return {f.name: f.samples for f in text_string_to_metric_families(resp.read().decode())}

    before = scrape()
    prompts = [f"Stream number {i} goes" for i in range(8)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: _stream_completion(client, p), prompts))
    after = scrape()
    tokens = 0
    for prompt, (ids, text, usage) in zip(prompts, results, strict=True):
        assert usage.completion_tokens == sum(len(chunk) for chunk in ids) == 16
        tokens += 16
        whole = client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=16,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert text == whole.choices[0].text
    messages = _counter(after, "marconi_replica_messages") - _counter(
        before, "marconi_replica_messages"
    )
    sent = _counter(after, "marconi_output_tokens") - _counter(before, "marconi_output_tokens")
    assert sent == tokens
    assert 16 <= messages < tokens  # one per step at most: 16 steps at least, shared


def test_health_and_metrics_parse(services):
    with urllib.request.urlopen(BASE + "/health", timeout=30) as resp:
        assert resp.status == 200
    families = _scrape()
    for name in ("marconi_ttft_seconds", "marconi_cache_token_hit_rate", "marconi_cache_bytes"):
        assert any(n.startswith(name) for n in families), name
    # the host tier: the caches' figures per tier, and each replica's store figures,
    # which its heartbeats (every second) bring to the coordinator
    deadline = time.monotonic() + 30
    while not families.get("marconi_store_tier_copied_bytes") and time.monotonic() < deadline:
        time.sleep(0.5)
        families = _scrape()
    budgets = {
        (s.labels["replica"], s.labels["tier"]): s.value
        for s in families["marconi_cache_tier_capacity_bytes"]
    }
    replicas = {replica for replica, _ in budgets}
    assert len(replicas) == 2
    assert {budgets[r, "host"] for r in replicas} == {10**8}
    for name in ("marconi_cache_tier_bytes", "marconi_cache_tier_hit_tokens"):
        assert {(s.labels["replica"], s.labels["tier"]) for s in families[name]} == set(budgets)
    copied = families["marconi_store_tier_copied_bytes"]
    assert {(s.labels["replica"], s.labels["direction"]) for s in copied} == {
        (r, way) for r in replicas for way in ("to_host", "to_device")
    }
    assert {s.labels["replica"] for s in families["marconi_store_host_bytes"]} == replicas


def test_a_host_tier_no_node_can_hold_is_refused_before_anything_starts(services):
    """`host_cache_bytes` x tp over every model node's free memory: `start_actors` (what
    `run_app` and `app_builder` call first) refuses it, naming both numbers, and starts
    no actor."""
    too_big = ServeSettings(
        model_dir=str(services["qwen_dir"]),
        model_name="tiny",
        tp=2,
        host_cache_bytes=10**18,
        port=PORT,
        app_name="too-big-host-tier",
    )
    with pytest.raises(ValueError) as refused:
        start_actors(too_big)
    message = str(refused.value)
    assert f"host_cache_bytes={10**18} x 2 ranks = {2 * 10**18} bytes exceeds the " in message
    free = re.search(r"exceeds the (\d+) bytes of free memory \(MemAvailable\) on node ", message)
    assert free is not None and 0 < int(free.group(1)) < 10**18
    for name in (too_big.coordinator_name, too_big.tuner_name):
        with pytest.raises(ValueError):
            ray.get_actor(name, namespace=NAMESPACE)


def test_tool_calls_and_json_schema_over_the_tp2_service(services):
    """Constrained decoding through the TP-2 replicas (rank 0 masks, every rank's matcher
    follows the broadcast tokens): named tool calls at temperature 1 satisfy their
    schema, the next turn finds the whole previous turn cached, and a `json_schema` reply
    parses; the same greedy tool call as the vanilla service's."""
    client, vanilla = services["marconi"], services["vanilla"]
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}},
        "required": ["city", "n"],
        "additionalProperties": False,
    }
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": schema}}]
    named = {"type": "function", "function": {"name": "lookup"}}
    messages = [{"role": "user", "content": "Look it up."}]
    for seed in range(4):
        reply = client.chat.completions.create(
            model="tiny",
            messages=messages,
            tools=tools,
            tool_choice=named,
            seed=seed,
            temperature=1.0,
            max_tokens=120,
        )
        (call,) = reply.choices[0].message.tool_calls
        args = json.loads(call.function.arguments)
        assert set(args) == {"city", "n"} and len(args["city"]) <= 10
    greedy = dict(model="tiny", tools=tools, tool_choice=named, temperature=0.0, max_tokens=120)
    first = client.chat.completions.create(messages=messages, **greedy)
    ref = vanilla.chat.completions.create(messages=messages, **greedy)
    call = first.choices[0].message.tool_calls[0]
    assert call.function == ref.choices[0].message.tool_calls[0].function
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    second = client.chat.completions.create(messages=messages, **greedy)
    seen = first.usage.prompt_tokens + first.usage.completion_tokens
    assert second.usage.prompt_tokens_details.cached_tokens == seen
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    out = client.chat.completions.create(
        model="tiny", messages=messages, response_format=fmt, max_tokens=120, temperature=1.0
    )
    assert set(json.loads(out.choices[0].message.content)) == {"city", "n"}
