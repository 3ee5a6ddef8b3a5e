#!/usr/bin/env python3
"""Fails when modules of src/ depend on each other, directly or around a cycle, at any level.

At the top level the nodes are the crate's modules (`store`, `proxy`, ...); inside every folder
they are that folder's own modules (`store/etcd/advance.rs` and `store/etcd/identity.rs` are
nodes of `store/etcd`). A file depends on every module its paths name (`crate::a::b`,
`super::x`, `self::y`, `use` trees with braces expanded; comments and what follows the first
`#[cfg(test)]` left out); the arrow is drawn between the two siblings under the deepest folder
both lie in. A child naming its own folder's module (`super::Item` in mod.rs) is ownership, not
an arrow. `cargo modules dependencies --lib --no-externs --no-owns --no-fns --no-traits
--no-types --no-sysroot` draws the same arrows from the compiler's view; this check needs nothing
installed, so CI runs it on every change.
"""
import collections
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
# What a module path can start with.
ANCHORS = ("crate", "super", "self")


def code_of(text):
    text = text.split("#[cfg(test)]", 1)[0]
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def module_of(path):
    """The module path of a source file: src/store/etcd/mod.rs -> ("store", "etcd")."""
    parts = os.path.relpath(path, ROOT).removesuffix(".rs").split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    if parts in (["lib"], ["main"]):
        return ()
    return tuple(parts)


def expand_use(tree):
    """The flat paths of one `use` tree: `a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e."""
    tree = re.sub(r"\s+", "", tree)
    open_at = tree.find("{")
    if open_at < 0:
        return [tree.split(" as ")[0]]
    prefix, inner = tree[:open_at], tree[open_at + 1 : tree.rfind("}")]
    parts, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    return [path for part in parts if part for path in expand_use(prefix + part)]


def named_paths(code):
    """Every path starting at `crate`, `super` or `self` that the code names, as segments."""
    paths = []
    for tree in re.findall(r"\buse\s+([^;]+);", code):
        paths.extend(expand_use(tree))
    code = re.sub(r"\buse\s+[^;]+;", "", code)
    paths.extend(re.findall(r"\b(?:crate|super|self)(?:::\w+)+", code))
    return [p.split("::") for p in paths if p.split("::")[0] in ANCHORS]


def resolve(segments, here, is_folder_module, modules):
    """The module `segments` (written in the file of module `here`) lands in: the longest known
    module prefix of the absolute path."""
    if segments[0] == "crate":
        base, rest = (), segments[1:]
    else:
        # `self` in a folder's mod.rs is the folder; in a file it is the file's module.
        base, rest = here, segments
        if rest[0] == "self":
            rest = rest[1:]
        # `super` in mod.rs is the folder's parent; in x.rs it is x's parent as well.
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    target = base
    for segment in rest:
        if target + (segment,) in modules:
            target += (segment,)
        else:
            break
    return target


def arrows():
    """Arrows between sibling modules, by the folder (module path) they are siblings in."""
    files = []
    for folder, _, names in os.walk(ROOT):
        files += [os.path.join(folder, n) for n in names if n.endswith(".rs")]
    modules = {module_of(path) for path in files}
    edges = collections.defaultdict(lambda: collections.defaultdict(set))
    for path in files:
        here = module_of(path)
        if not here:
            continue
        with open(path, encoding="utf-8") as source:
            code = code_of(source.read())
        is_folder_module = path.endswith(os.sep + "mod.rs")
        for segments in named_paths(code):
            there = resolve(segments, here, is_folder_module, modules)
            common = 0
            while common < min(len(here), len(there)) and here[common] == there[common]:
                common += 1
            # Within itself, or naming a module it lies in (ownership): no arrow.
            if common == len(here) or common == len(there):
                continue
            folder = here[:common]
            edges[folder][here[common]].add(there[common])
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
    sys.setrecursionlimit(10_000)
    by_folder = arrows()
    failed = False
    count = 0
    for folder in sorted(by_folder):
        edges = by_folder[folder]
        count += sum(len(targets) for targets in edges.values())
        where = "src/" + "/".join(folder) if folder else "src"
        for group in cycles(edges):
            failed = True
            pairs = [f"{a} -> {b}" for a in group for b in sorted(edges[a]) if b in group]
            print(f"{where}: modules depending on each other: " + ", ".join(pairs))
    if failed:
        return 1
    top = sum(len(t) for t in by_folder[()].values())
    print(
        f"module arrows: {top} between top-level modules, {count} in all across "
        f"{len(by_folder)} folders, no cycle"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
