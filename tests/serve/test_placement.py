"""Placement settings (no Ray): where the control plane and the replicas may run, and the
errors that bad values get."""

from __future__ import annotations

import pytest

from marconi_ray.serve.config import config_from_mapping
from marconi_ray.serve.placement import (
    CONTROL_SHARE,
    HEAD_RESOURCE,
    TUNER_TASK_OPTIONS,
    check_placement,
    control_resources,
    model_bundle_resources,
)
from marconi_ray.serve.replica.deployment import replica_resources, shard_bundles
from marconi_ray.serve.settings import ServeSettings

CLUSTER = {"CPU": 8.0, HEAD_RESOURCE: 1.0, "node:10.0.0.1": 1.0, "marconi_control": 1.0}


def _settings(**kw: object) -> ServeSettings:
    return ServeSettings(model_dir="unused", model_name="tiny", **kw)  # type: ignore[arg-type]


def test_control_plane_defaults_to_the_head_node() -> None:
    assert _settings().control_resource == "auto"
    assert control_resources("auto", CLUSTER) == {HEAD_RESOURCE: CONTROL_SHARE}
    # a Ray without the head resource (none advertised): anywhere, not an error
    assert control_resources("auto", {"CPU": 2.0}) == {}
    assert control_resources("none", CLUSTER) == {}
    assert control_resources("marconi_control", CLUSTER) == {"marconi_control": CONTROL_SHARE}


def test_a_control_resource_no_node_has_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"'ctl' is advertised by no node.*marconi_control"):
        control_resources("ctl", CLUSTER)


def test_replicas_take_one_unit_of_the_model_resource() -> None:
    assert model_bundle_resources(None) == {}
    plain = _settings()
    assert shard_bundles(plain) == [{"CPU": 1.0}]
    one = _settings(model_resource="marconi_model")
    assert shard_bundles(one) == [{"CPU": 1.0, "marconi_model": 1.0}]
    assert replica_resources(one) == {"num_cpus": 1.0}  # the bundle holds the unit
    tp2 = _settings(model_resource="m", tp=2, device="cuda")
    assert shard_bundles(tp2) == [
        {"CPU": 1.0, "m": 1.0},
        {"CPU": 1.0, "GPU": 1.0},
        {"CPU": 1.0, "GPU": 1.0},
    ]


def test_tuner_tasks_spread_on_cpus() -> None:
    assert TUNER_TASK_OPTIONS == {"num_cpus": 1, "num_gpus": 0, "scheduling_strategy": "SPREAD"}


@pytest.mark.parametrize(
    ("control", "model", "message"),
    [
        ("CPU", None, "control_resource must be a custom resource"),
        ("a b", None, "control_resource must be a resource name without spaces"),
        ("auto", "GPU", "model_resource must be a custom resource"),
        ("auto", "", "model_resource must be a non-empty resource name"),
        ("auto", HEAD_RESOURCE, "model nodes must not be control nodes"),
        ("ctl", "ctl", "model nodes must not be control nodes"),
    ],
)
def test_bad_placement_values_are_errors(control: str, model: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_placement(control, model)
    with pytest.raises(ValueError, match=message):
        _settings(control_resource=control, model_resource=model)
    with pytest.raises(ValueError, match=message):
        config_from_mapping({"control_resource": control, "model_resource": model})


def test_placement_keys_from_a_config() -> None:
    config = config_from_mapping({"control_resource": "ctl", "model_resource": "gpu_node"})
    assert (config.control_resource, config.model_resource) == ("ctl", "gpu_node")
    with pytest.raises(ValueError, match=r"control_resource: String should have at least"):
        config_from_mapping({"control_resource": ""})
