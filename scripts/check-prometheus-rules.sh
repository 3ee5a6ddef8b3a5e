#!/usr/bin/env bash
# Checks deploy/prometheus/alerts.yml and deploy/grafana-dashboard.json:
#   - `promtool check rules` on the alerting rules;
#   - every alert has `for`, a severity (critical or warning), a summary, a description and a
#     `runbook` naming a section docs/operations.md has, and a unit test that fires it;
#   - `promtool test rules` on deploy/prometheus/alerts.test.yml (against a copy of the rules
#     without the description and runbook annotations: the tests name labels and summaries);
#   - every metric the rules and the dashboard's queries name is one the gateway exports, as
#     listed in deploy/prometheus/metric-names.txt (base names: a histogram's _bucket, _sum and
#     _count are its own), or one the rules record, or Prometheus's `up`;
#   - every dashboard query parses as PromQL: each is written, with Grafana's variables replaced
#     by values ($__rate_interval by 5m, $route by .*), into a rules file for `promtool check
#     rules`.
# promtool comes from Debian's prometheus package, installed here if missing (as in
# scripts/test.sh); PyYAML from PyPI where python3 has none. Runnable from any directory; exits
# non-zero naming every fault.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null 2>&1; then
  echo "installing promtool (Debian package prometheus)"
  (apt-get -o DPkg::Lock::Timeout=600 update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq prometheus \
      >/dev/null) || { echo "check-prometheus-rules.sh: FAILED to install promtool" >&2; exit 1; }
fi
if ! python3 -c 'import yaml' 2>/dev/null; then
  # A Debian system python refuses plain pip installs (PEP 668); retry with the override there.
  python3 -m pip install -q pyyaml 2>/dev/null \
    || python3 -m pip install -q --break-system-packages pyyaml \
    || { echo "check-prometheus-rules.sh: FAILED to install PyYAML" >&2; exit 1; }
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

promtool check rules deploy/prometheus/alerts.yml

# Writes $work/alerts.yml (the rules without description and runbook), $work/alerts.test.yml and
# $work/dashboard-rules.yml; prints every fault it finds and exits 1 after them.
python3 - "$work" <<'EOF'
import json, re, sys
import yaml

work = sys.argv[1]
RULES = "deploy/prometheus/alerts.yml"
TESTS = "deploy/prometheus/alerts.test.yml"
NAMES = "deploy/prometheus/metric-names.txt"
DASHBOARD = "deploy/grafana-dashboard.json"
OPERATIONS = "docs/operations.md"
SEVERITIES = {"critical", "warning"}
# Series Prometheus makes itself rather than scrapes.
PROMETHEUS_OWN = {"up"}
# Grafana's variables, and what a query is checked with in their place.
GRAFANA_VALUES = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}

faults = []

with open(NAMES) as f:
    listed = [line.strip() for line in f if line.strip()]
if listed != sorted(set(listed)):
    faults.append(f"{NAMES}: not sorted, or a name twice (LC_ALL=C sort -u)")
exported = set(listed)

# The sections of docs/operations.md, as GitHub names their anchors.
with open(OPERATIONS) as f:
    anchors = {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in f
        if re.match(r"#{1,6} ", line)
    }

KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "atan2", "inf", "nan", "start", "end",
}


def metric_names(expr):
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"#[^\n]*", " ", text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    for match in re.finditer(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        yield name


def check_names(expr, at, recorded):
    for name in metric_names(expr):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name in exported or base in exported or name in recorded or name in PROMETHEUS_OWN:
            continue
        faults.append(f"{at}: {name} is not a metric the gateway exports ({NAMES})")


# --- The rules ---------------------------------------------------------------------------------
with open(RULES) as f:
    rules = yaml.safe_load(f)
recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
alerts = []
for group in rules["groups"]:
    for rule in group["rules"]:
        name = rule.get("alert") or rule.get("record")
        at = f"{RULES}: {name}"
        check_names(rule["expr"], at, recorded)
        if "alert" not in rule:
            continue
        alerts.append(name)
        if "for" not in rule:
            faults.append(f"{at}: no `for:`")
        severity = rule.get("labels", {}).get("severity")
        if severity not in SEVERITIES:
            faults.append(f"{at}: severity {severity!r} is not one of {sorted(SEVERITIES)}")
        annotations = rule.get("annotations", {})
        for key in ("summary", "description", "runbook"):
            if not annotations.get(key):
                faults.append(f"{at}: no {key} annotation")
        runbook = annotations.get("runbook", "")
        page, _, anchor = runbook.partition("#")
        if runbook and (page != OPERATIONS or anchor not in anchors):
            faults.append(f"{at}: runbook {runbook} is no section of {OPERATIONS}")
        for key in ("description", "runbook"):
            annotations.pop(key, None)
if len(alerts) != len(set(alerts)):
    faults.append(f"{RULES}: an alert name used twice")
with open(f"{work}/alerts.yml", "w") as f:
    yaml.safe_dump(rules, f, sort_keys=False)

# --- Their tests -------------------------------------------------------------------------------
with open(TESTS) as f:
    tests = yaml.safe_load(f)
fired = {
    case["alertname"]
    for test in tests["tests"]
    for case in test.get("alert_rule_test", [])
    if case.get("exp_alerts")
}
for name in alerts:
    if name not in fired:
        faults.append(f"{TESTS}: no test fires {name}")
with open(f"{work}/alerts.test.yml", "w") as f:
    yaml.safe_dump(tests, f, sort_keys=False)

# --- The dashboard -----------------------------------------------------------------------------
with open(DASHBOARD) as f:
    dashboard = json.load(f)


def panels(items):
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def grafana_free(expr):
    def value(match):
        name = match.group(1) or match.group(2) or match.group(3)
        return GRAFANA_VALUES.get(name, ".*")
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", value, expr)


ids = [p.get("id") for p in panels(dashboard["panels"])]
if len(ids) != len(set(ids)):
    faults.append(f"{DASHBOARD}: two panels with one id")
queries = []
for panel in panels(dashboard["panels"]):
    for target in panel.get("targets", []):
        if "expr" not in target:
            continue
        at = f"{DASHBOARD}: panel {panel.get('id')} {panel.get('title')!r} query {target.get('refId')}"
        expr = grafana_free(target["expr"])
        check_names(expr, at, set())
        queries.append({
            "record": f"grafana_panel_{panel.get('id')}_{target.get('refId', 'A')}",
            "expr": expr,
        })
for variable in dashboard.get("templating", {}).get("list", []):
    query = variable.get("query")
    query = query.get("query", "") if isinstance(query, dict) else query or ""
    label_values = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query)
    if variable.get("type") == "query" and label_values:
        check_names(label_values.group(1), f"{DASHBOARD}: variable {variable['name']}", set())
if not queries:
    faults.append(f"{DASHBOARD}: no panel has a query")
with open(f"{work}/dashboard-rules.yml", "w") as f:
    yaml.safe_dump({"groups": [{"name": "dashboard", "rules": queries}]}, f, sort_keys=False)

for fault in faults:
    print(f"ERROR {fault}")
print(f"{len(alerts)} alerts, {len(recorded)} recording rules, {len(queries)} dashboard queries"
      f" checked against {len(exported)} exported metric names")
sys.exit(1 if faults else 0)
EOF

echo "dashboard queries:"
promtool check rules "$work/dashboard-rules.yml"
promtool test rules "$work/alerts.test.yml"
echo "check-prometheus-rules.sh: alerts.yml, its tests and the dashboard's queries passed"
