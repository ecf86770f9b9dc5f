"""Just enough PromQL to find the metric names a query reads, and what a scrape exports."""

import re

# Words in a query that are neither metrics nor functions (functions are followed by "(");
# group_left and group_right may come without a label list.
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "group_left", "group_right"}
GROUPING = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"


def metric_names(expr: str) -> set[str]:
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(GROUPING, "", expr)  # label lists of aggregations and joins
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range and subquery windows
    expr = re.sub(r"\boffset\s+-?[0-9a-z]+", "", expr)  # offset durations ("offset 15m")
    names = set()
    for word in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        is_call = expr[word.end() :].lstrip().startswith("(")
        if not is_call and word.group().lower() not in KEYWORDS:
            names.add(word.group())
    return names


def series_names(family_name: str, family_type: str) -> set[str]:
    """The names a query may use for one metric family, as Prometheus stores them."""
    if family_type == "counter":
        return {f"{family_name}_total"}
    if family_type == "histogram":
        return {f"{family_name}_{suffix}" for suffix in ("bucket", "sum", "count")}
    if family_type == "summary":
        return {family_name, f"{family_name}_sum", f"{family_name}_count"}
    return {family_name}


def dashboard_exprs(dashboard: dict) -> list[str]:
    """Every query of every panel, rows' nested panels included."""
    exprs = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            exprs += [t["expr"] for t in inner.get("targets", []) if t.get("expr")]
    return exprs
