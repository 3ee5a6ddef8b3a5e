#!/usr/bin/env python3
"""Fails when a configuration key has no row in the README's configuration reference.

The keys are the fields of every struct in src/config that derives serde's Deserialize (with its
`rename`s, without `skip`ped or `flatten`ed fields) and every enum's `tag`; a key is documented
when its name appears in backticks in the first column of a row of the table under
"## Configuration reference" (`[server] listen`, `methods`, `[routes.fence] header`, a section
such as `[routes.upstream_tls]`). Run by .ci/run.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = ROOT / "src" / "config"
README = ROOT / "README.md"

FIELD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?([a-z_][a-z0-9_]*)\s*:")
STRUCT = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?struct\s+(\w+)\s*\{")
TAG = re.compile(r'#\[serde\([^\]]*\btag\s*=\s*"([^"]+)"')
RENAME = re.compile(r'#\[serde\([^\]]*\brename\s*=\s*"([^"]+)"')
SKIPPED = re.compile(r"#\[serde\([^\]]*\b(skip|skip_deserializing|flatten)\b")


def config_keys():
    """(key, where) for every key the configuration files may hold."""
    keys = []
    for path in sorted(CONFIG.glob("*.rs")):
        lines = path.read_text().splitlines()
        derives = False
        struct = None
        depth = 0
        attributes = []
        for number, line in enumerate(lines, 1):
            stripped = line.strip()
            if stripped.startswith("#[cfg(test)]"):
                break
            if struct is None:
                if stripped.startswith("#[derive(") and "Deserialize" in stripped:
                    derives = True
                tag = TAG.search(stripped)
                if derives and tag:
                    keys.append((tag.group(1), f"{path.name}:{number}"))
                found = STRUCT.match(line)
                if found and derives:
                    struct, depth, attributes = found.group(1), 1, []
                elif stripped and not stripped.startswith(("#", "//")):
                    derives = False
                continue
            if depth == 1:
                if stripped.startswith("#["):
                    attributes.append(stripped)
                elif not stripped.startswith("//"):
                    field = FIELD.match(line)
                    if field:
                        if not any(SKIPPED.search(a) for a in attributes):
                            renamed = [RENAME.search(a) for a in attributes]
                            name = next((r.group(1) for r in renamed if r), field.group(1))
                            keys.append((name, f"{path.name}:{number} ({struct})"))
                        attributes = []
            depth += line.count("{") - line.count("}")
            if depth <= 0:
                struct, derives = None, False
    return keys


def documented_names():
    """Every name in backticks in the first column of the reference table."""
    text = README.read_text()
    start = text.index("## Configuration reference")
    end = text.index("\n## ", start + 1)
    names = set()
    for row in text[start:end].splitlines():
        if not row.startswith("| ") or row.startswith("|---"):
            continue
        first = row.split(" | ", 1)[0]
        for quoted in re.findall(r"`([^`]+)`", first):
            names.update(re.findall(r"[a-z_][a-z0-9_]*", quoted))
    return names


def main():
    keys = config_keys()
    if not keys:
        print("check-config-docs: no configuration keys found under src/config", file=sys.stderr)
        return 1
    names = documented_names()
    missing = [(key, where) for key, where in keys if key not in names]
    for key, where in missing:
        print(f"README configuration reference has no row for `{key}` ({where})", file=sys.stderr)
    if missing:
        return 1
    print(f"config docs: {len(keys)} keys, each in the README's configuration reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
