#!/usr/bin/env python3
"""module-graph.py -- the library crate's module import graph (docs/design.md, "Module graph").

    scripts/module-graph.py [SRC] [--out DIR] [--check]

SRC is the library crate's source directory (default: the repository's
src/); its crate root is SRC/lib.rs. The script follows the
`mod` declarations from there and reads, in every module, the `use`
declarations and the paths in code that start with `crate::`, `super::`,
`self::`, a child module or a name the module imported; each path is
resolved through `use` re-exports to the module that defines what it names.
Test code (items under #[cfg(test)]), comments, string literals and the
paths of visibilities (`pub(in crate::a)`) are left
out; the crate root (lib.rs, the public facade) is not a node.

It draws the graph at the level that matters: the top-level modules, and
engine's parts one level down (engine/source, engine/link, ... and each of
engine's own files). It prints, and with --check fails (exit 1) on:

  - cycles among the drawn modules (engine/source <-> engine/link, ...);
  - cycles among engine's files (engine/source/transfer <-> chunks, ...);
  - arrows that point up the layers (LAYERS below: wire -> verbs, engine
    -> ffi, ...), each with the file, line and path that makes it;
  - cycles among the files of the other crates beside SRC (OTHER_CRATES:
    the C library's capi/src, the CLI's cli/src), read the same way.

Without --check it writes DIR/module-graph.dot (DIR: the docs/ beside SRC)
and, when Graphviz's dot is installed, DIR/module-graph.svg: arrows in a
cycle orange, arrows pointing up red, arrows made of re-exports alone
dashed. Python 3 standard library only.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

# The layers, bottom up: an arrow may point down or sideways, never up.
# error, bitmap and logging are the base every layer may use; fabric (the
# planner), recording (built on the engine) and doctor (the host check)
# are leaves beside the layers, which only the C API above them may use. A
# top-level module missing here is reported and left unchecked.
LAYERS = {
    "error": 0,
    "bitmap": 0,
    "logging": 0,
    "wire": 1,
    "verbs": 2,
    "host": 3,
    "engine": 4,
    "fabric": 5,
    "recording": 5,
    "doctor": 5,
    "ffi": 6,
    "capi": 6,
}
# Top-level modules drawn as their parts, one level down.
EXPANDED = ("engine",)
# Files whose cycles count (the engine's: no circle of imports inside it).
ACYCLIC = "engine"
# The other crates, beside SRC's parent: their source directory and crate
# root. No circle of imports among their files either.
OTHER_CRATES = (("capi/src", "lib.rs"), ("cli/src", "main.rs"))

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
ATTRIBUTE = re.compile(r"\s*#\s*!?\s*\[")
MOD_DECL = re.compile(r"\b(?:pub\s*(?:\([^)]*\)\s*)?)?mod\s+(" + IDENT + r")\s*([;{])")
USE_DECL = re.compile(r"\b(?:pub\s*(?:\([^)]*\)\s*)?)?use\s+([^;]+);")
ITEM = re.compile(r"\b(?:struct|enum|union|trait|type|fn|const|static|macro_rules\s*!)\s+(" + IDENT + r")")
VISIBILITY_PATH = re.compile(r"\bpub\s*\(\s*in\s+[^)]*\)")
PATH = re.compile(r"(?<![A-Za-z0-9_:$])(\$?" + IDENT + r")((?:\s*::\s*" + IDENT + r")+)")


def strip(text):
    """Comments, string and char literals blanked out (newlines kept, so
    offsets keep their line numbers)."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        out.append(re.sub(r"[^\n]", " ", s))

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(text[i:j])
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(text[i:j])
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i:i + 260])) and (i == 0 or not re.match(r"\w", text[i - 1])):
            end = text.find('"' + m.group(1), i + m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            blank(text[i:j])
            i = j
        elif c == '"' or (c == "b" and text.startswith('b"', i) and (i == 0 or not re.match(r"\w", text[i - 1]))):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(text[i:j + 1])
            i = j + 1
        elif c == "'" and (m := re.match(r"'(?:[^'\\\n]|\\(?:[nrt0\\'\"]|x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}))'", text[i:])):
            blank(m.group(0))
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(text, open_brace):
    """The offset just past the brace that closes the one at open_brace."""
    depth = 0
    for j in range(open_brace, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def bracket_end(text, open_bracket):
    """The offset just past the bracket that closes the `[` at open_bracket."""
    depth = 0
    for j in range(open_bracket, len(text)):
        depth += (text[j] == "[") - (text[j] == "]")
        if depth == 0:
            return j + 1
    return len(text)


def item_end(text, start):
    """The offset just past the item starting at start: its `;` or its block."""
    depth = 0
    for j in range(start, len(text)):
        if text[j] in "([":
            depth += 1
        elif text[j] in ")]":
            depth -= 1
        elif depth == 0 and text[j] == ";":
            return j + 1
        elif depth == 0 and text[j] == "{":
            return block_end(text, j)
    return len(text)


def without_tests(text):
    """The text with every item under #[cfg(test)] blanked out."""
    while m := CFG_TEST.search(text):
        start = m.end()
        while a := ATTRIBUTE.match(text, start):  # further attributes of the same item
            start = bracket_end(text, a.end() - 1)
        end = item_end(text, start)
        text = text[:m.start()] + re.sub(r"[^\n]", " ", text[m.start():end]) + text[end:]
    return text


def use_paths(tree, prefix=()):
    """The paths of a use tree (`a::{b, c::d as e, f::*}`), as (segments,
    the name it binds, or None for a glob)."""
    tree = re.sub(r"\s*(::|[{},])\s*", r"\1", tree.strip())
    tree = tree[2:] if tree.startswith("::") else tree
    brace = tree.find("{")
    if brace < 0:
        path, _, alias = tree.partition(" as ")
        segs = prefix + tuple(s for s in path.split("::") if s)
        if segs[-1:] == ("*",):
            return [(segs[:-1], None)]
        if segs[-1:] == ("self",):  # `a::{self}` binds a itself
            segs = segs[:-1]
        return [(segs, alias.strip() or segs[-1])] if segs else []
    head = prefix + tuple(s for s in tree[:brace].split("::") if s)
    out, depth, item = [], 0, ""
    for ch in tree[brace + 1:block_end(tree, brace) - 1] + ",":
        if ch == "," and depth == 0:
            if item:
                out += use_paths(item, head)
            item = ""
            continue
        depth += (ch == "{") - (ch == "}")
        item += ch
    return out


class Module:
    """A module: a file, or an inline `mod NAME { ... }` of one."""

    def __init__(self, path, file, parent):
        self.path = path  # segments from the crate root: () is the root
        self.file = file  # the file it is in
        self.parent = parent
        self.owner = self if parent is None or parent.file != file else parent.owner  # the file's module
        self.children = {}
        self.bindings = {}  # name -> segments of the `use` that binds it
        self.globs = []  # segments of `use ...::*`
        self.items = set()
        self.refs = []  # (segments, offset, whether a re-export): every path this module names

    def name(self):
        return "/".join(self.path)


def load(src, root_name="lib.rs"):
    """The module tree of the crate whose root is SRC/ROOT_NAME, with each module's uses and paths."""
    modules = []

    def parse(module, text, offset, child_dir):
        modules.append(module)
        while m := MOD_DECL.search(text):  # inline modules first, and declarations of files
            name = m.group(1)
            if name in module.children:  # a second, cfg'd declaration of the same module
                end = m.end() if m.group(2) == ";" else block_end(text, m.end() - 1)
            elif m.group(2) == "{":
                end = block_end(text, m.end() - 1)
                inline = Module(module.path + (name,), module.file, module)
                module.children[name] = inline
                parse(inline, text[m.end():end - 1], offset + m.end(), os.path.join(child_dir, name))
            else:
                end = m.end()
                for candidate in (os.path.join(child_dir, name + ".rs"), os.path.join(child_dir, name, "mod.rs")):
                    if os.path.isfile(candidate):
                        child = Module(module.path + (name,), candidate, module)
                        module.children[name] = child
                        with open(candidate, encoding="utf-8") as f:
                            child_text = without_tests(strip(f.read()))
                        child_own_dir = os.path.dirname(candidate) if candidate.endswith("mod.rs") else candidate[:-3]
                        parse(child, child_text, 0, child_own_dir)
                        break
                else:
                    sys.exit(f"module-graph: no file for `mod {name};` in {module.file}")
            text = text[:m.start()] + re.sub(r"[^\n]", " ", text[m.start():end]) + text[end:]
        for m in USE_DECL.finditer(text):
            reexport = m.group(0).startswith("pub")
            for segs, name in use_paths(m.group(1)):
                module.refs.append((segs, offset + m.start(), reexport))
                if name is None:
                    module.globs.append(segs)
                elif name != "_":
                    module.bindings[name] = segs
        text = USE_DECL.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
        # A visibility's path (`pub(in crate::a)`) names where an item may be seen, not what it uses.
        text = VISIBILITY_PATH.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
        module.items.update(ITEM.findall(text))
        for m in PATH.finditer(text):
            segs = (m.group(1),) + tuple(s.strip() for s in m.group(2).split("::")[1:])
            module.refs.append((segs, offset + m.start(), False))

    root_file = os.path.join(src, root_name)
    if not os.path.isfile(root_file):
        sys.exit(f"module-graph: no crate root {root_file}")
    with open(root_file, encoding="utf-8") as f:
        parse(Module((), root_file, None), without_tests(strip(f.read())), 0, src)
    return modules


def resolve(module, segs, seen=frozenset()):
    """The module that defines what segs names from module, or None (another crate, a local name)."""
    first, rest = segs[0], segs[1:]
    if first in ("crate", "$crate"):
        current = module
        while current.parent:
            current = current.parent
    elif first == "self":
        current = module
    elif first == "super":
        current = module.parent
        while rest[:1] == ("super",):
            current, rest = current.parent, rest[1:]
    elif first in module.children:
        current, rest = module, segs
    elif first in module.bindings and (module, first) not in seen:
        target = resolve(module, module.bindings[first], seen | {(module, first)})
        if target is None:
            return None
        current = target
    else:
        return None
    for seg in rest:
        if seg in current.children:
            current = current.children[seg]
        elif seg in current.bindings and (current, seg) not in seen:
            target = resolve(current, current.bindings[seg], seen | {(current, seg)})
            if target is None:
                return current
            current = target
        else:
            for glob in current.globs:
                source = resolve(current, glob, seen)
                if source and (seg in source.children or seg in source.bindings or seg in source.items):
                    return resolve(source, (seg,), seen) or source
            return current
    return current


def file_edges(modules):
    """{(from, to): Import} between file modules (the root left out)."""
    edges = {}
    for module in modules:
        source = module.owner
        if not source.path:
            continue
        with open(module.file, encoding="utf-8") as f:
            line_starts = [m.end() for m in re.finditer("\n", f.read())]
        for segs, offset, reexport in module.refs:
            target = resolve(module, segs)
            target = target and target.owner
            if target is None or target is source or not target.path:
                continue
            edge = edges.setdefault((source.name(), target.name()), Import())
            edge.add(module.file, 1 + sum(1 for start in line_starts if start <= offset), "::".join(segs), reexport)
    return edges


class Import:
    """The references behind one arrow: the first of them, and whether all are re-exports."""

    def __init__(self):
        self.where = None
        self.reexport_only = True

    def add(self, file, line, path, reexport):
        # A use counts before a re-export as the example.
        if self.where is None or (self.reexport_only and not reexport):
            self.where = f"{file}:{line}: {path}"
        self.reexport_only &= reexport

    def merge(self, other):
        if self.where is None or (self.reexport_only and not other.reexport_only):
            self.where = other.where
        self.reexport_only &= other.reexport_only
        return self


def drawn(name):
    """The node a module is drawn as: its top-level module, or for EXPANDED ones its part."""
    parts = name.split("/")
    return "/".join(parts[:2]) if parts[0] in EXPANDED else parts[0]


def layer(node):
    return LAYERS.get(node.split("/")[0])


def components(nodes, edges):
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    succ = {n: sorted(b for a, b in edges if a == n) for n in nodes}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for n in sorted(nodes):
        if n not in index:
            visit(n)
    return sorted(found)


def shortest_path(start, goal, members, edges):
    """A shortest path from start to goal through members (breadth-first), or None."""
    paths, queue = {start: [start]}, [start]
    while queue:
        n = queue.pop(0)
        if n == goal:
            return paths[n]
        for a, b in sorted(edges):
            if a == n and b in members and b not in paths:
                paths[b] = paths[n] + [b]
                queue.append(b)
    return None


def report_cycles(title, nodes, edges, root):
    """Prints the cycles among nodes: per component, a shortest cycle through each of its
    arrows (so every mutual import shows), each arrow with the reference that makes it.
    Returns the components."""
    found = components(nodes, edges)
    print(f"module-graph: {title}: {len(found) or 'none'}")
    for component in found:
        members = set(component)
        print(f"  {len(component)} modules in a circle: {', '.join(component)}")
        cycles = set()
        for a, b in sorted(edges):
            if a in members and b in members:
                cycle = [a] + shortest_path(b, a, members, edges)
                turn = cycle.index(min(cycle[:-1]))  # one rotation per cycle
                cycles.add(tuple(cycle[turn:-1] + cycle[:turn + 1]))
        shown = set()
        for cycle in sorted(cycles, key=lambda c: (len(c), c)):
            print(f"    {' -> '.join(cycle)}")
            for hop in zip(cycle, cycle[1:]):
                if hop not in shown:
                    shown.add(hop)
                    edge = edges[hop]
                    print(f"      {hop[0]} -> {hop[1]}: {os.path.relpath(edge.where, root)}"
                          + (" (re-exports only)" if edge.reexport_only else ""))
    return found


def dot_source(nodes, edges, in_cycle, upward):
    """Graphviz source: the layers top (C API) to bottom (base), EXPANDED modules as
    clusters of their parts. Arrows between a cluster and an outside module are drawn
    once, into or out of the cluster, unless they are in a cycle or point up. Arrows
    made of re-exports only (`pub use`) are dashed."""
    lines = [
        "// The library's module import graph, drawn by scripts/module-graph.py (docs/design.md,",
        "// \"Module graph\"). An arrow: the module at its tail names something of the one at its head.",
        "digraph modules {",
        '  graph [rankdir=TB, compound=true, fontname="sans-serif", fontsize=11, nodesep=0.25, ranksep=0.4];',
        '  node [shape=box, style="rounded,filled", fillcolor=white, fontname="sans-serif", fontsize=10, height=0.3];',
        '  edge [color="#666666", arrowsize=0.6];',
    ]
    top, bottom = {}, {}  # per layer: the node the layer above ends on, the node the layer below starts at
    for expanded in EXPANDED:
        parts = sorted(n for n in nodes if n.split("/")[0] == expanded)
        if not parts:
            continue
        top[expanded], bottom[expanded] = f"{expanded}:top", f"{expanded}:bottom"
        lines.append(f'  subgraph "cluster_{expanded}" {{')
        lines.append(f'    label="{expanded}/"; labeljust=l; style="rounded,filled"; fillcolor="#f4f4f4"; '
                     'color="#999999";')
        lines.append(f'    "{top[expanded]}" [style=invis, label="", width=0, height=0];')
        lines += [f'    "{n}" [label="{n.split("/", 1)[1] if "/" in n else "mod.rs"}"];' for n in parts]
        lines.append(f'    "{bottom[expanded]}" [style=invis, label="", width=0, height=0];')
        lines += [f'    "{top[expanded]}" -> "{n}" -> "{bottom[expanded]}" [style=invis];' for n in parts]
        lines.append("  }")
    outside = sorted(n for n in nodes if n.split("/")[0] not in EXPANDED)
    lines += [f'  "{n}";' for n in outside]
    by_layer = {}
    for n in outside + sorted(top):
        by_layer.setdefault(layer(n), []).append(n)
    by_layer.pop(None, None)
    for rank, members in sorted(by_layer.items()):
        same = [n for n in members if n not in top]
        if len(same) > 1:
            lines.append("  { rank=same; " + " ".join(f'"{n}";' for n in same) + " }")
    ranks = sorted(by_layer, reverse=True)
    for upper, lower in zip(ranks, ranks[1:]):  # the layers stacked in order
        a, b = by_layer[upper][0], by_layer[lower][0]
        lines.append(f'  "{bottom.get(a, a)}" -> "{top.get(b, b)}" [style=invis];')
    collapsed = {}
    for (a, b), edge in sorted(edges.items()):
        style = []
        if (a, b) in upward:
            style.append('color=red, penwidth=2, label="up", fontcolor=red')
        elif (a, b) in in_cycle:
            style.append("color=orange, penwidth=1.5")
        else:
            ca, cb = a.split("/")[0], b.split("/")[0]
            if (ca in top) != (cb in top):
                key = (bottom.get(ca, a), top.get(cb, b), ca if ca in top else None, cb if cb in top else None)
                collapsed[key] = collapsed.get(key, Import()).merge(edge)
                continue
        if edge.reexport_only:
            style.append("style=dashed")
        lines.append(f'  "{a}" -> "{b}"' + (f" [{', '.join(style)}]" if style else "") + ";")
    for (a, b, tail, head), edge in sorted(collapsed.items(), key=lambda kv: kv[0][:2]):
        style = ([f'ltail="cluster_{tail}"'] if tail else []) + ([f'lhead="cluster_{head}"'] if head else [])
        if edge.reexport_only:
            style.append("style=dashed")
        lines.append(f'  "{a}" -> "{b}" [{", ".join(style)}];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", nargs="?", default=os.path.join(here, "..", "src"),
                        help="the library crate's source directory (default: src)")
    parser.add_argument("--out", help="where to write module-graph.dot and .svg (default: docs beside SRC)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 on a cycle inside the engine or another crate, "
                        "or an arrow pointing up")
    args = parser.parse_args()
    src = os.path.normpath(os.path.abspath(args.src))
    root = os.path.dirname(src)
    out = args.out or os.path.join(root, "docs")

    modules = load(src)
    edges = file_edges(modules)
    files = {m.owner.name() for m in modules if m.owner.path}
    nodes = {drawn(n) for n in files}
    drawn_edges = {}
    for (a, b), edge in sorted(edges.items()):
        if drawn(a) != drawn(b):
            drawn_edges.setdefault((drawn(a), drawn(b)), Import()).merge(edge)
    print(f"module-graph: {os.path.relpath(src)}: {len(files)} modules, {len(edges)} imports between them; "
          f"drawn: {len(nodes)} modules, {len(drawn_edges)} arrows")
    unranked = sorted({n.split("/")[0] for n in nodes if layer(n) is None})
    if unranked:
        print(f"module-graph: in no layer, unchecked (add them to LAYERS): {', '.join(unranked)}")

    drawn_cycles = report_cycles("cycles among the drawn modules", nodes, drawn_edges, root)
    engine_files = {n for n in files if n.split("/")[0] == ACYCLIC}
    file_cycles = report_cycles(f"cycles among {ACYCLIC}'s files", engine_files,
                                {e: i for e, i in edges.items() if e[0] in engine_files and e[1] in engine_files},
                                root)
    in_cycle = {(a, b) for a, b in drawn_edges for c in drawn_cycles if a in c and b in c}
    upward = {(a, b) for a, b in drawn_edges
              if layer(a) is not None and layer(b) is not None and layer(a) < layer(b)}
    print(f"module-graph: arrows pointing up the layers: {len(upward) or 'none'}")
    for a, b in sorted(upward):
        print(f"  {a} -> {b}: {os.path.relpath(drawn_edges[(a, b)].where, root)}")
    other_cycles = []
    for crate_src, crate_root in OTHER_CRATES:
        crate_src = os.path.join(root, crate_src)
        if os.path.isfile(os.path.join(crate_src, crate_root)):
            crate_edges = file_edges(load(crate_src, crate_root))
            crate_files = {n for edge in crate_edges for n in edge}
            other_cycles += report_cycles(f"cycles among {os.path.relpath(crate_src, root)}'s files", crate_files,
                                          crate_edges, root)

    if args.check:
        problems = len(drawn_cycles) + len(file_cycles) + len(upward) + len(other_cycles)
        print(f"module-graph: --check: {'FAIL' if problems else 'OK'}")
        return 1 if problems else 0
    os.makedirs(out, exist_ok=True)
    dot_file = os.path.join(out, "module-graph.dot")
    with open(dot_file, "w", encoding="utf-8") as f:
        f.write(dot_source(nodes, drawn_edges, in_cycle, upward))
    print(f"module-graph: wrote {os.path.relpath(dot_file)}")
    if shutil.which("dot"):
        svg_file = os.path.join(out, "module-graph.svg")
        subprocess.run(["dot", "-Tsvg", "-o", svg_file, dot_file], check=True)
        print(f"module-graph: wrote {os.path.relpath(svg_file)}")
    else:
        print("module-graph: Graphviz's dot is not installed (apt-get install graphviz): no SVG")
    return 0


if __name__ == "__main__":
    sys.exit(main())
