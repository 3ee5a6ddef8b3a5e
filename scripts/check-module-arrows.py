#!/usr/bin/env python3
"""Fails when two top-level modules of src/ depend on each other, directly or around a cycle.

Counts a dependency of module A on module B for every `crate::B` path in A's code (comments and
`#[cfg(test)]` blocks left out). `cargo modules dependencies --lib --no-externs --no-owns
--no-fns --no-traits --no-types --no-sysroot` draws the same arrows from the compiler's view;
this check needs nothing installed, so CI runs it on every change.
"""
import collections
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def code_of(text):
    text = text.split("#[cfg(test)]", 1)[0]
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def arrows():
    edges = collections.defaultdict(set)
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(folder, name)
            top = os.path.relpath(path, ROOT).split(os.sep)[0].removesuffix(".rs")
            if top in ("lib", "main"):
                continue
            with open(path, encoding="utf-8") as source:
                for other in re.findall(r"\bcrate::(\w+)", code_of(source.read())):
                    if other != top:
                        edges[top].add(other)
    return edges


def cycles(edges):
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in edges.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in list(edges):
        if node not in index:
            visit(node)
    return found


def main():
    edges = arrows()
    found = cycles(edges)
    count = sum(len(targets) for targets in edges.values())
    if found:
        for group in found:
            pairs = [f"{a} -> {b}" for a in group for b in sorted(edges[a]) if b in group]
            print("modules depending on each other: " + ", ".join(pairs))
        return 1
    print(f"module arrows: {count} between {len(edges)} modules, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
