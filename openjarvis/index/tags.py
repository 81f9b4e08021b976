"""Per-file extraction: ``(path, bytes, language) -> Extraction`` (tags and chunks), pure.

Definitions and references come from tree-sitter queries in ``queries/<language>.scm`` (package
data). A query marks a definition node ``@definition.<kind>`` with its name ``@name``, and a
reference name ``@reference.<kind>`` (call, import, type, use). Definitions are nested by their
byte ranges to give qualified names (``Class.method``); a function directly inside a class-like
definition becomes a method.

Chunks are what full-text search ranks. They follow definitions: a definition that fits the size
cap is one chunk; a longer one is split into its nested definitions, or else into windows of
whole lines, each repeating the definition's signature as a header. Text between definitions
becomes its own chunks. Files in other languages (Markdown, TOML, YAML, JSON, any text) and files
that fail to parse become plain line windows; the parse error is recorded, never raised.

Grammars come bundled in ``tree-sitter-language-pack==0.13.0`` (no network at parse time).

Example::

    ex = extract("app.py", b"class A:\\n    def run(self):\\n        go()\\n")
    [t.qualname for t in ex.definitions]  # ["A", "A.run"]
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Any

#: File suffix -> tree-sitter language name in the grammar pack.
CODE_LANGUAGES: dict[str, str] = {
    ".py": "python", ".pyi": "python",
    ".js": "javascript", ".jsx": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "tsx",
    ".go": "go", ".rs": "rust", ".java": "java",
    ".c": "c", ".h": "c",
    ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp", ".hxx": "cpp",
    ".cs": "csharp", ".rb": "ruby", ".php": "php",
    ".sh": "bash", ".bash": "bash", ".lua": "lua",
}  # fmt: skip

#: Suffixes indexed as plain text chunks under a named language.
TEXT_LANGUAGES: dict[str, str] = {
    ".md": "markdown", ".markdown": "markdown", ".toml": "toml",
    ".yaml": "yaml", ".yml": "yaml", ".json": "json",
}  # fmt: skip

# Chunking limits: a chunk never exceeds either; a single longer line is its own chunk.
CHUNK_MAX_LINES = 60
CHUNK_MAX_CHARS = 3000
#: Neighbouring chunks of one symbol merge when one of them is shorter than this (overloads).
SMALL_CHUNK_LINES = 8
SIGNATURE_MAX_CHARS = 240
DOC_MAX_CHARS = 300

#: Definition kinds that bound chunks; others (constants, fields) stay inside the text around them.
BLOCK_KINDS = frozenset(
    {"function", "method", "class", "struct", "interface", "enum", "impl", "module", "type"}
)
#: Receivers are not references to anything: ``self`` alone is 70,000 of Django's 440,000 uses.
_RECEIVERS = frozenset({"self", "cls", "this"})
_CONTAINER_KINDS = frozenset({"class", "struct", "interface", "impl", "enum"})
_COMMENT_PREFIXES = ("#", "//", "/*", "*", "--", "///", "%")


@dataclass(frozen=True, slots=True)
class Tag:
    """A definition (``role == "def"``) or a reference (``role == "ref"``) of a name."""

    role: str
    name: str
    kind: str
    line: int  # 1-based
    end_line: int
    qualname: str = ""
    signature: str = ""
    doc: str = ""


@dataclass(frozen=True, slots=True)
class Chunk:
    """A searchable run of whole lines; ``text`` may start with a repeated signature header."""

    start_line: int  # 1-based, inclusive
    end_line: int
    text: str
    symbol: str = ""
    kind: str = "text"


@dataclass(frozen=True, slots=True)
class Extraction:
    """Everything the store keeps about one file's content."""

    language: str
    tags: tuple[Tag, ...]
    chunks: tuple[Chunk, ...]
    lines: int
    error: str | None = None

    @property
    def definitions(self) -> list[Tag]:
        return [t for t in self.tags if t.role == "def"]

    @property
    def references(self) -> list[Tag]:
        return [t for t in self.tags if t.role == "ref"]


def split_lines(text: str) -> list[str]:
    """Lines as tree-sitter counts them: split at ``\n`` only (``str.splitlines`` also splits at
    form feeds and other separators, which would shift every line number after one)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def language_for(path: str) -> str:
    """The language of a path by its suffix: a grammar name, a text format, or ``"text"``."""
    dot = path.rfind(".")
    suffix = path[dot:].lower() if dot > path.rfind("/") else ""
    return CODE_LANGUAGES.get(suffix) or TEXT_LANGUAGES.get(suffix) or "text"


def has_grammar(language: str) -> bool:
    return language in set(CODE_LANGUAGES.values())


# --- identifiers -> search words ---------------------------------------------------------------

_SOURCE_SUFFIX = re.compile(r"\.(h|hh|hpp|hxx|c|cc|cpp|js|mjs|cjs|jsx|ts|tsx|py|rb|php|go|rs|lua)$")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MIXED_CASE = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*?(?:[a-z0-9][A-Z]|[A-Z][a-z])[A-Za-z0-9_]*")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


@lru_cache(maxsize=65536)
def _split(name: str) -> tuple[str, ...]:
    return tuple(part.lower() for part in _CAMEL.findall(name))


def split_identifier(name: str) -> list[str]:
    """``parseHTTPResponse`` and ``parse_http_response`` -> ``["parse", "http", "response"]``."""
    return list(_split(name))


def search_words(text: str) -> str:
    """The extra words that make code searchable by its parts: camelCase pieces, lowercased.

    FTS5's unicode61 tokenizer already splits ``snake_case`` at underscores, but keeps
    ``parseHTTPResponse`` whole; the pieces of such names are returned once each.
    """
    seen: dict[str, None] = {}
    for ident in set(_MIXED_CASE.findall(text)):
        for part in _split(ident):
            seen.setdefault(part, None)
    return " ".join(seen)


# --- tree-sitter -------------------------------------------------------------------------------


#: Grammars whose node names are the same as another's, so they share its query file.
QUERY_SHARED_WITH = {"tsx": "typescript"}


@cache
def _parser_and_query(language: str) -> tuple[Any, Any]:
    import tree_sitter
    import tree_sitter_language_pack as pack

    lang = pack.get_language(language)  # type: ignore[arg-type]
    query_file = QUERY_SHARED_WITH.get(language, language)
    source = resources.files("openjarvis.index").joinpath("queries", f"{query_file}.scm").read_text()
    return tree_sitter.Parser(lang), tree_sitter.Query(lang, source)


@dataclass(slots=True)
class _Def:
    name: str
    kind: str
    start: int  # 0-based line
    end: int  # 0-based line, inclusive
    start_byte: int
    end_byte: int
    chunk_start: int  # first line of decorators / leading comment
    signature: str
    doc: str
    qualname: str = ""
    children: list[_Def] | None = None
    assigned: bool = False  # a plain assignment: a constant only if its name is upper case


def extract(path: str, data: bytes, language: str | None = None) -> Extraction:
    """Tags and chunks of one file's bytes; never raises for bad content."""
    language = language or language_for(path)
    error: str | None = None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        text = data.decode("utf-8", errors="replace")
        error = f"not UTF-8 (byte {exc.start}); indexed as plain text"
    lines = split_lines(text)
    if error is None and has_grammar(language):
        parser, query = _parser_and_query(language)
        tree = parser.parse(data)
        defs, refs = _tags_from_tree(tree, query, data, lines, language)
        if tree.root_node.has_error:
            error = f"syntax error near line {_first_error_line(tree.root_node)}; chunked as plain text"
            chunks = _plain_chunks(lines, language)
        else:
            chunks = _def_chunks(lines, defs)
        tags = [_def_tag(d) for d in _flatten(defs)] + refs
        return Extraction(language, tuple(tags), tuple(chunks), len(lines), error)
    return Extraction(language, (), tuple(_plain_chunks(lines, language)), len(lines), error)


def _first_error_line(node: Any) -> int:
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == "ERROR" or n.is_missing:
            return int(n.start_point[0]) + 1
        stack.extend(reversed([c for c in n.children if c.has_error or c.is_missing]))
    return int(node.start_point[0]) + 1


def _tags_from_tree(
    tree: Any, query: Any, data: bytes, lines: list[str], language: str
) -> tuple[list[_Def], list[Tag]]:
    import tree_sitter

    found: dict[tuple[int, str], _Def] = {}
    refs: dict[tuple[str, str, int], Tag] = {}
    for _, captures in tree_sitter.QueryCursor(query).matches(tree.root_node):
        names = captures.get("name")
        if names is not None:
            for capture, nodes in captures.items():
                if capture.startswith("definition."):
                    node, name_node = nodes[0], names[0]
                    name = _node_text(name_node, data)
                    key = (node.start_byte, name)
                    if key not in found:
                        found[key] = _make_def(node, name, capture[11:], data, lines, language)
            continue
        for capture, nodes in captures.items():  # a reference pattern: one capture
            kind = capture[10:]
            for node in nodes:
                text = data[node.start_byte : node.end_byte].decode("utf-8", errors="replace")
                name = text if text.isidentifier() else _ref_name(text)
                line = node.start_point[0] + 1
                ref_key = (name, kind, line)
                if name and ref_key not in refs and name not in _RECEIVERS:
                    refs[ref_key] = Tag("ref", name, kind, line, line)
    roots = _nest(sorted(found.values(), key=lambda d: (d.start_byte, -d.end_byte)))
    return roots, list(refs.values())


def _node_text(node: Any, data: bytes) -> str:
    return data[node.start_byte : node.end_byte].decode("utf-8", errors="replace")


def _ref_name(text: str) -> str:
    """Import paths and includes name their last component: ``"net/http"`` -> ``http``."""
    if text.isidentifier():
        return text
    text = re.split(r"[/\\]", text.strip("\"'<>` "))[-1]
    text = _SOURCE_SUFFIX.sub("", text)
    if "." in text or "::" in text:
        text = re.split(r"\.|::", text)[-1]
    return text if _IDENT.fullmatch(text) else ""


def _make_def(node: Any, name: str, kind: str, data: bytes, lines: list[str], language: str) -> _Def:
    start, end = node.start_point[0], node.end_point[0]
    if node.end_point[1] == 0 and end > start:
        end -= 1
    outer = node
    while outer.parent is not None and outer.parent.type in (
        "decorated_definition", "export_statement", "template_declaration"
    ):  # fmt: skip
        outer = outer.parent
    chunk_start = outer.start_point[0]
    comment_lines: list[str] = []
    i = chunk_start - 1
    while i >= 0 and lines[i].strip().startswith(_COMMENT_PREFIXES):
        comment_lines.insert(0, lines[i].strip())
        i -= 1
    chunk_start = i + 1
    body = node.child_by_field_name("body")
    sig_end = body.start_byte if body is not None and body.start_byte > node.start_byte else None
    if sig_end is None:
        first_line = lines[start] if start < len(lines) else ""
        signature = first_line.strip()
    else:
        sig_lines = data[node.start_byte : sig_end].decode("utf-8", errors="replace").split("\n")
        keep = [sig_lines[0]]
        for line in sig_lines[1:]:
            if line.strip().startswith(_COMMENT_PREFIXES):
                break
            keep.append(line)
        signature = " ".join(keep)
    signature = " ".join(signature.split()).rstrip("{ ").strip()
    if len(signature) > SIGNATURE_MAX_CHARS:
        signature = signature[: SIGNATURE_MAX_CHARS - 3] + "..."
    doc = _python_docstring(body, data) if language == "python" and body is not None else ""
    if not doc and comment_lines:
        doc = " ".join(re.sub(r"^(///?|/\*+|\*+/?|#+|--)\s?", "", c).strip() for c in comment_lines)
    doc = " ".join(doc.split())
    if node.type == "assignment_expression":  # JS: ``View.prototype.render = function``
        left = node.child_by_field_name("left")
        dotted = _node_text(left, data).replace(".prototype.", ".") if left is not None else ""
        if re.fullmatch(r"[\w$]+(\.[\w$]+)+", dotted) and not dotted.startswith(("exports.", "module.")):
            name = dotted
    if language == "go" and node.type == "method_declaration":
        receiver = node.child_by_field_name("receiver")
        idents = _IDENT.findall(_node_text(receiver, data)) if receiver is not None else []
        if idents:
            name = f"{idents[-1]}.{name}"
    if language == "lua" and node.type == "function_declaration":
        name_node = node.child_by_field_name("name")
        if name_node is not None:
            name = _node_text(name_node, data).replace(":", ".")
    if language == "cpp" and "::" in signature.split("(")[0]:
        declarator = node.child_by_field_name("declarator")
        inner = declarator.child_by_field_name("declarator") if declarator is not None else None
        if inner is not None and inner.type == "qualified_identifier":
            name = _node_text(inner, data).replace("::", ".")
    return _Def(
        name, kind, start, end, node.start_byte, node.end_byte, chunk_start, signature,
        doc[:DOC_MAX_CHARS], assigned=node.type in ("assignment", "assignment_statement"),
    )  # fmt: skip


def _python_docstring(body: Any, data: bytes) -> str:
    first = body.named_children[0] if body.named_children else None
    if first is not None and first.type == "expression_statement" and first.named_children:
        first = first.named_children[0]
    string = first
    if string is None or string.type != "string":
        return ""
    raw = _node_text(string, data)
    raw = re.sub(r'^[rRbBuUfF]*("""|\'\'\'|"|\')', "", raw)
    raw = re.sub(r'("""|\'\'\'|"|\')$', "", raw)
    return raw.strip().split("\n\n")[0]


def _nest(defs: list[_Def]) -> list[_Def]:
    """Nest definitions by byte range; sets qualified names and turns class functions into methods."""
    roots: list[_Def] = []
    stack: list[_Def] = []
    for d in defs:
        while stack and stack[-1].end_byte <= d.start_byte:
            stack.pop()
        parent = stack[-1] if stack else None
        if parent is None:
            d.qualname = d.name
            roots.append(d)
        else:
            d.qualname = d.name if "." in d.name else f"{parent.qualname}.{d.name}"
            if d.kind == "function" and parent.kind in _CONTAINER_KINDS:
                d.kind = "method"
            if d.kind == "constant" and parent.kind in _CONTAINER_KINDS:
                d.kind = "field"
            if parent.children is None:
                parent.children = []
            parent.children.append(d)
        if d.kind == "constant" and not d.name.isupper() and parent is None and d.assigned:
            d.kind = "variable"
        stack.append(d)
    return roots


def _flatten(defs: Iterable[_Def]) -> Iterable[_Def]:
    for d in defs:
        yield d
        if d.children:
            yield from _flatten(d.children)


def _def_tag(d: _Def) -> Tag:
    return Tag("def", d.name.rsplit(".", 1)[-1], d.kind, d.start + 1, d.end + 1,
               d.qualname, d.signature, d.doc)  # fmt: skip


# --- chunks ------------------------------------------------------------------------------------


def _windows(lines: list[str], lo: int, hi: int, header: str = "") -> Iterable[tuple[int, int, str]]:
    """Split lines[lo:hi] into (start, end_exclusive, text) windows under both caps."""
    start = lo
    while start < hi:
        size = len(header)
        end = start
        while end < hi and end - start < CHUNK_MAX_LINES:
            size += len(lines[end]) + 1
            if size > CHUNK_MAX_CHARS and end > start:
                break
            end += 1
        body = "\n".join(lines[start:end])
        yield start, end, (f"{header}\n{body}" if header and start > lo else body)
        start = end


def _plain_chunks(lines: list[str], language: str) -> list[Chunk]:
    bounds = [0]
    if language == "markdown":
        bounds += [i for i, line in enumerate(lines) if i and line.startswith("#")]
    bounds.append(len(lines))
    out: list[Chunk] = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        if lo >= hi:
            continue
        heading = lines[lo].lstrip("# ").strip() if language == "markdown" else ""
        for s, e, text in _windows(lines, lo, hi, lines[lo] if heading else ""):
            if text.strip():
                out.append(Chunk(s + 1, e, text, heading, "section" if heading else "text"))
    return out


def _def_chunks(lines: list[str], roots: list[_Def]) -> list[Chunk]:
    out: list[Chunk] = []
    _span(lines, 0, len(lines), [d for d in roots if d.kind in BLOCK_KINDS], "", None, out)
    return _merge_small(lines, out)


def _merge_small(lines: list[str], chunks: list[Chunk]) -> list[Chunk]:
    """Join neighbours of the same symbol (overloads, a split tail) while they fit the caps."""
    merged: list[Chunk] = []
    for c in chunks:
        prev = merged[-1] if merged else None
        if (
            prev is not None
            and prev.symbol == c.symbol
            and prev.kind == c.kind
            and c.end_line - prev.start_line < CHUNK_MAX_LINES
            and len(prev.text) + len(c.text) < CHUNK_MAX_CHARS
            and (prev.end_line - prev.start_line < SMALL_CHUNK_LINES or c.end_line - c.start_line < SMALL_CHUNK_LINES)
        ):
            header = prev.text.split("\n", 1)[0] if prev.text.count("\n") > prev.end_line - prev.start_line else ""
            body = lines[prev.start_line - 1 : c.end_line]
            merged[-1] = Chunk(prev.start_line, c.end_line, _with_header(header, body), c.symbol, c.kind)
        else:
            merged.append(c)
    return merged


def _span(
    lines: list[str], lo: int, hi: int, defs: list[_Def], header: str, owner: _Def | None,
    out: list[Chunk],
) -> None:  # fmt: skip
    """Chunk lines[lo:hi]: gaps between the block definitions ``defs``, then each definition."""
    cursor = lo
    symbol, kind = (owner.qualname, owner.kind) if owner else ("", "text")
    for d in defs:
        start = max(d.chunk_start, cursor)
        if start > cursor:
            # The owner's own first lines carry its signature: no header repeat there.
            gap_header = header.rpartition("\n")[0] if owner and cursor == lo else header
            if not (owner and cursor == lo and _only_signature(lines[cursor:start], owner)):
                _gap(lines, cursor, start, gap_header, symbol, kind, out)
        end = min(d.end + 1, hi)
        if end - start <= CHUNK_MAX_LINES and sum(len(x) + 1 for x in lines[start:end]) <= CHUNK_MAX_CHARS:
            out.append(Chunk(start + 1, end, _with_header(header, lines[start:end]), d.qualname, d.kind))
        else:
            kids = [c for c in d.children or [] if c.kind in BLOCK_KINDS]
            sig = f"{header}\n{d.signature}" if header else d.signature
            if kids:
                _span(lines, start, end, kids, sig, d, out)
            else:
                for s, e, text in _windows(lines, start, end, sig):
                    text = _with_header(header, [text]) if s == start else text
                    out.append(Chunk(s + 1, e, text, d.qualname, d.kind))
        cursor = max(cursor, end)
    if cursor < hi:
        _gap(lines, cursor, hi, header, symbol, kind, out)


def _only_signature(gap: list[str], owner: _Def) -> bool:
    """Whether a container's leading gap holds nothing but its signature (repeated anyway)."""
    text = " ".join(" ".join(gap).split()).rstrip("{: ")
    return text == owner.signature.rstrip("{: ")


def _gap(
    lines: list[str], lo: int, hi: int, header: str, symbol: str, kind: str, out: list[Chunk]
) -> None:
    while lo < hi and not lines[lo].strip():
        lo += 1
    while hi > lo and not lines[hi - 1].strip():
        hi -= 1
    for s, e, text in _windows(lines, lo, hi, header):
        if text.strip() and any(line.strip() for line in lines[s:e]):
            first = s == lo and header
            out.append(Chunk(s + 1, e, f"{header}\n{text}" if first else text, symbol, kind))


def _with_header(header: str, body: list[str]) -> str:
    text = "\n".join(body)
    return f"{header}\n{text}" if header else text
