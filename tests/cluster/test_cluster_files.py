"""The deployment files under cluster/: launcher YAMLs against Ray's own schema, the Serve
config and the KubeRay manifest against Serve's schema and `ServeConfig`, and the Redis
rules (a password, a bind address that is not a wildcard, no public Service)."""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.serve.schema import ServeDeploySchema

from marconi_ray.serve.config import ServeConfig
from marconi_ray.serve.replica.deployment import shard_bundles
from marconi_ray.serve.settings import ServeSettings

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"
LAUNCHERS = ["aws-gpu.yaml", "local.yaml"]
SERVE = CLUSTER / "serve.yaml"
KUBERAY = CLUSTER / "kuberay-rayservice.yaml"
WILDCARDS = {"0.0.0.0", "::", "*", "-::*", "[::]"}


def _load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((CLUSTER / name).read_text())
    assert isinstance(data, dict)
    return data


def _kuberay_docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(KUBERAY.read_text()) if d is not None]


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def _containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every (init) container spec anywhere inside a Kubernetes document."""
    if isinstance(doc, dict):
        for key in ("containers", "initContainers"):
            if isinstance(doc.get(key), list):
                yield from doc[key]
        for value in doc.values():
            yield from _containers(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from _containers(value)


def _redis_invocations(text: str) -> list[list[str]]:
    """Argument lists following each `redis-server` that is run with options (package
    names such as `apt-get install -y redis-server` are not invocations)."""
    found = []
    for match in re.finditer(r"\bredis-server\s+(--.*?)(?:\)|$|&&|\|\||;)", text, re.S):
        found.append(shlex.split(match.group(1).replace("\n", " ")))
    return found


def _all_redis_invocations() -> dict[str, list[list[str]]]:
    """redis-server command lines of every shipped file, by file name."""
    out: dict[str, list[list[str]]] = {}
    for name in LAUNCHERS:
        commands = [s for s in _strings(_load(name)) if "redis-server" in s]
        out[name] = [inv for c in commands for inv in _redis_invocations(c)]
    k8s = []
    for doc in _kuberay_docs():
        for container in _containers(doc):
            argv = [*container.get("command", []), *container.get("args", [])]
            if argv and argv[0] == "redis-server":
                k8s.append([str(a) for a in argv[1:]])
    out[KUBERAY.name] = k8s
    out["README.md"] = _redis_invocations((CLUSTER / "README.md").read_text())
    return out


def _check_redis_argv(argv: list[str]) -> None:
    assert "--requirepass" in argv, argv
    password = argv[argv.index("--requirepass") + 1]
    # From an env var / Secret, never a literal in the file.
    assert password.startswith("$"), f"literal Redis password in {argv}"
    assert "--bind" in argv, argv
    start = argv.index("--bind") + 1
    binds = []
    for arg in argv[start:]:
        if arg.startswith("--"):
            break
        binds.append(arg)
    assert binds, argv
    assert not WILDCARDS & set(binds), f"wildcard bind in {argv}"
    if "--protected-mode" in argv:
        assert argv[argv.index("--protected-mode") + 1] == "yes", argv


# --- launcher YAMLs -------------------------------------------------------------------


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_yaml_passes_ray_validation(name: str) -> None:
    config = _load(name)
    validate_config(config)  # the file as written
    validate_config(prepare_config(copy.deepcopy(config)))  # as `ray up` sees it


@pytest.mark.parametrize("name", LAUNCHERS)
@pytest.mark.parametrize(
    "breakage",
    ["no_provider", "max_workers_str", "unknown_top_key", "commands_not_list", "bad_head_type"],
)
def test_broken_launcher_yaml_is_rejected(name: str, breakage: str) -> None:
    config = _load(name)
    if breakage == "no_provider":
        del config["provider"]
    elif breakage == "max_workers_str":
        config["max_workers"] = "four"
    elif breakage == "unknown_top_key":
        config["redis_url"] = "redis://example"
    elif breakage == "commands_not_list":
        config["head_setup_commands"] = "redis-server"
    elif breakage == "bad_head_type":
        config = prepare_config(config)  # the local provider's node types come from here
        config["head_node_type"] = "no_such_type"
    with pytest.raises((jsonschema.ValidationError, ValueError)):
        validate_config(config)


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_installs_project_and_starts_ray(name: str) -> None:
    config = _load(name)
    head = " ".join(config["setup_commands"] + config["head_setup_commands"])
    worker = " ".join(config["setup_commands"] + config["worker_setup_commands"])
    for commands in (head, worker):
        assert "torch==2.13.0" in commands
        # torch is pinned before the project pulls in its own (unpinned) torch dependency.
        assert commands.index("torch==2.13.0") < commands.index(" -e ")
    assert "-e '.[gpu]'" in worker and "make install-gpu" in worker
    assert "redis-server --bind" in head and "redis-server --bind" not in worker
    assert any("ray start --head" in c for c in config["head_start_ray_commands"])
    assert any("ray start --address" in c for c in config["worker_start_ray_commands"])
    # Secrets come from outside the repository.
    for remote, local in config["file_mounts"].items():
        if remote != "~/marconi-ray":
            assert local.startswith("~/"), (remote, local)


def test_aws_has_cpu_head_and_autoscaled_gpu_workers() -> None:
    config = _load("aws-gpu.yaml")
    types = config["available_node_types"]
    assert config["provider"]["type"] == "aws"
    assert types[config["head_node_type"]]["node_config"]["InstanceType"].startswith("m5")
    gpu = types["gpu_worker"]
    assert gpu["node_config"]["InstanceType"].startswith("g5")
    assert gpu["min_workers"] == 0 and gpu["max_workers"] <= config["max_workers"]


def test_local_provider_has_placeholder_hosts() -> None:
    provider = _load("local.yaml")["provider"]
    assert provider["type"] == "local"
    assert provider["head_ip"] and provider["worker_ips"]


# --- Serve config ----------------------------------------------------------------------


def _check_serve_config(data: dict[str, Any]) -> dict[str, Any]:
    ServeDeploySchema.parse_obj(data)
    (app,) = data["applications"]
    assert app["import_path"] == "marconi_ray.serve.app:app_builder"
    # Secrets (a Redis URL with its password, an API key) never go into a shipped file.
    assert not {"redis_url", "api_key"} & set(app["args"])
    config = ServeConfig(**app["args"])  # validates only; builds nothing
    assert config.device == "cuda"
    assert config.model == "small"
    return app


def test_serve_config_is_valid_and_local_only() -> None:
    data = yaml.safe_load(SERVE.read_text())
    app = _check_serve_config(data)
    assert app["route_prefix"] == "/" and data["proxy_location"] == "HeadOnly"
    assert data["http_options"]["host"] == "127.0.0.1"


def test_serve_args_with_unknown_key_are_rejected() -> None:
    (app,) = yaml.safe_load(SERVE.read_text())["applications"]
    with pytest.raises(ValueError, match="no_such_key"):
        ServeConfig(**{**app["args"], "no_such_key": 1})


# --- KubeRay ---------------------------------------------------------------------------


def test_kuberay_manifest_kinds_and_serve_config() -> None:
    docs = _kuberay_docs()
    assert {"RayService", "Deployment", "Service", "Secret"} <= {d["kind"] for d in docs}
    service = _one(docs, "RayService")
    assert service["apiVersion"] == "ray.io/v1"
    embedded = yaml.safe_load(service["spec"]["serveConfigV2"])
    app = _check_serve_config(embedded)
    (launcher_app,) = yaml.safe_load(SERVE.read_text())["applications"]
    assert app == launcher_app  # the same application as cluster/serve.yaml

    cluster = service["spec"]["rayClusterConfig"]
    assert cluster["headGroupSpec"]["serviceType"] == "ClusterIP"
    (gpu_group,) = cluster["workerGroupSpecs"]
    (worker,) = gpu_group["template"]["spec"]["containers"]
    gpus = worker["resources"]["limits"]["nvidia.com/gpu"]
    assert int(gpus) >= app["args"]["tp"]


def test_kuberay_redis_has_password_and_is_not_exposed() -> None:
    docs = _kuberay_docs()
    secret = _one(docs, "Secret", "marconi-redis")
    assert secret["stringData"]["password"]
    redis = _one(docs, "Deployment", "marconi-redis")
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    ref = env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "marconi-redis", "key": "password"}
    args = container["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    for doc in docs:
        if doc["kind"] == "Service":
            assert doc["spec"].get("type", "ClusterIP") == "ClusterIP", doc["metadata"]
    assert not any(d["kind"] == "Ingress" for d in docs)
    assert not any(s.strip() in WILDCARDS for s in _strings(redis))


# --- Redis rules across every shipped file ---------------------------------------------


def test_every_redis_server_has_password_and_private_bind() -> None:
    found = _all_redis_invocations()
    for name in [*LAUNCHERS, KUBERAY.name]:
        assert found[name], f"no redis-server command line found in {name}"
    for name, invocations in found.items():
        for argv in invocations:
            _check_redis_argv(argv)
        text = (CLUSTER / name).read_text()
        assert "0.0.0.0" not in "".join(
            line for line in text.splitlines() if "redis" in line.lower()
        ), name


@pytest.mark.parametrize(
    "argv",
    [
        ["--bind", "0.0.0.0", "--requirepass", "$PW"],
        ["--bind", "127.0.0.1", "--port", "6380"],
        ["--bind", "127.0.0.1", "--requirepass", "hunter2"],
        ["--port", "6380", "--requirepass", "$PW"],
        ["--bind", "10.0.0.1", "--requirepass", "$PW", "--protected-mode", "no"],
    ],
)
def test_redis_rule_catches_bad_command_lines(argv: list[str]) -> None:
    with pytest.raises(AssertionError):
        _check_redis_argv(argv)


def test_redis_parser_reads_launcher_command() -> None:
    text = (
        'x && (redis-cli ping || redis-server --bind "$IP" 127.0.0.1 --port 6380 '
        "--requirepass \"$PW\" --save '' --appendonly yes)"
    )
    (argv,) = _redis_invocations(text)
    assert argv[:3] == ["--bind", "$IP", "127.0.0.1"]
    assert "--requirepass" in argv
    assert _redis_invocations("sudo apt-get install -y redis-server && true") == []


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launchers_give_ray_processes_the_journal_redis(name: str, tmp_path: Path) -> None:
    """Every Ray process learns where the journal's Redis is; with the port and password
    file the launcher sets, ServeConfig builds a valid redis_url (the secret stays in the
    0600 file, never in a config)."""
    from marconi_ray.serve.config import ServeConfig, redis_url_from_env

    config = _load(name)
    head = " ".join(config["head_start_ray_commands"])
    worker = " ".join(config["worker_start_ray_commands"])
    assert (
        "export MARCONI_REDIS_HOST=" in head and "export MARCONI_REDIS_HOST=$RAY_HEAD_IP" in worker
    )
    setup = " ".join(config["setup_commands"])
    assert "MARCONI_REDIS_PORT=6380" in setup and "MARCONI_REDIS_PASSWORD_FILE=" in setup
    secret = tmp_path / "redis.pass"
    secret.write_text("0123abcd\n")
    env = {
        "MARCONI_REDIS_HOST": "10.0.0.7",
        "MARCONI_REDIS_PORT": "6380",
        "MARCONI_REDIS_PASSWORD_FILE": str(secret),
    }
    url = redis_url_from_env(env)
    assert url == "redis://:0123abcd@10.0.0.7:6380/0"
    assert ServeConfig(redis_url=url).redis_url == url


def test_kuberay_gives_ray_processes_the_journal_redis() -> None:
    docs = _kuberay_docs()
    service = _one(docs, "RayService", "marconi")
    envs = [{e["name"]: e for e in c.get("env", [])} for c in _containers(service)]
    with_redis = [env for env in envs if "MARCONI_REDIS_HOST" in env]
    assert with_redis, "no Ray container knows the journal's Redis"
    for env in with_redis:
        assert env["MARCONI_REDIS_HOST"]["value"] == "marconi-redis"
        assert env["MARCONI_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "marconi-redis"


def _containers(node: Any) -> Iterator[dict[str, Any]]:
    """Every container spec under `node` (any depth)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "containers" and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict))
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)


# --- placement: control plane on the head, replicas on model nodes ---------------------


def _serve_args() -> dict[str, Any]:
    (app,) = yaml.safe_load(SERVE.read_text())["applications"]
    return dict(app["args"])


def _start_resources(commands: list[str]) -> dict[str, float]:
    """The JSON of `--resources=...` in `ray start` command lines ({} when absent)."""
    found: dict[str, float] = {}
    for command in commands:
        for arg in shlex.split(command.replace("\n", " ")):
            if arg.startswith("--resources="):
                found.update(json.loads(arg.removeprefix("--resources=")))
    return found


def test_serve_config_pins_the_control_plane_to_the_head_and_replicas_to_model_nodes() -> None:
    args = _serve_args()
    config = ServeConfig(**args)
    assert config.control_resource == "auto"  # the head: node:__internal_head__
    assert config.model_resource == "marconi_model"
    settings = ServeSettings(
        model_dir="unused",
        model_name="small",
        tp=config.tp,
        device=config.device,
        model_resource=config.model_resource,
    )
    first, *shards = shard_bundles(settings)
    assert first == {"CPU": 1.0, "marconi_model": 1.0}  # one unit per replica
    assert all("marconi_model" not in b for b in shards)


def test_launchers_advertise_the_model_resource_on_workers_only() -> None:
    name = _serve_args()["model_resource"]
    aws = _load("aws-gpu.yaml")
    types = aws["available_node_types"]
    assert types["gpu_worker"]["resources"][name] >= 1
    assert name not in types[aws["head_node_type"]]["resources"]
    local = _load("local.yaml")
    assert _start_resources(local["worker_start_ray_commands"])[name] >= 1
    assert name not in _start_resources(local["head_start_ray_commands"])


def test_kuberay_model_nodes_hold_as_many_replicas_as_their_gpus_allow() -> None:
    service = _one(_kuberay_docs(), "RayService")
    serve_config = yaml.safe_load(service["spec"]["serveConfigV2"])
    assert serve_config["proxy_location"] == "HeadOnly"  # no proxy on a model node
    (app,) = serve_config["applications"]
    name, tp = app["args"]["model_resource"], app["args"]["tp"]
    cluster = service["spec"]["rayClusterConfig"]
    (group,) = cluster["workerGroupSpecs"]
    slots = json.loads(json.loads(group["rayStartParams"]["resources"]))[name]
    (worker,) = group["template"]["spec"]["containers"]
    assert 1 <= slots * tp <= int(worker["resources"]["limits"]["nvidia.com/gpu"])
    assert "resources" not in cluster["headGroupSpec"]["rayStartParams"]
