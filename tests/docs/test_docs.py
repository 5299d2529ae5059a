"""docs/ describes berth as the code has it: every command, option, config key and route.

Pure and fast: the CLI tree is the real argparse parser, the config keys are walked from the
msgspec Structs of service/config.py, the routes are those of the real Litestar app (built, never
served). A flag, key or route added without its entry fails here, as does a documented default
that is not the code's, an entry for something that does not exist, and a link that leads
nowhere or out of the repository.
"""

import argparse
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
from litestar.routes import HTTPRoute, WebSocketRoute

from service.api.app import create_app
from service.api.assembly import assemble
from service.config import Config
from service.core import bounds, exits
from service.db.engine import Database
from tests.cli_tree import parsers

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
HEADING = re.compile(r"^(#{1,6}) +(.*?) *$")
ITEM = re.compile(r"^- `([^`]+)`")
DEFAULT = re.compile(r"\(default: ([^)]*)\)")


# -- markdown --------------------------------------------------------------------------------


def headings(text: str) -> Iterator[tuple[int, str, int]]:
    """(level, title, line number) of each heading outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines()):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            yield len(m[1]), m[2], number


def sections(text: str, level: int) -> dict[str, str]:
    """Each heading of `level` and the text under it, up to the next heading of that level or above."""
    lines = text.splitlines()
    marks = [(lvl, title, n) for lvl, title, n in headings(text) if lvl <= level]
    out: dict[str, str] = {}
    for i, (lvl, title, n) in enumerate(marks):
        if lvl == level:
            end = marks[i + 1][2] if i + 1 < len(marks) else len(lines)
            out[title] = "\n".join(lines[n + 1 : end])
    return out


def anchors(text: str) -> set[str]:
    """The anchors GitHub makes of a page's headings (`[network.proxy]` -> networkproxy)."""
    found: set[str] = set()
    for _, title, _ in headings(text):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = 0
        while (candidate := slug if n == 0 else f"{slug}-{n}") in found:
            n += 1
        found.add(candidate)
    return found


def items(section: str) -> list[tuple[str, str]]:
    """The list items of a section that start with a code span: (that span, the item's text)."""
    found: list[tuple[str, str]] = []
    open_item = False
    for line in section.splitlines():
        if m := ITEM.match(line):
            found.append((m[1], line))
            open_item = True
        elif open_item and line.startswith("  ") and line.strip():
            found[-1] = (found[-1][0], f"{found[-1][1]} {line.strip()}")
        else:
            open_item = False
    return found


def table_rows(text: str) -> list[list[str]]:
    """Every row of every table (header and separator rows included), split into cells."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
            rows.append([c.strip() for c in cells])
    return rows


# -- the CLI ---------------------------------------------------------------------------------


def _shown_default(action: argparse.Action) -> str | None:
    """The default as `%(default)s` would print it; None when there is none worth saying."""
    d = action.default
    if d is None or d is False or d == argparse.SUPPRESS:
        return None
    if isinstance(d, str | list | tuple | dict) and not d:
        return None
    return str(d)


def _choice(p: argparse.ArgumentParser) -> argparse.Action | None:
    """A positional that picks what the command does (`berth worker list|drain|...`)."""
    for a in p._actions:
        if not a.option_strings and a.choices and a.nargs == "?":
            return a
    return None


def _documented_actions(p: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    """(how the doc names it, the action) for each argument a reader can give."""
    for a in p._actions:
        if isinstance(a, argparse._HelpAction | argparse._VersionAction):
            continue
        if a.help == argparse.SUPPRESS:
            continue  # hidden on purpose (internal to berth)
        if a.option_strings:
            long = next((o for o in a.option_strings if o.startswith("--")), a.option_strings[0])
            yield long, a
        else:
            name = a.metavar if isinstance(a.metavar, str) else a.dest.upper()
            yield name, a


def _span_name(span: str) -> str:
    """The argument a list item's first code span names: `--kind KIND` -> --kind, `ID` -> ID."""
    return span.split(maxsplit=1)[0].rstrip(",").removesuffix("...")


def test_every_command_has_its_section_and_every_option_its_entry_with_the_codes_default() -> None:
    """Each leaf of the argparse tree has `### berth PATH` in docs/cli.md listing each argument, with `(default: X)` exactly when the code has default X."""
    doc = sections((DOCS / "cli.md").read_text(), 3)
    problems = []
    for path, p in parsers():
        title = "berth " + " ".join(path)
        if title not in doc:
            problems.append(f"{title}: no `### {title}` section")
            continue
        entries = items(doc[title])
        for name, action in _documented_actions(p):
            mine = [text for span, text in entries if name == _span_name(span)]
            if not mine:
                problems.append(f"{title}: {name} has no `- \\`{name} ...\\`` entry")
                continue
            want = _shown_default(action)
            for text in mine:
                said = DEFAULT.findall(text)
                if want is None and said:
                    problems.append(
                        f"{title} {name}: documented default {said} but the code has none"
                    )
                elif want is not None and said != [want]:
                    problems.append(
                        f"{title} {name}: documented default {said}, the code's is {want!r}"
                    )
        if (choice := _choice(p)) is not None:
            subs = sections(doc[title], 4)
            problems += [
                f"{title} {c}: no `#### {title} {c}` heading"
                for c in choice.choices or ()
                if f"{title} {c}" not in subs
            ]
        known = {n for n, _ in _documented_actions(p)} | {
            o for a in p._actions for o in a.option_strings
        }
        problems += [
            f"{title}: documents {span.split()[0]}, which the command does not take"
            for span, _ in entries
            if span.startswith("-") and _span_name(span) not in known
        ]
    commands = {"berth " + " ".join(path) for path, _ in parsers()}
    problems += [
        f"`### {t}` names no command" for t in doc if t.startswith("berth ") and t not in commands
    ]
    assert not problems, "\n".join(problems)


def test_the_exit_code_table_and_every_environment_variable_are_in_the_cli_reference() -> None:
    """docs/cli.md holds the exit-code table as the code has it, and every BERTH_* variable the code names."""
    text = (DOCS / "cli.md").read_text()
    assert exits.markdown() in text
    code = (
        "\n".join(
            f.read_text()
            for top in ("service", "berth_runtime")
            for f in (ROOT / top).rglob("*.py")
        )
        + (ROOT / "berth_runtime" / "bin" / "berth").read_text()
    )
    named = set(re.findall(r"\bBERTH_[A-Z][A-Z_]*[A-Z]\b", code))
    assert named, "the scan found no variable at all"
    missing = sorted(n for n in named if f"`{n}`" not in text)
    assert not missing, f"not in docs/cli.md: {missing}"


# -- the configuration -----------------------------------------------------------------------


def toml(value: Any) -> str:
    """A default as TOML writes it: 10.0, 8, "token", true, [], { default = 2 }."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        bare = re.compile(r"\A[A-Za-z0-9_-]+\Z")
        pairs = (f"{k if bare.match(k) else json.dumps(k)} = {toml(v)}" for k, v in value.items())
        return "{ " + ", ".join(pairs) + " }"
    raise TypeError(f"no TOML for {value!r}")


def _default(field: mi.Field) -> str | None:
    """The field's default as TOML; None when it has none (required, None, or unset)."""
    if field.default_factory is not msgspec.NODEFAULT:
        return toml(field.default_factory())
    if field.default is msgspec.NODEFAULT or field.default is None:
        return None
    return toml(field.default)


def _members(t: mi.Type) -> tuple[mi.Type, ...]:
    return t.types if isinstance(t, mi.UnionType) else (t,)


def config_keys(t: mi.StructType | None = None, prefix: str = "") -> dict[str, str | None]:
    """Every key of the config: NAME for a table of tables, [] for an array of tables."""
    if t is None:
        info = mi.type_info(Config)
        assert isinstance(info, mi.StructType)
        t = info
    keys: dict[str, str | None] = {}
    for field in t.fields:
        key = prefix + field.encode_name
        leaf = False
        for member in _members(field.type):
            if isinstance(member, mi.StructType):
                keys |= config_keys(member, key + ".")
            elif isinstance(member, mi.ListType) and isinstance(member.item_type, mi.StructType):
                keys |= config_keys(member.item_type, key + "[].")
            elif isinstance(member, mi.DictType) and isinstance(member.value_type, mi.StructType):
                keys |= config_keys(member.value_type, key + ".NAME.")
            elif not isinstance(member, mi.NoneType):
                leaf = True
        if leaf:
            keys[key] = _default(field)
    return keys


def expected_rows() -> dict[str, str | None]:
    """The keys with their defaults, and `tenants.default.*` with the built-in bounds."""
    keys = config_keys()
    for field, builtin in bounds.FIELDS.items():
        assert f"tenants.NAME.{field}" in keys, field
        keys[f"tenants.{bounds.DEFAULT}.{field}"] = toml(builtin)
    return keys


def test_the_walk_finds_the_keys_of_every_section() -> None:
    """The walk of the Structs reaches keys in each section, nested tables and arrays of tables included."""
    keys = config_keys()
    for key in (
        "database.url",
        "network.tls.cert",
        "network.proxy.rules[].when",
        "executor.heartbeat_seconds",
        "pools.NAME.slots",
        "pools.NAME.provisioner.compute.tolerations[].effect",
        "cas.max_blob_gb",
        "tenants.NAME.max_queued",
    ):
        assert key in keys, key
    assert keys["pools.NAME.slots"] == "{ default = 2 }"
    assert keys["network.proxy.name_claims"] == '["user", "principal"]'
    assert keys["pools.NAME.provisioner.compute.image"] is None


def test_every_config_key_has_its_row_with_the_codes_default() -> None:
    """docs/configuration.md has one row per config key, its default cell the code's default as TOML ((none) when unset), and no row for a key that does not exist."""
    want = expected_rows()
    rows = [
        r
        for r in table_rows((DOCS / "configuration.md").read_text())
        if len(r) >= 3 and r[0].startswith("`") and r[0].endswith("`")
    ]
    documented: dict[str, str] = {}
    problems = []
    for row in rows:
        key = row[0].strip("`")
        if key in documented:
            problems.append(f"{key}: two rows")
        documented[key] = row[1]
    for key, default in want.items():
        if key not in documented:
            problems.append(f"{key}: no row")
            continue
        cell = "(none)" if default is None else f"`{default}`"
        if documented[key] != cell:
            problems.append(f"{key}: default documented {documented[key]}, the code's is {cell}")
    problems += [
        f"{key}: a row for a key that does not exist" for key in documented if key not in want
    ]
    assert not problems, "\n".join(problems)


# -- the HTTP API ----------------------------------------------------------------------------


def app_routes() -> set[tuple[str, str]]:
    """(method, path template) of every route the app serves; websockets as `GET (websocket)`."""
    rt = assemble(
        Config(),
        Database("postgresql://berth@127.0.0.1:1/never-connected", pool_size=1),
        server_id="docs",
        version="0",
    )
    found = set()
    for route in create_app(rt).routes:
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        if isinstance(route, WebSocketRoute):
            found.add(("GET (websocket)", path))
        elif isinstance(route, HTTPRoute):
            found |= {(m, path) for m in route.methods if m != "OPTIONS"}
    return found


def test_every_route_has_its_row() -> None:
    """docs/api.md has a row (method, path) for every route the app serves (of the /schema pages, openapi.json), and none for a route it does not serve."""
    served = app_routes()
    schema = "/schema"
    wanted = {(m, p) for m, p in served if not p.startswith(schema)}
    wanted.add(("GET", "/schema/openapi.json"))
    assert ("GET (websocket)", "/api/v1/workers/attach") in wanted
    documented = {
        (r[0], r[1].strip("`"))
        for r in table_rows((DOCS / "api.md").read_text())
        if len(r) >= 3 and r[1].startswith("`/")
    }
    missing = sorted(wanted - documented)
    unknown = sorted(documented - served)
    assert not missing, f"routes without a row in docs/api.md: {missing}"
    assert not unknown, f"rows in docs/api.md for routes the app does not serve: {unknown}"


# -- links -----------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
OUTSIDE = ("../shared", "/work/", "SPEC.md")
TOP = ("service", "berth_runtime", "deploy", "docs", "migrations", "tests", "bench", "scripts")
REPO_PATH = re.compile(rf"`((?:{'|'.join(TOP)})/[^`\s*]*)`")


def markdown_files() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted(DOCS.glob("*.md")),
        *sorted((ROOT / "deploy").rglob("*.md")),
    ]


def test_the_index_lists_every_page() -> None:
    """docs/README.md links every other page of docs/, and the pages this reference promises exist."""
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    promised = {"cli.md", "configuration.md", "api.md", "operations.md", "security.md"}
    assert promised | {"architecture.md"} <= pages
    linked = set(LINK.findall((DOCS / "README.md").read_text()))
    assert pages <= linked, f"not in docs/README.md: {sorted(pages - linked)}"


def test_every_relative_link_resolves_inside_the_repository_and_nothing_points_outside_it() -> None:
    """Each relative link in README.md, docs/ and deploy/ (and each repository path docs/ names) is a file of the repository, and none names ../shared, /work/ or SPEC.md."""
    problems = []
    for md in markdown_files():
        text = md.read_text()
        where = md.relative_to(ROOT)
        problems += [f"{where}: mentions {bad!r}" for bad in OUTSIDE if bad in text]
        for target in LINK.findall(text):
            if re.match(r"\A[a-z][a-z0-9+.-]*:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            file = (md.parent / path).resolve() if path else md
            if not file.is_relative_to(ROOT):
                problems.append(f"{where}: link {target} leaves the repository")
            elif not file.exists():
                problems.append(f"{where}: link {target} leads nowhere")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
                problems.append(f"{where}: link {target}: no such heading in {path or md.name}")
        for named in REPO_PATH.findall(text) if md.parent == DOCS else ():
            if not (ROOT / named.rstrip("/")).exists():
                problems.append(f"{where}: `{named}` is no path of the repository")
    assert not problems, "\n".join(problems)
