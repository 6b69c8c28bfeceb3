"""Import circles between the files of a Rust crate.

Usage: python3 scripts/import_circles.py CRATE_DIR [CRATE_DIR ...]

For each crate (a folder holding ``src/``), every ``.rs`` file under
``src/`` is a module: ``src/lib.rs`` / ``src/main.rs`` the root,
``src/a.rs`` and ``src/a/mod.rs`` the module ``a``, ``src/a/b.rs`` the
module ``a::b``. A file imports another when its code (comments and
strings left out) names a path through ``crate::``, ``super::`` or
``self::`` (``use`` lines, groups ``{…}`` included, and paths written
inline) that leads into the other file's module; a name the module only
re-exports (``pub use``) leads on to where it is defined, and a
re-export is not an import of the file that makes it (a folder's
``mod.rs`` showing its children's items uses none of them). ``super``
inside an inline ``mod x { … }`` (a test module) is the file's own
module. ``mod x;`` declarations are not imports, nor is a module's use of its
own descendants (``a/mod.rs`` using ``a/b.rs``: the folder is one room;
``a/b.rs`` using ``a/mod.rs`` is an arrow, and two siblings using each
other are a circle).

Prints each circle (a set of two or more files that reach each other) as
``CIRCLE: a.rs -> b.rs (Name) -> a.rs`` and exits 1 when there is one.
"""

from __future__ import annotations

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(text: str) -> str:
    """The code without comments, strings and char literals (same lines)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not re.match(r"\w", text[i - 1])):
            m = re.match(r'r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + len(m.group(0)))
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):
            m = re.match(r"'(\\.|[^\\'])'", text[i:])
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand(prefix: str, body: str) -> list[tuple[str, str]]:
    """The paths of a use tree and the names they bind:
    ``a::{b, c::{d as e}}`` -> (a::b, b), (a::c::d, e)."""
    body = body.strip()
    if "{" not in body:
        path, _, alias = body.partition(" as ")
        path = re.sub(r"\s+", "", path)
        if not path:
            return []
        return [(prefix + path, alias.strip() or path.rsplit("::", 1)[-1])]
    head, rest = body.split("{", 1)
    inner = rest[: rest.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    paths = []
    for p in parts:
        paths += expand(prefix + re.sub(r"\s+", "", head), p)
    return paths


class Crate:
    def __init__(self, root: str):
        self.root = root
        self.files: dict[tuple, str] = {}
        src = os.path.join(root, "src")
        for dirpath, _, names in os.walk(src):
            for name in names:
                if not name.endswith(".rs"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), src)
                parts = rel[:-3].split(os.sep)
                if parts in (["lib"], ["main"]):
                    mod = ()
                elif parts[-1] == "mod":
                    mod = tuple(parts[:-1])
                else:
                    mod = tuple(parts)
                    if os.path.dirname(rel) == "bin":
                        continue  # a binary is its own crate
                self.files.setdefault(mod, os.path.join(src, rel))
        self.code = {m: strip(open(f, encoding="utf-8").read()) for m, f in self.files.items()}
        self.reexports = {m: self._reexports(m) for m in self.files}

    def _uses(self, mod: tuple):
        """(is_pub, path, name bound, scope) for each path a file's use
        lines name."""
        code = self.code[mod]
        for m in re.finditer(r"(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", code):
            scope = self._scope(mod, code, m.start())
            for path, name in expand("", m.group(2)):
                yield bool(m.group(1)), path, name, scope

    def _scope(self, mod: tuple, code: str, pos: int) -> tuple:
        """The module a position of a file is in (inline `mod x {` blocks)."""
        stack, depth = [], 0
        for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{|[{}]", code[:pos]):
            tok = m.group(0)
            if tok.startswith("mod"):
                depth += 1
                stack.append((m.group(1), depth))
            elif tok == "{":
                depth += 1
            else:
                if stack and stack[-1][1] == depth:
                    stack.pop()
                depth -= 1
        return mod + tuple(name for name, _ in stack)

    def _reexports(self, mod: tuple) -> dict[str, str]:
        out = {}
        for is_pub, path, name, scope in self._uses(mod):
            if is_pub and scope == mod and name not in ("*", "self"):
                out[name] = path
        return out

    def absolute(self, scope: tuple, path: str) -> list[str] | None:
        segs = path.split("::")
        if segs[0] == "crate":
            base, segs = [], segs[1:]
        elif segs[0] in ("super", "self"):
            base = list(scope)
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super" and base:
                    base.pop()
                segs = segs[1:]
        elif tuple(scope) + (segs[0],) in self.files:
            base = list(scope)  # a path through a child module: `child::X`
        else:
            return None
        return base + segs

    def resolve(self, segs: list[str], seen=()) -> tuple[tuple, str] | None:
        """The file a path leads into, and the name taken there."""
        mod = ()
        i = 0
        while i < len(segs) and mod + (segs[i],) in self.files:
            mod += (segs[i],)
            i += 1
        name = segs[i] if i < len(segs) else ""
        if name and name in self.reexports.get(mod, {}) and (mod, name) not in seen:
            target = self.absolute(mod, self.reexports[mod][name])
            if target:
                inner = self.resolve(target + segs[i + 1:], seen + ((mod, name),))
                if inner:
                    return inner
        return mod, name

    def edges(self) -> dict[tuple, dict[tuple, set]]:
        out: dict[tuple, dict[tuple, set]] = {m: {} for m in self.files}
        for mod, code in self.code.items():
            refs = []
            for is_pub, path, _, scope in self._uses(mod):
                if not is_pub:  # a re-export is the module's face, not its use
                    refs.append((scope, path))
            no_use = re.sub(r"(pub(?:\([^)]*\))?\s+)?use\s+[^;]+;", "", code)
            for m in re.finditer(r"\b(?:crate|super|self)(?:::" + IDENT + r")+", no_use):
                refs.append((self._scope(mod, code, m.start()), m.group(0)))
            for scope, path in refs:
                segs = self.absolute(scope, path)
                if not segs:
                    continue
                hit = self.resolve(segs)
                # A module using its own children's items is the folder
                # at work, not an import between rooms.
                if hit and hit[0][: len(mod)] != mod:
                    out[mod].setdefault(hit[0], set()).add(hit[1] or "*")
        return out


def circles(crate: Crate) -> list[list[tuple]]:
    """Strongly connected components of two or more files (Tarjan)."""
    graph = {m: list(t) for m, t in crate.edges().items()}
    index, low, on, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    bad = 0
    for root in sys.argv[1:]:
        crate = Crate(root)
        edges = crate.edges()
        for comp in circles(crate):
            bad += 1
            names = [crate.files[m] for m in comp]
            ties = []
            for a in comp:
                for b in comp:
                    if b in edges[a]:
                        ties.append(f"{crate.files[a]} -> {crate.files[b]} ({', '.join(sorted(edges[a][b]))})")
            print(f"CIRCLE: {len(comp)} files import each other: {', '.join(names)}")
            for t in ties:
                print(f"  {t}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
