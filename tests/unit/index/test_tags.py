"""Extraction: one fixture and one test per language, chunking rules, errors, no network."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from openjarvis.index import tags
from openjarvis.index.tags import extract, language_for, search_words, split_identifier

LANGUAGES = Path(__file__).resolve().parents[2] / "fixtures" / "languages"

#: language dir -> (qualified names of definitions as (qualname, kind), a call that must be found)
EXPECTED: dict[str, tuple[set[tuple[str, str]], str]] = {
    "python": (
        {("MAX_RETRIES", "constant"), ("HttpClient", "class"), ("HttpClient.timeout", "field"),
         ("HttpClient.parse_http_response", "method"), ("split_lines", "function")},
        "split_lines",
    ),
    "javascript": (
        {("MAX_RETRIES", "constant"), ("HttpClient", "class"),
         ("HttpClient.parseHttpResponse", "method"), ("splitLines", "function")},
        "splitLines",
    ),
    "typescript": (
        {("MAX_RETRIES", "constant"), ("Response", "interface"), ("HttpClient", "class"),
         ("HttpClient.parseHttpResponse", "method"), ("splitLines", "function"), ("Method", "enum")},
        "splitLines",
    ),
    "tsx": ({("Props", "interface"), ("Greeting", "function"), ("formatName", "function")}, "formatName"),
    "go": (
        {("MaxRetries", "constant"), ("HttpClient", "struct"), ("Parser", "interface"),
         ("Parser.Parse", "method"), ("HttpClient.ParseHttpResponse", "method"),
         ("SplitLines", "function")},
        "SplitLines",
    ),
    "rust": (
        {("MAX_RETRIES", "constant"), ("HttpClient", "struct"), ("HttpClient", "impl"),
         ("HttpClient.parse_http_response", "method"), ("Parser", "interface"),
         ("Parser.parse", "method"), ("Method", "enum"), ("split_lines", "function")},
        "split_lines",
    ),
    "java": (
        {("HttpClient", "class"), ("HttpClient.MAX_RETRIES", "field"),
         ("HttpClient.parseHttpResponse", "method"), ("HttpClient.splitLines", "method"),
         ("Parser", "interface"), ("Parser.parse", "method"), ("Method", "enum")},
        "splitLines",
    ),
    "c": (
        {("MAX_RETRIES", "constant"), ("http_client", "struct"), ("split_lines", "function"),
         ("parse_http_response", "function")},
        "split_lines",
    ),
    "cpp": (
        {("net", "module"), ("net.HttpClient", "class"), ("net.HttpClient.parseHttpResponse", "method"),
         ("net.splitLines", "function"), ("HttpClient.parseHttpResponse", "method")},
        "splitLines",
    ),
    "csharp": (
        {("Net", "module"), ("Net.HttpClient", "class"), ("Net.HttpClient.Timeout", "property"),
         ("Net.HttpClient.ParseHttpResponse", "method"), ("Net.HttpClient.SplitLines", "method"),
         ("Net.IParser", "interface"), ("Net.IParser.Parse", "method")},
        "SplitLines",
    ),
    "ruby": (
        {("MAX_RETRIES", "constant"), ("Net", "module"), ("Net.HttpClient", "class"),
         ("Net.HttpClient.parse_http_response", "method"), ("Net.HttpClient.split_lines", "method")},
        "split_lines",
    ),
    "php": (
        {("MAX_RETRIES", "constant"), ("HttpClient", "class"),
         ("HttpClient.parseHttpResponse", "method"), ("split_lines", "function")},
        "split_lines",
    ),
    "bash": (
        {("MAX_RETRIES", "constant"), ("split_lines", "function"), ("parse_http_response", "function")},
        "split_lines",
    ),
    "lua": (
        {("split_lines", "function"), ("HttpClient.parse_http_response", "method"),
         ("HttpClient.new", "function")},
        "split_lines",
    ),
}  # fmt: skip


@pytest.mark.parametrize("lang", sorted(EXPECTED))
def test_language_fixture(lang: str) -> None:
    path = next((LANGUAGES / lang).glob("sample.*"))
    ex = extract(path.name, path.read_bytes())
    defs, call = EXPECTED[lang]
    assert ex.error is None
    assert ex.language == lang
    assert {(t.qualname, t.kind) for t in ex.definitions} == defs
    assert any(t.name == call and t.kind == "call" for t in ex.references)
    assert ex.chunks, "every non-empty file has chunks"


def test_every_language_has_a_fixture() -> None:
    assert {p.name for p in LANGUAGES.iterdir()} >= set(EXPECTED) | {"markdown"}


def test_python_definition_fields() -> None:
    ex = extract("sample.py", (LANGUAGES / "python" / "sample.py").read_bytes())
    by_name = {t.qualname: t for t in ex.definitions}
    method = by_name["HttpClient.parse_http_response"]
    assert (method.line, method.end_line) == (14, 16)
    assert method.signature == "def parse_http_response(self, raw):"
    assert method.doc == "Split a raw response into status and body."
    assert by_name["split_lines"].doc == "Split on newlines, dropping the last empty piece."
    assert {t.name for t in ex.references if t.kind == "import"} == {"OrderedDict"}
    assert {t.name for t in ex.references if t.kind == "module"} == {"os", "collections"}


def test_leading_comment_is_the_doc_elsewhere() -> None:
    ex = extract("sample.go", (LANGUAGES / "go" / "sample.go").read_bytes())
    by_name = {t.qualname: t for t in ex.definitions}
    assert by_name["SplitLines"].doc == "SplitLines splits on newlines."
    assert by_name["HttpClient.ParseHttpResponse"].signature == (
        "func (c *HttpClient) ParseHttpResponse(raw string) []string"
    )


def test_chunks_follow_definitions_and_whole_lines() -> None:
    source = (LANGUAGES / "python" / "sample.py").read_text()
    ex = extract("sample.py", source.encode())
    lines = source.splitlines()
    assert [(c.symbol, c.start_line, c.end_line) for c in ex.chunks] == [
        ("", 1, 6),
        ("HttpClient", 9, 16),
        ("split_lines", 19, 21),
    ]
    for chunk in ex.chunks:
        assert chunk.text == "\n".join(lines[chunk.start_line - 1 : chunk.end_line])


def test_long_definition_is_split_with_its_signature_repeated() -> None:
    body = "".join(f"    x{i} = compute({i})\n" for i in range(150))
    source = f"def build_everything(a, b):\n{body}"
    ex = extract("long.py", source.encode())
    lines = source.splitlines()
    assert len(ex.chunks) == 3
    assert [(c.start_line, c.end_line) for c in ex.chunks] == [(1, 60), (61, 120), (121, 151)]
    for chunk in ex.chunks[1:]:
        header, *rest = chunk.text.split("\n")
        assert header == "def build_everything(a, b):"
        assert rest == lines[chunk.start_line - 1 : chunk.end_line]
    assert all(c.symbol == "build_everything" for c in ex.chunks)


def test_long_class_is_split_at_its_methods_with_the_class_header() -> None:
    methods = "".join(
        f"    def m{i}(self):\n" + "".join(f"        y = {j}\n" for j in range(20)) for i in range(5)
    )
    ex = extract("cls.py", f"class Big(Base):\n{methods}".encode())
    symbols = [c.symbol for c in ex.chunks]
    assert symbols == ["Big.m0", "Big.m1", "Big.m2", "Big.m3", "Big.m4"]
    assert ex.chunks[0].text.startswith("class Big(Base):\n    def m0(self):")
    assert ex.chunks[3].text.startswith("class Big(Base):\n    def m3(self):")


def test_syntax_error_is_recorded_and_file_still_chunked() -> None:
    ex = extract("broken.py", b"def ok():\n    return 1\n\ndef broken(:\n    pass\n")
    assert ex.error is not None and ex.error.startswith("syntax error near line 4")
    assert [(c.start_line, c.end_line, c.kind) for c in ex.chunks] == [(1, 5, "text")]


def test_wrong_encoding_is_recorded_and_indexed_as_text() -> None:
    ex = extract("latin.py", "x = 'caf\xe9'\n".encode("latin-1"))
    assert ex.error == "not UTF-8 (byte 8); indexed as plain text"
    assert ex.tags == ()
    assert ex.chunks[0].text.startswith("x = 'caf")


def test_plain_text_languages_and_markdown_sections() -> None:
    assert [language_for(p) for p in ("a.md", "b.toml", "c.yml", "d.json", "e.txt", "Makefile")] == [
        "markdown", "toml", "yaml", "json", "text", "text",
    ]  # fmt: skip
    ex = extract("README.md", (LANGUAGES / "markdown" / "sample.md").read_bytes())
    assert [(c.symbol, c.start_line, c.end_line) for c in ex.chunks] == [
        ("HTTP client", 1, 4),
        ("Parsing responses", 5, 7),
    ]


def test_identifier_words() -> None:
    assert split_identifier("parseHTTPResponse") == ["parse", "http", "response"]
    assert split_identifier("parse_http_response") == ["parse", "http", "response"]
    assert split_identifier("XMLHttpRequest2") == ["xml", "http", "request", "2"]
    assert set(search_words("return parseHTTPResponse(rawBytes)").split()) == {
        "parse", "http", "response", "raw", "bytes",
    }  # fmt: skip


def test_parsing_needs_no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("network access during parsing")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    tags._parser_and_query.cache_clear()
    for lang in EXPECTED:
        path = next((LANGUAGES / lang).glob("sample.*"))
        assert extract(path.name, path.read_bytes()).definitions


@pytest.mark.parametrize("name", ["empty.py", "empty.md", "empty.json", "empty.ts", "empty.txt", "blank.go"])
def test_empty_and_blank_files(name: str) -> None:
    data = b"\n\n" if name.startswith("blank") else b""
    ex = extract(name, data)
    assert (ex.tags, ex.chunks) == ((), ())


def test_line_numbers_survive_form_feeds_and_crlf() -> None:
    source = b"import os\r\n\x0c\r\n# helper\r\ndef after_form_feed():\r\n    return 1\r\n"
    ex = extract("ff.py", source)
    [d] = ex.definitions
    assert (d.qualname, d.line, d.end_line, d.doc) == ("after_form_feed", 4, 5, "helper")
    assert ex.chunks[-1].text == "# helper\ndef after_form_feed():\n    return 1"
