"""MkDocs hook: the command-line page's flag tables, rendered from pydflash's own argparse parsers,
and the table of each option's name in each API, rendered from its declaration (pydflash.options).

`<!-- cli-reference -->` in a page becomes one section per subcommand (usage, description, a
table of its options), so `--help` and the docs have one source. The parser is caught where
`pydflash.cli.main` parses its arguments, so this does not depend on how the CLI's modules are
laid out.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any
from unittest import mock

MARKER = "<!-- cli-reference -->"
OPTIONS_MARKER = "<!-- option-names -->"
_API_HEADS = {
    "generate": "`generate`",
    "llama_cpp": "`create_completion`",
    "completions": "`/v1/completions`",
    "chat": "`/v1/chat/completions`",
    "native": "`/completion`",
    "anthropic": "`/v1/messages`",
    "responses": "`/v1/responses`",
    "cli": "`pydflash generate`",
    "serve": "`pydflash serve` (default)",
}


class _Caught(BaseException):  # BaseException: main's `except Exception`-style handlers never see it
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def root_parser() -> argparse.ArgumentParser:
    """The `pydflash` parser, taken from the first parse_args call of the CLI's entry point."""

    def catch(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Caught(self)

    main = importlib.import_module("pydflash.cli").main
    with mock.patch.object(argparse.ArgumentParser, "parse_args", catch):
        try:
            main(["--help"])
        except _Caught as c:
            return c.parser
    raise RuntimeError("pydflash.cli.main never parsed its arguments")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser, in the order `pydflash --help` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _flag(action: argparse.Action) -> str:
    names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.nargs == 0:
        return names
    metavar = action.metavar or (action.dest.upper() if action.option_strings else "")
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    if action.choices is not None and not action.metavar:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    return f"{names} `{metavar}`" if metavar and action.option_strings else names


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:  # a flag without help text still shows its default
        default = action.default
        return "" if default is None or default is False or default == argparse.SUPPRESS else f"(default: {default})"
    # the formatter expands %(default)s and friends exactly as --help does
    return _cell(parser._get_formatter()._expand_help(action))


def render_subcommand(name: str, parser: argparse.ArgumentParser) -> str:
    """One subcommand as Markdown: usage, description, and a table of its arguments."""
    usage = " ".join(parser.format_usage().split())
    out = [f"## `pydflash {name}`", "", "```text", usage, "```", ""]
    if parser.description:
        out += [_cell(parser.description), ""]
    rows = [a for a in parser._actions if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
    if rows:
        out += ["| argument | meaning |", "|---|---|"]
        out += [f"| {_flag(a)} | {_help(parser, a)} |" for a in rows]
        out.append("")
    return "\n".join(out)


def render() -> str:
    """Every subcommand of `pydflash`, as Markdown."""
    return "\n".join(render_subcommand(n, p) for n, p in subcommands(root_parser()).items())


def render_options() -> str:
    """Each declared option's name in each API ("refused": that API refuses it by name), as Markdown."""
    options = importlib.import_module("pydflash.options")
    apis = list(options.APIS)
    out = ["| option | " + " | ".join(_API_HEADS[a] for a in apis) + " |", "|---" * (len(apis) + 1) + "|"]
    for o in options.OPTIONS:
        cells = []
        for api in apis:
            name = o.names[api]
            also = [x for x in o.aliases.get(api, ()) if x != name]
            cells.append("refused" if name is None else f"`{name}`" + (f" ({', '.join(also)})" if also else ""))
        out.append(f"| `{o.name}` | " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(out)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, render())
    if OPTIONS_MARKER in markdown:
        markdown = markdown.replace(OPTIONS_MARKER, render_options())
    return markdown
