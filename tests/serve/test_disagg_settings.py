"""Roles and transfers as settings (`serve.disagg`), the config keys and flags that set
them, and the pure choice of where a request runs (`routing.disagg`)."""

from __future__ import annotations

import argparse

import pytest

from marconi_ray.cli.serve import add_parser, load_config
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.serve.config import config_from_mapping
from marconi_ray.serve.coordinator.routing.disagg import (
    Candidate,
    MoveClock,
    Pull,
    stage_remote,
    stage_roles,
)
from marconi_ray.serve.disagg import DisaggSettings, assign_role, rebalance_roles
from marconi_ray.serve.transfer_modes import transfer_mode


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"prefill_replicas": 1}, "both 0 (mixed replicas) or both >= 1, got 1 and 0"),
        ({"decode_replicas": 2}, "got 0 and 2"),
        ({"prefill_replicas": 1, "decode_replicas": 1, "replicas": 3}, "replicas (3) must equal"),
        (
            {"prefill_replicas": 1, "decode_replicas": 1, "remote_hits": True},
            "remote_hits is for mixed replicas",
        ),
        ({"transfer": "tcp"}, "transfer"),
        ({"transfer_gbps": 0}, "transfer_gbps"),
        ({"transfer_latency_s": -1}, "transfer_latency_s"),
        ({"prefill_replicas": -1, "decode_replicas": 1}, "prefill_replicas"),
    ],
)
def test_bad_role_and_transfer_settings_are_named(data: dict, needle: str) -> None:
    with pytest.raises(ValueError, match="invalid serve config") as err:
        config_from_mapping(data)
    assert needle in str(err.value)


def test_roles_set_the_replicas_and_coordinators_must_be_one(tmp_path) -> None:
    c = config_from_mapping({"prefill_replicas": 2, "decode_replicas": 3, "transfer": "gloo"})
    s = c.to_settings(tmp_path)
    assert s.replicas == 5 and s.disagg.roles and s.disagg.transfer == "gloo"
    assert s.shard_actors  # a tp 1 replica's store lives in a shard actor to move entries
    assert not config_from_mapping({}).to_settings(tmp_path).shard_actors
    with pytest.raises(ValueError, match="set coordinators to 1"):
        config_from_mapping({"remote_hits": True, "coordinators": 2, "replicas": 2}).to_settings(
            tmp_path
        )


def test_collective_transfers_are_refused_at_tp_above_one(tmp_path) -> None:
    roles = {"prefill_replicas": 1, "decode_replicas": 1, "tp": 2}
    with pytest.raises(ValueError, match="cannot run at tp 2"):
        config_from_mapping({**roles, "transfer": "gloo"}).to_settings(tmp_path)
    s = config_from_mapping({**roles, "transfer": "auto"}).to_settings(tmp_path)
    assert transfer_mode(s.disagg.transfer, s.device, s.tp).name == "object_store"
    assert transfer_mode("auto", "cpu", 1).name == "gloo"


def test_serve_flags_set_roles_and_transfers() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["serve", "--prefill-replicas", "1", "--decode-replicas", "2", "--transfer", "gloo"]
    )
    c = load_config(args)
    assert (c.prefill_replicas, c.decode_replicas, c.transfer) == (1, 2, "gloo")
    args = parser.parse_args(["serve", "--replicas", "2", "--remote-hits"])
    assert load_config(args).remote_hits is True


def test_roles_go_in_registration_order_and_a_lost_role_is_taken_again() -> None:
    d = DisaggSettings(prefill_replicas=2, decode_replicas=1)
    taken: list[str] = []
    for _ in range(4):
        taken.append(assign_role(d, taken))
    assert taken == ["prefill", "prefill", "decode", "decode"]
    assert assign_role(d, ["prefill", "decode"]) == "prefill"  # a prefill replica was lost
    assert assign_role(DisaggSettings(), ["mixed"]) == "mixed"


def test_a_role_left_short_is_taken_by_the_latest_replica_of_the_other() -> None:
    d = DisaggSettings(prefill_replicas=1, decode_replicas=1)
    # the prefill replica was replaced before it was dropped: its replacement decodes
    assert rebalance_roles(d, [("n", "decode"), ("p2", "decode")]) == {"p2": "prefill"}
    assert rebalance_roles(d, [("p", "prefill"), ("d", "decode")]) == {}
    assert rebalance_roles(d, [("p", "prefill"), ("q", "prefill")]) == {"q": "decode"}
    assert rebalance_roles(d, [("d", "decode")]) == {}  # nothing to give: it stays
    assert rebalance_roles(DisaggSettings(), [("m", "mixed")]) == {}


def _clock(gbps: float = 10.0, tflops: float = 1e-3) -> MoveClock:
    return MoveClock(CostModel(1e6, 10.0, 4096, 1 << 20), tflops, gbps, 1e-3)


def test_a_prompt_with_nothing_cached_on_the_decode_side_is_handed_off() -> None:
    got = stage_roles(
        500, Candidate("p", 0, 0), [Candidate("d0", 0, 3), Candidate("d1", 0, 1)], _clock()
    )
    assert (got.replica, got.handoff, got.pull, got.way) == ("p", "d1", None, "handoff")


def test_a_short_suffix_runs_where_its_hit_is_unless_that_replica_is_busy() -> None:
    idle = stage_roles(520, Candidate("p", 0, 0), [Candidate("d", 500, 0)], _clock())
    assert (idle.replica, idle.handoff, idle.way) == ("d", None, "local")
    busy = stage_roles(4000, Candidate("p", 0, 0), [Candidate("d", 500, 60)], _clock())
    assert busy.replica == "p" and busy.handoff == "d"
    assert busy.pull == Pull("d", 500) and busy.way == "pull+handoff"
    slow = stage_roles(4000, Candidate("p", 0, 0), [Candidate("d", 500, 60)], _clock(gbps=1e-4))
    assert slow.pull is None and slow.way == "handoff"  # the link is slower than a recompute


def test_without_one_role_a_request_still_runs() -> None:
    only_decode = stage_roles(100, None, [Candidate("d", 0, 2), Candidate("e", 0, 0)], _clock())
    assert (only_decode.replica, only_decode.handoff) == ("e", None)
    only_prefill = stage_roles(100, Candidate("p", 0, 0), [], _clock())
    assert (only_prefill.replica, only_prefill.handoff) == ("p", None)
    with pytest.raises(ValueError, match="no prefill or decode replica"):
        stage_roles(100, None, [], _clock())


def test_a_remote_hit_is_pulled_only_when_the_link_beats_recomputing() -> None:
    routed, holders = Candidate("b", 10, 0), [Candidate("a", 900, 5), Candidate("b", 10, 0)]
    assert stage_remote(routed, holders, _clock()).pull == Pull("a", 900)
    assert stage_remote(routed, holders, _clock(gbps=1e-5)).pull is None
    assert stage_remote(Candidate("b", 900, 0), holders, _clock()).pull is None
