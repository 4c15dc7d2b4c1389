#!/usr/bin/env python3
"""Checks that every Fulcrum metric a dashboard or rule file queries is one
that Fulcrum exports.

usage: check_metric_names.py EXPORTED_NAMES_FILE FILE...

EXPORTED_NAMES_FILE has one metric family name per line (from the `# TYPE`
lines of live /metrics endpoints). Each FILE is a Grafana dashboard (JSON:
every "expr" is checked) or a Prometheus rule / rule-test file (YAML: every
`expr:` line is checked). Only names starting with fulcrum_ or grpc_ are
Fulcrum's; histogram series (_bucket, _sum, _count) map to their family.
Exit 0 when all are exported, 1 with the missing names listed otherwise.
"""
import json
import re
import sys

NAME = re.compile(r"\b((?:fulcrum|grpc)_[a-zA-Z0-9_:]*)")
# Label matchers and grouping clauses name labels, not metrics.
LABELS = re.compile(r"\{[^}]*\}|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def family(name, exported):
    if name in exported:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in exported:
            return name[: -len(suffix)]
    return None


def exprs_of_json(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from exprs_of_json(value)
    elif isinstance(node, list):
        for item in node:
            yield from exprs_of_json(item)


def exprs_of_yaml(text):
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("expr:"):
            yield stripped[len("expr:"):]


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    exported = {line.strip() for line in open(sys.argv[1]) if line.strip()}
    missing = {}
    checked = 0
    for path in sys.argv[2:]:
        text = open(path).read()
        exprs = exprs_of_json(json.loads(text)) if path.endswith(".json") else exprs_of_yaml(text)
        for expr in exprs:
            for name in NAME.findall(LABELS.sub(" ", expr)):
                checked += 1
                if family(name, exported) is None:
                    missing.setdefault(name, set()).add(path)
    if checked == 0:
        print("no Fulcrum metric found in the files: nothing was checked", file=sys.stderr)
        return 1
    for name, paths in sorted(missing.items()):
        print(f"{name}: queried in {', '.join(sorted(paths))} but not exported", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
