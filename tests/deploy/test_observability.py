"""The dashboard and the alert rules query only what the workers really export.

Nothing here runs Prometheus or Grafana: the PromQL is read by a small tokenizer and every metric,
label and function it names is checked against ``FleetMetrics().registry``, so a renamed metric or
a typo fails here instead of leaving an empty panel or an alert that never fires.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from workers.metrics import FleetMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "infra" / "grafana" / "dashboards" / "ctxfleet.json"
ALERTS = ROOT / "infra" / "prometheus" / "alerts.yaml"
PROMETHEUS_RULE = ROOT / "k8s" / "base" / "monitoring" / "prometheusrule.yaml"
PROMETHEUS_CONFIG = ROOT / "infra" / "prometheus" / "prometheus.yml"

# Labels Prometheus attaches to every scraped series, whatever the process exports.
TARGET_LABELS = frozenset({"job", "instance"})
SEVERITIES = frozenset({"info", "warning", "critical"})

# Sample names the exposition format derives from a metric family, by family type (without the
# ``_created`` series, which the workers turn off).
_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
    "stateset": ("",),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "unknown": ("",),
}

AGGREGATIONS = frozenset(
    "sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio".split()
)
PROMQL_FUNCTIONS = AGGREGATIONS | frozenset(
    """abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week
    day_of_year days_in_month delta deriv exp floor histogram_avg histogram_count histogram_fraction
    histogram_quantile histogram_stddev histogram_stdvar histogram_sum holt_winters
    double_exponential_smoothing hour idelta increase irate label_join label_replace ln log2 log10 minute
    month predict_linear rate
    resets round scalar sgn sort sort_desc sort_by_label sort_by_label_desc sqrt time timestamp vector year
    avg_over_time min_over_time max_over_time sum_over_time count_over_time quantile_over_time
    stddev_over_time stdvar_over_time last_over_time present_over_time mad_over_time
    acos acosh asin asinh atan atanh cos cosh sin sinh tan tanh deg pi rad""".split()
)
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2", "start", "end"})
_GROUPING = frozenset({"by", "without"})
_MATCHING = frozenset({"on", "ignoring", "group_left", "group_right"})

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_TOKEN = re.compile(
    r"(?P<number>(?<![\w:])(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?:ms|[smhdwy])*(?![\w:]))"
    r"|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)"
    r"|(?P<punct>\S)"
)


# --- what the registry exports -------------------------------------------------------------------


def exported_series() -> dict[str, frozenset[str]]:
    """Every sample name FleetMetrics exposes, with the label names its samples carry."""
    metrics = FleetMetrics()
    # prometheus_client has no public accessor for a metric's label names, and a labelled metric
    # without children yields no samples to read them from.
    declared = {
        w._name: set(w._labelnames) for w in vars(metrics).values() if isinstance(w, MetricWrapperBase)
    }
    series: dict[str, frozenset[str]] = {}
    for family in metrics.registry.collect():
        labels = declared.get(family.name, set()) | {k for s in family.samples for k in s.labels}
        for suffix in _SUFFIXES[family.type]:
            extra = {"le"} if suffix == "_bucket" else set()
            series[family.name + suffix] = frozenset(labels | extra)
    return series


SERIES = exported_series()
FAMILIES = frozenset(f.name for f in FleetMetrics().registry.collect())


def family_of(series: str) -> str:
    """``ctx_prepare_seconds_bucket`` → ``ctx_prepare_seconds`` (the longest family that is a prefix)."""
    return max((f for f in FAMILIES if series == f or series.startswith(f + "_")), key=len, default=series)


# --- PromQL, as far as these checks need it --------------------------------------------------------


@dataclass
class Query:
    """The names one PromQL expression uses."""

    selectors: list[tuple[str, frozenset[str]]] = field(default_factory=list)  # (metric, matcher labels)
    groupings: list[tuple[frozenset[str], frozenset[str]]] = field(
        default_factory=list
    )  # (labels, metrics in scope)
    functions: set[str] = field(default_factory=set)

    @property
    def metrics(self) -> set[str]:
        return {name for name, _ in self.selectors}


def parse_promql(expr: str) -> Query:
    """Metric selectors, ``by``/``without`` groupings with the metrics they aggregate, and called functions.

    Strings, Grafana variables, range and subquery brackets, numbers and durations are dropped first,
    so none of them can be mistaken for a metric name.
    """
    text = _RANGE.sub("", _GRAFANA_VARIABLE.sub("", _STRING.sub('""', expr)))
    tokens = [m.group() for m in _TOKEN.finditer(text) if m.lastgroup != "number"]
    query = Query()
    selectors: dict[int, str] = {}
    groupings: list[tuple[int, int, frozenset[str]]] = []
    i = 0
    while i < len(tokens):
        token, following = tokens[i], tokens[i + 1] if i + 1 < len(tokens) else ""
        if token == "{":  # a selector without a metric name: {__name__=~"..."}
            i = _closing(tokens, i) + 1
        elif not _IDENT.fullmatch(token) or token in _KEYWORDS:
            i += 1
        elif token in _GROUPING | _MATCHING:
            if following != "(":  # group_left without a label list
                i += 1
                continue
            close = _closing(tokens, i + 1)
            if token in _GROUPING:
                groupings.append((i, close, frozenset(tokens[i + 2 : close]) - {","}))
            i = close + 1
        elif following == "(" or (token in AGGREGATIONS and following in _GROUPING):
            query.functions.add(token)
            i += 1
        else:
            end, matchers = i, frozenset[str]()
            if following == "{":
                end = _closing(tokens, i + 1)
                inside = tokens[i + 2 : end]
                matchers = frozenset(
                    t
                    for t, n in zip(inside, inside[1:], strict=False)
                    if _IDENT.fullmatch(t) and n in ("=", "!")
                )
            query.selectors.append((token, matchers))
            selectors[i] = token
            i = end + 1
    for at, close, labels in groupings:
        start, end = _aggregated(tokens, at, close)
        query.groupings.append((labels, frozenset(name for j, name in selectors.items() if start < j < end)))
    return query


def _closing(tokens: list[str], opening: int) -> int:
    """Index of the bracket that closes ``tokens[opening]``."""
    pair = {"(": ")", "{": "}"}[tokens[opening]]
    depth = 0
    for j in range(opening, len(tokens)):
        depth += (tokens[j] == tokens[opening]) - (tokens[j] == pair)
        if depth == 0:
            return j
    raise ValueError(f"unbalanced {tokens[opening]!r}")


def _aggregated(tokens: list[str], at: int, close: int) -> tuple[int, int]:
    """The bracket span an aggregation applies to: ``sum by (x) (ARG)`` or ``sum (ARG) by (x)``."""
    if at > 0 and tokens[at - 1] == ")":
        depth = 0
        for j in range(at - 1, -1, -1):
            depth += (tokens[j] == ")") - (tokens[j] == "(")
            if depth == 0:
                return j, at - 1
    if close + 1 < len(tokens) and tokens[close + 1] == "(":
        return close + 1, _closing(tokens, close + 1)
    raise ValueError(f"{tokens[at]} ({', '.join(tokens[at + 2 : close])}) aggregates nothing")


# --- the files -------------------------------------------------------------------------------------


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return dashboard


def load_alert_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return groups


def dashboard_panels() -> Iterator[dict[str, Any]]:
    """Every panel that shows data: rows are containers, including the panels of collapsed rows."""
    for panel in load_dashboard()["panels"]:
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def alert_rules() -> Iterator[dict[str, Any]]:
    for group in load_alert_groups():
        yield from group["rules"]


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every dashboard target and alert rule."""
    found = [
        (f"panel {p['title']!r} {t['refId']}", t["expr"])
        for p in dashboard_panels()
        for t in p.get("targets", [])
    ]
    found += [(f"alert {r['alert']}", r["expr"]) for r in alert_rules()]
    return found


def unknown_metrics(expr: str) -> set[str]:
    return parse_promql(expr).metrics - SERIES.keys()


EXPRESSIONS = expressions()
IDS = [where for where, _ in EXPRESSIONS]


# --- the extractor itself --------------------------------------------------------------------------


def test_extractor_reports_a_metric_the_registry_does_not_export() -> None:
    expr = 'sum by (purpose) (rate(ctx_prepare_secs_bucket{purpose="x"}[5m]))'
    assert unknown_metrics(expr) == {"ctx_prepare_secs_bucket"}


def test_extractor_ignores_functions_keywords_strings_variables_numbers_and_durations() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le) "
        '(rate(ctx_a_bucket{code=~"x|ctx_not_a_metric"}[$__rate_interval])))'
        ' > 1e-3 and on (le) ctx_b offset 5m unless label_replace(ctx_c, "dst", "$1", "src", "(.*)")'
        " or rate(ctx_d[5m:1m]) * ${factor}"
    )
    query = parse_promql(expr)
    assert query.metrics == {"ctx_a_bucket", "ctx_b", "ctx_c", "ctx_d"}
    assert query.functions == {"histogram_quantile", "sum", "rate", "label_replace"}
    assert dict(query.selectors)["ctx_a_bucket"] == {"code"}


def test_extractor_scopes_a_grouping_to_the_aggregation_it_belongs_to() -> None:
    expr = "sum by (reason) (rate(ctx_x_total[5m])) / scalar(sum(ctx_y_total)) + sum(ctx_z) by (code)"
    assert sorted(parse_promql(expr).groupings, key=sorted) == sorted(
        [(frozenset({"reason"}), frozenset({"ctx_x_total"})), (frozenset({"code"}), frozenset({"ctx_z"}))],
        key=sorted,
    )


def test_registry_series_include_the_suffixes_prometheus_exposes() -> None:
    # Guards the derivation the whole module relies on, with metrics that exist since the start.
    assert {
        "ctx_events_recorded_total",
        "ctx_prepare_seconds_bucket",
        "ctx_prepare_seconds_count",
        "ctx_compaction_queue_jobs",
    } <= SERIES.keys()
    assert "ctx_events_recorded" not in SERIES
    assert SERIES["ctx_prepare_seconds_bucket"] == {"purpose", "policy", "le"}


# --- every query against the registry --------------------------------------------------------------


@pytest.mark.parametrize(("where", "expr"), EXPRESSIONS, ids=IDS)
def test_query_names_only_metrics_the_workers_export(where: str, expr: str) -> None:
    query = parse_promql(expr)
    assert query.metrics, f"{where}: no metric found in {expr!r}"
    assert not unknown_metrics(expr), (
        f"{where}: not exported by FleetMetrics: {sorted(unknown_metrics(expr))}"
    )


@pytest.mark.parametrize(("where", "expr"), EXPRESSIONS, ids=IDS)
def test_query_groups_and_filters_only_by_labels_the_metric_has(where: str, expr: str) -> None:
    query = parse_promql(expr)
    for labels, metrics in query.groupings:
        for metric in metrics & SERIES.keys():
            missing = labels - SERIES[metric] - TARGET_LABELS
            assert not missing, f"{where}: {metric} has no label {sorted(missing)}"
    for metric, matchers in query.selectors:
        missing = matchers - SERIES.get(metric, frozenset()) - TARGET_LABELS - {"__name__"}
        assert not missing, f"{where}: {metric} has no label {sorted(missing)}"


@pytest.mark.parametrize(("where", "expr"), EXPRESSIONS, ids=IDS)
def test_query_calls_only_promql_functions(where: str, expr: str) -> None:
    unknown = parse_promql(expr).functions - PROMQL_FUNCTIONS
    assert not unknown, f"{where}: not PromQL functions: {sorted(unknown)}"


def test_scrape_target_labels_do_not_shadow_metric_labels() -> None:
    # A target label named like a metric's own label wins, and the metric's is renamed exported_<name>:
    # every query grouping by it would then silently group by the target instead.
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    target_labels = set()
    for job in config["scrape_configs"]:
        target_labels |= {r["target_label"] for r in job.get("relabel_configs", []) if "target_label" in r}
        target_labels |= {k for s in job.get("static_configs", []) for k in s.get("labels", {})}
    metric_labels = set().union(*SERIES.values())
    assert not target_labels & metric_labels


# --- the dashboard ---------------------------------------------------------------------------------


def test_every_dashboard_panel_has_a_title_a_description_and_a_query() -> None:
    for panel in dashboard_panels():
        title = panel.get("title", "").strip()
        assert title, f"panel {panel.get('id')} has no title"
        assert len(panel.get("description", "").strip()) >= 40, f"{title!r}: describe how to read it"
        assert panel.get("targets"), f"{title!r} has no query"
        assert all(t.get("expr", "").strip() and t.get("refId") for t in panel["targets"]), title


def test_dashboard_panels_query_through_the_datasource_variable() -> None:
    # A hard-coded datasource uid breaks the dashboard in any Grafana but the one it was exported from.
    dashboard = load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dashboard_panels():
        for source in [panel.get("datasource")] + [t.get("datasource") for t in panel["targets"]]:
            assert source == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_dashboard_has_identity_and_unique_panel_ids() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] and dashboard["title"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    ids = [p["id"] for p in dashboard["panels"]] + [
        p["id"] for r in dashboard["panels"] for p in r.get("panels", [])
    ]
    assert len(ids) == len(set(ids))
    assert all({"h", "w", "x", "y"} <= p["gridPos"].keys() for p in dashboard["panels"])


# (metric family, label the panel breaks it down by, or None)
REQUIRED_PANELS = [
    ("ctx_prepare_seconds", "purpose"),
    ("ctx_prepare_budget_ratio", "purpose"),
    ("ctx_compaction_trigger_hits", "condition"),
    ("ctx_compactions", "result"),
    ("ctx_compaction_queue_jobs", None),
    ("ctx_compaction_queue_oldest_age_seconds", None),
    ("ctx_summarizer_tokens", "direction"),
    ("ctx_summarizer_calls", None),
    ("ctx_consumer_lag_events", "worker"),
    ("ctx_consumer_lag_jobs", "worker"),
    ("ctx_consumer_lag_threads", "worker"),
    ("ctx_revision_conflicts", None),
    ("ctx_events_recorded", None),
    ("ctx_events_rejected", None),
    ("ctx_budget_overflows", None),
]


@pytest.mark.parametrize(("family", "by"), REQUIRED_PANELS, ids=[f for f, _ in REQUIRED_PANELS])
def test_dashboard_shows_required_metric(family: str, by: str | None) -> None:
    queries = [parse_promql(t["expr"]) for p in dashboard_panels() for t in p["targets"]]
    using = [q for q in queries if any(family_of(m) == family for m in q.metrics)]
    assert using, f"no panel queries {family}"
    if by is not None:
        assert any(by in labels for q in using for labels, _ in q.groupings), (
            f"no panel shows {family} by {by}"
        )


def test_prepare_latency_panel_shows_p50_p95_and_p99() -> None:
    quantiles = {
        float(q)
        for p in dashboard_panels()
        for t in p["targets"]
        if "ctx_prepare_seconds_bucket" in t["expr"]
        for q in re.findall(r"histogram_quantile\(\s*([0-9.]+)", t["expr"])
    }
    assert {0.5, 0.95, 0.99} <= quantiles


# --- the alert rules -------------------------------------------------------------------------------

_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")


def duration_seconds(text: str) -> float:
    """A Prometheus duration (``1h30m``, ``90s``, ``0``) in seconds; ValueError if it is not one."""
    match = _DURATION.match(text)
    if text == "0":
        return 0.0
    if not text or match is None:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    units = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
    return sum(int(n) * unit for n, unit in zip(match.groups(), units, strict=False) if n)


def test_duration_parser_rejects_what_prometheus_rejects() -> None:
    assert duration_seconds("1h30m") == 5400
    for bad in ("5 m", "10min", "m", "1.5h", ""):
        with pytest.raises(ValueError):
            duration_seconds(bad)


def test_every_alert_has_severity_summary_description_and_a_valid_for() -> None:
    names = []
    for rule in alert_rules():
        names.append(rule["alert"])
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert len(rule["annotations"]["description"].strip()) >= 80, f"{rule['alert']}: say what to check"
        if "for" in rule:
            assert duration_seconds(rule["for"]) <= 3600, rule["alert"]
    assert len(names) == len(set(names)), "alert names must be unique"


def test_alerts_cover_queue_age_refusals_dead_letters_and_consumer_lag() -> None:
    used = {family_of(m) for rule in alert_rules() for m in parse_promql(rule["expr"]).metrics}
    assert {
        "ctx_compaction_queue_oldest_age_seconds",
        "ctx_budget_overflows",
        "ctx_events_rejected",
        "ctx_consumer_lag_events",
        "ctx_consumer_lag_jobs",
        "ctx_consumer_lag_threads",
    } <= used


def test_prometheus_rule_carries_exactly_the_alert_groups() -> None:
    # infra/prometheus/alerts.yaml is the single source; the PrometheusRule must not drift from it.
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text(encoding="utf-8"))
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["name"] == "ctxfleet-alerts"
    assert rule["spec"]["groups"] == load_alert_groups()
