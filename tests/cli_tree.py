"""Every `berth` command, read from the argparse tree, with arguments that parse.

A command added to the CLI is found here without anyone listing it, so the sweeps in
tests/e2e/test_cli_sweep.py cover it from its first commit.
"""

import argparse
from dataclasses import dataclass
from pathlib import Path

from service.cli import parser


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]  # e.g. ("job", "logs") or ("worker", "rm")
    argv: tuple[str, ...]  # path plus arguments that parse
    json: bool  # it offers --json

    @property
    def name(self) -> str:
        return " ".join(self.path)


# Values for positionals and required options by their dest; anything else gets "x".
PLACEHOLDERS = {
    "id": "1",
    "sha256": "0" * 64,
    "name": "sweep",
    "assignment": "pools.serve.slots.default=1",
    "key": "pools.serve.slots.default",
    "reason": "sweep",
}


def commands(files: Path) -> list[Command]:
    """Every leaf command; `files` is a folder for the arguments that name files."""
    files.mkdir(parents=True, exist_ok=True)
    (files / "input.txt").write_text("sweep\n")
    out = []
    for path, leaf in _leaves(parser(), ()):
        choice = _choice(leaf)
        if choice is None:
            out.append(_command(path, leaf, None, files))
            continue
        out.append(_command(path, leaf, None, files))  # e.g. `berth worker` itself: run one
        out += [_command((*path, c), leaf, choice, files) for c in choice.choices or ()]
    return out


def parsers() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every leaf command's parser, with its path."""
    return _leaves(parser(), ())


def _leaves(
    p: argparse.ArgumentParser, path: tuple[str, ...]
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            found = []
            for name, sub in action.choices.items():
                found += _leaves(sub, (*path, name))
            return found
    return [(path, p)]


def _choice(p: argparse.ArgumentParser) -> argparse.Action | None:
    """A positional that picks the action (`berth worker list|drain|...`), if the leaf has one."""
    for a in p._actions:
        if not a.option_strings and a.choices and a.nargs == "?":
            return a
    return None


def _value(a: argparse.Action, files: Path) -> str:
    if a.dest in PLACEHOLDERS:
        return PLACEHOLDERS[a.dest]
    if a.type is Path:
        return str(
            files if a.dest == "dir" else files / ("out.bin" if a.dest == "out" else "input.txt")
        )
    if a.type is int:
        return "1"
    return "x"


def _command(
    path: tuple[str, ...],
    leaf: argparse.ArgumentParser,
    choice: argparse.Action | None,
    files: Path,
) -> Command:
    argv: list[str] = list(path)
    picked = choice is not None
    for a in leaf._actions:
        if a.option_strings or a is choice or isinstance(a, argparse._HelpAction):
            continue
        if a.nargs == argparse.REMAINDER:
            argv += ["--", "true"]
        elif a.nargs in (None, 1) or (a.nargs == "?" and picked):
            argv.append(_value(a, files))
    for a in leaf._actions:
        if a.option_strings and a.required:
            argv += [a.option_strings[0], _value(a, files)]
    for group in leaf._mutually_exclusive_groups:
        if group.required:
            first = group._group_actions[0]
            argv.append(first.option_strings[0])
            if first.nargs != 0:
                argv.append(_value(first, files))
    offers_json = any("--json" in a.option_strings for a in leaf._actions)
    return Command(path=path, argv=tuple(argv), json=offers_json)
