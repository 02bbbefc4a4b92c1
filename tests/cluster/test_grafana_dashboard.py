"""cluster/grafana-dashboard.json against the metrics the service really exports.

The exported series are not listed here: they come from rendering `GET /metrics` text with
the real `render_metrics` over a real `IngressMetrics` (histograms observed, a request
counted) and the `ReplicaStats` of real `PrefixCache`s that served a few conversations
(one of them with a host tier, its replica reporting store figures), parsed back with
prometheus_client's own parser. Every PromQL expression of the dashboard (panel targets
and template-variable queries) must name only those series (with the `_total` /
`_bucket` / `_sum` / `_count` names the exporter renders), and only labels those series
carry (plus `job`/`instance`, which Prometheus attaches at scrape time).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cache_samples import served_cache, tiered_cache
from prometheus_client.parser import text_string_to_metric_families

from marconi_ray.protocol.results import SpecCounts
from marconi_ray.serve.ingress.metrics import IngressMetrics, render_metrics
from marconi_ray.serve.messages import ReplicaStats

DASHBOARD = Path(__file__).resolve().parents[2] / "cluster" / "grafana-dashboard.json"
DS_INPUT = "DS_PROMETHEUS"
TARGET_LABELS = frozenset({"job", "instance"})
"""Labels Prometheus attaches to every scraped series (target labels)."""

Exported = dict[str, frozenset[str] | None]
"""Series name -> its label names (None: the family rendered no sample, labels unknown)."""

# ------------------------------------------------------------------ exported series


def _series_names(family_name: str, family_type: str) -> list[str]:
    """The series names a family with no sample would render once it has one."""
    suffixes = {
        "counter": ["_total"],
        "histogram": ["_bucket", "_sum", "_count"],
        "summary": ["", "_sum", "_count"],
    }.get(family_type, [""])
    return [family_name + s for s in suffixes]


def render_exported() -> tuple[str, Exported]:
    """Real `/metrics` text and the series names (with label names) it holds."""
    metrics = IngressMetrics()
    metrics.ttft.observe(0.02)
    metrics.e2e.observe(0.4)
    metrics.count(200)
    metrics.count_spec(SpecCounts(5, 3, (3, 2), (2, 1)))
    stats = [
        ReplicaStats.of(name, served_cache(cap, seed), in_flight=1, tuner_runs=2)
        for name, cap, seed in (("r0", 10**6, 0), ("r1", 1200, 1))
    ]
    store = {
        f"{what}_{way}": 1.0
        for what in ("bytes", "seconds", "moves")
        for way in ("to_host", "to_device")
    }
    stats.append(ReplicaStats.of("r2", tiered_cache(), 0, 0, store={**store, "host_bytes": 1.0}))
    text = render_metrics(metrics, stats, tuner_runs=2).decode()
    labels: dict[str, set[str]] = {}
    unknown: set[str] = set()
    for family in text_string_to_metric_families(text):
        if not family.samples:
            unknown.update(_series_names(family.name, family.type))
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    exported: Exported = {name: None for name in unknown}
    exported.update({name: frozenset(names) for name, names in labels.items()})
    return text, exported


@pytest.fixture(scope="module")
def exported() -> Exported:
    return render_exported()[1]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


# ------------------------------------------------------------------ PromQL scanning
KEYWORDS = frozenset(
    {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "inf",
        "nan",
    }
)
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
IDENT = re.compile(r"(?<![\w.:$])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")
SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)?\s*\{([^}]*)\}")
MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*(\"(?:[^\"\\]|\\.)*\"|'[^']*'|`[^`]*`)")
VARIABLE = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\$(\w+)|\[\[(\w+)(?::[\w]+)?\]\]")


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers that are not functions,
    aggregations, keywords, label names, variables, durations or numbers."""
    names = {
        m.group(3)[1:-1]
        for sel in SELECTOR.finditer(expr)
        for m in MATCHER.finditer(sel.group(2))
        if m.group(1) == "__name__" and m.group(2) == "="
    }
    bare = STRING.sub('""', expr)
    bare = VARIABLE.sub(" ", bare)
    bare = re.sub(r"\{[^}]*\}", " ", bare)  # label matchers
    bare = re.sub(r"\[[^\]]*\]", " ", bare)  # range / subquery durations
    bare = GROUPING.sub(" ", bare)
    names.update(n for n in IDENT.findall(bare) if n.lower() not in KEYWORDS)
    return names


def selectors(expr: str) -> Iterator[tuple[str | None, list[str]]]:
    """(metric name or None, label names matched) of every `{...}` selector."""
    for sel in SELECTOR.finditer(STRING.sub(lambda m: m.group(0).replace("}", " "), expr)):
        yield sel.group(1), [m.group(1) for m in MATCHER.finditer(sel.group(2))]


def grouping_labels(expr: str) -> set[str]:
    """Label names of every by/without/on/ignoring/group_left/group_right clause."""
    return {
        label.strip()
        for clause in GROUPING.finditer(STRING.sub('""', expr))
        for label in clause.group(1).split(",")
        if label.strip()
    }


def variables(text: str) -> set[str]:
    """Dashboard variables referenced ($var, ${var}, ${var:fmt}, [[var]]), less Grafana's
    built-ins ($__rate_interval, $__range, ...)."""
    found = {next(g for g in m.groups() if g) for m in VARIABLE.finditer(text)}
    return {v for v in found if not v.startswith("__")}


# ------------------------------------------------------------------ dashboard walking
def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, with those nested in collapsed rows."""
    out = []
    for panel in dash.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def data_panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in panels(dash) if p.get("type") != "row"]


def variable_query(var: dict[str, Any]) -> str:
    query = var.get("query", "")
    return str(query.get("query", "")) if isinstance(query, dict) else str(query)


def expressions(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable."""
    out = []
    for panel in data_panels(dash):
        for target in panel.get("targets", []):
            where = f"panel {panel.get('id')} {panel.get('title')!r} target {target.get('refId')}"
            out.append((where, str(target.get("expr", ""))))
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = variable_query(var)
            inner = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query)
            if inner:  # label_values(selector, label): check the selector
                query = inner.group(1)
            out.append((f"variable {var.get('name')!r}", query))
    return out


# ------------------------------------------------------------------ checks (problem lists)
def datasource_problems(dash: dict[str, Any]) -> list[str]:
    inputs = {i.get("name"): i for i in dash.get("__inputs", [])}
    problems = []
    ds = inputs.get(DS_INPUT)
    if ds is None or ds.get("type") != "datasource" or ds.get("pluginId") != "prometheus":
        problems.append(f"__inputs has no Prometheus datasource input {DS_INPUT!r}")
    ref = "${" + DS_INPUT + "}"

    def bad(obj: Any) -> bool:
        return not (
            isinstance(obj, dict) and obj.get("uid") == ref and obj.get("type") == "prometheus"
        )

    for panel in data_panels(dash):
        name = f"panel {panel.get('id')} {panel.get('title')!r}"
        if bad(panel.get("datasource")):
            problems.append(f"{name}: datasource is not {ref}: {panel.get('datasource')!r}")
        for target in panel.get("targets", []):
            if "datasource" in target and bad(target["datasource"]):
                problems.append(f"{name} target {target.get('refId')}: datasource not {ref}")
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "query" and bad(var.get("datasource")):
            problems.append(f"variable {var.get('name')!r}: datasource is not {ref}")
    return problems


def panel_problems(dash: dict[str, Any]) -> list[str]:
    problems = []
    ids = [p.get("id") for p in panels(dash)]
    dupes = sorted({i for i in ids if ids.count(i) > 1}, key=str)
    if dupes:
        problems.append(f"duplicate panel ids: {dupes}")
    for panel in panels(dash):
        name = f"panel {panel.get('id')} {panel.get('title')!r}"
        if not isinstance(panel.get("id"), int):
            problems.append(f"{name}: id must be an int")
        if not (isinstance(panel.get("title"), str) and panel["title"].strip()):
            problems.append(f"{name}: no title")
        pos = panel.get("gridPos", {})
        if not (all(isinstance(pos.get(k), int) for k in "xywh") and pos["x"] + pos["w"] <= 24):
            problems.append(f"{name}: bad gridPos {pos!r}")
        if panel.get("type") == "row":
            continue
        targets = panel.get("targets")
        if not targets:
            problems.append(f"{name}: no targets")
            continue
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or not all(refs):
            problems.append(f"{name}: refIds missing or repeated: {refs}")
        problems += [f"{name}: target with no expr" for t in targets if not t.get("expr")]
    return problems


def metric_problems(dash: dict[str, Any], exported: Exported) -> list[str]:
    """Unknown metric names, and label names a series does not carry."""
    problems = []
    for where, expr in expressions(dash):
        names = metric_names(expr)
        if not names:
            problems.append(f"{where}: selects no metric: {expr!r}")
        for name in sorted(names - exported.keys()):
            problems.append(f"{where}: {name!r} is not exported by the service")
        if any(exported.get(n, frozenset()) is None for n in names):
            continue  # a family with no sample in the fixture: its labels are unknown
        known = [labels for n in names if (labels := exported.get(n)) is not None]
        allowed = TARGET_LABELS.union(*known)
        for metric, used in selectors(expr):
            own = exported.get(metric) if metric else None
            ok = (TARGET_LABELS | own) if own is not None else allowed | {"__name__"}
            for label in used:
                if label not in ok:
                    problems.append(f"{where}: {metric or 'selector'} has no label {label!r}")
        for label in sorted(grouping_labels(expr) - allowed):
            problems.append(f"{where}: groups by {label!r}, which no series in it carries")
    return problems


def variable_problems(dash: dict[str, Any], exported: Exported) -> list[str]:
    defined = {v.get("name") for v in dash.get("templating", {}).get("list", [])}
    problems = []
    for where, expr in expressions(dash):
        for var in sorted(variables(expr) - defined):
            problems.append(f"{where}: uses undefined variable ${var}")
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        inner = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", variable_query(var))
        if inner is None:
            problems.append(f"variable {var.get('name')!r}: not a label_values(metric, label)")
            continue
        for metric in metric_names(inner.group(1)) & exported.keys():
            own = exported[metric]
            if own is not None and inner.group(2) not in TARGET_LABELS | own:
                problems.append(
                    f"variable {var.get('name')!r}: {metric} has no label {inner.group(2)!r}"
                )
    return problems


# ------------------------------------------------------------------ tests
def test_exporter_renders_what_the_checks_rely_on(exported: Exported) -> None:
    """The derived set is the real one (histogram and counter suffixes, the labels)."""
    for hist in ("marconi_ttft_seconds", "marconi_e2e_latency_seconds"):
        assert exported[f"{hist}_bucket"] == {"le"}
        assert f"{hist}_sum" in exported and f"{hist}_count" in exported
    assert exported["marconi_cache_bytes"] == {"replica", "kind"}
    assert exported["marconi_cache_states_admitted_total"] == {"replica", "reason"}
    assert exported["marconi_cache_flops_saved_total"] == {"replica"}
    assert "marconi_cache_flops_saved" not in exported  # counters only as _total
    assert exported["marconi_cache_tier_bytes"] == {"replica", "tier"}
    assert exported["marconi_cache_tier_hit_tokens_total"] == {"replica", "tier"}
    assert exported["marconi_store_tier_copied_bytes_total"] == {"replica", "direction"}


def test_dashboard_is_grafana_json(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"] and dashboard["uid"]
    assert dashboard["schemaVersion"] >= 38  # Grafana 10+
    assert dashboard.get("id") is None  # importable anywhere
    assert data_panels(dashboard)


def test_panels_have_title_targets_and_unique_ids(dashboard: dict[str, Any]) -> None:
    assert panel_problems(dashboard) == []


def test_datasource_is_the_input(dashboard: dict[str, Any]) -> None:
    assert datasource_problems(dashboard) == []
    names = {v["name"]: v for v in dashboard["templating"]["list"]}
    # Also a datasource variable of the same name: file provisioning does not substitute
    # __inputs, so ${DS_PROMETHEUS} then resolves through the variable.
    assert names[DS_INPUT]["type"] == "datasource" and names[DS_INPUT]["query"] == "prometheus"


def test_every_metric_and_label_is_exported(dashboard: dict[str, Any], exported: Exported) -> None:
    assert metric_problems(dashboard, exported) == []


def test_template_variables_are_defined(dashboard: dict[str, Any], exported: Exported) -> None:
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert "replica" in names
    assert variable_problems(dashboard, exported) == []


def test_histograms_are_quantiles_over_bucket_rates(dashboard: dict[str, Any]) -> None:
    for where, expr in expressions(dashboard):
        if "_bucket" in expr:
            assert "histogram_quantile(" in expr and "rate(" in expr, where
            assert "le" in grouping_labels(expr), f"{where}: bucket sum without le"
    quantiles = {
        (name, q)
        for _, expr in expressions(dashboard)
        for q in re.findall(r"histogram_quantile\(\s*([\d.]+)", expr)
        for name in metric_names(expr)
    }
    for hist in ("marconi_ttft_seconds_bucket", "marconi_e2e_latency_seconds_bucket"):
        assert {q for n, q in quantiles if n == hist} >= {"0.5", "0.95", "0.99"}, hist


def test_dashboard_covers_the_cache_figures(dashboard: dict[str, Any], exported: Exported) -> None:
    used = set().union(*(metric_names(e) for _, e in expressions(dashboard)))
    wanted = {
        "marconi_cache_token_hit_rate",
        "marconi_cache_request_hit_rate",
        "marconi_cache_hit_tokens_total",
        "marconi_cache_input_tokens_total",
        "marconi_cache_flops_saved_total",
        "marconi_cache_bytes",
        "marconi_cache_capacity_bytes",
        "marconi_cache_used_bytes",
        "marconi_cache_reserved_bytes",
        "marconi_cache_states_admitted_total",
        "marconi_cache_evictions_total",
        "marconi_cache_alpha",
        "marconi_replica_tuner_runs_total",
        "marconi_tuner_runs_total",
        "marconi_replica_in_flight",
        "marconi_ttft_seconds_bucket",
        "marconi_e2e_latency_seconds_bucket",
    }
    assert wanted <= exported.keys()
    assert wanted - used == set()


def test_dashboard_covers_the_host_tier(dashboard: dict[str, Any], exported: Exported) -> None:
    """Bytes per tier, hit tokens per tier, promotions and demotions, copy bandwidth."""
    used = set().union(*(metric_names(e) for _, e in expressions(dashboard)))
    wanted = {
        "marconi_cache_tier_bytes",
        "marconi_cache_tier_capacity_bytes",
        "marconi_cache_tier_hit_tokens_total",
        "marconi_cache_promotions_total",
        "marconi_cache_demotions_total",
        "marconi_cache_promoted_bytes_total",
        "marconi_cache_demoted_bytes_total",
        "marconi_cache_host_evictions_total",
        "marconi_store_tier_copied_bytes_total",
        "marconi_store_tier_copy_seconds_total",
        "marconi_store_host_bytes",
    }
    assert wanted <= exported.keys()
    assert wanted - used == set()
    bandwidth = [
        e for _, e in expressions(dashboard) if "marconi_store_tier_copy_seconds_total" in e
    ]
    assert any("marconi_store_tier_copied_bytes_total" in e and " / " in e for e in bandwidth)


# ------------------------------------------------------------------ the checks bite
def test_scanner_ignores_functions_keywords_labels_and_variables() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, job) (rate(a_bucket{job=~"$job",x="y}"}'
        "[$__rate_interval] offset 5m))) / on (job) group_left sum without (instance) "
        '(b_total) > bool 1e-3 and ignoring(job) c or {__name__="d", job="j"}'
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c", "d"}
    assert grouping_labels(expr) == {"le", "job", "instance"}
    assert variables(expr) == {"job"}


def test_unknown_metric_fails(dashboard: dict[str, Any], exported: Exported) -> None:
    broken = copy.deepcopy(dashboard)
    target = data_panels(broken)[-1]["targets"][0]
    target["expr"] = 'sum(rate(marconi_cache_flops_saved{job=~"$job"}[5m]))'  # no _total
    problems = metric_problems(broken, exported)
    assert any("'marconi_cache_flops_saved'" in p for p in problems), problems


def test_unknown_label_and_variable_fail(dashboard: dict[str, Any], exported: Exported) -> None:
    broken = copy.deepcopy(dashboard)
    target = data_panels(broken)[-1]["targets"][0]
    target["expr"] = 'sum by (app) (marconi_cache_alpha{model="m", replica=~"$nope"})'
    problems = metric_problems(broken, exported)
    assert any("no label 'model'" in p for p in problems), problems
    assert any("groups by 'app'" in p for p in problems), problems
    assert any("$nope" in p for p in variable_problems(broken, exported))


def test_duplicate_id_and_missing_datasource_fail(dashboard: dict[str, Any]) -> None:
    broken = copy.deepcopy(dashboard)
    first, second = data_panels(broken)[:2]
    second["id"] = first["id"]
    second["datasource"] = {"type": "prometheus", "uid": "prometheus"}
    del first["targets"]
    assert any("duplicate panel ids" in p for p in panel_problems(broken))
    assert any("no targets" in p for p in panel_problems(broken))
    assert any("datasource is not" in p for p in datasource_problems(broken))
