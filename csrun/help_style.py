"""One ``--help`` style and one error line for every csrun command.

Every command's ``--help`` reads the same::

    usage: PROG [options] ARGS

    One line on what it does.

    options (dash or underscore spelling; --opt val or --opt=val):
      --opt VALUE  what it is (default: 3)
      --flag  what it turns on
      --version  print the version and exit
      -h, --help  show this help and exit

    <the command's closing note, if any>

Each option is one entry (its wrapped lines indented six); its default is shown once: never for
a flag, never when the text already says it (``... (default: the site's def_nodes)``), ``none``
for an empty or unset value. Every command lists ``--version`` (``csrun env``: ``csrun``). The
text is wrapped at spaces to the terminal's width (:func:`help_width`: ``COLUMNS`` when set,
else the terminal's, else 80 columns) by :func:`wrap_help`. Every long option takes dashes or
underscores (``--max-steps`` and ``--max_steps``); the help shows the spelling the command
declares (run.py's legacy underscores). The launchers (:mod:`csrun.launch.options`) write their
dataclass options with :func:`option_line`; the argparse commands (``csrun``, ``run.py``,
``cs_emulator``, ``cs_convert_hdf5``) use :class:`Parser`, whose help is made by the same
function and whose errors are one :class:`~csrun.errors.UsageError` line (``PROG: error: ...
(see PROG --help)``, exit 2) instead of argparse's usage dump.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from typing import Any, Iterable, NoReturn, Sequence

from csrun.errors import UsageError


def default_note(text: str, default: Any, *, flag: bool) -> str:
    """`` (default: X)`` for an option's line, or '' where the default is not to be shown
    (a flag, or a text that states its own default)."""
    if flag or "default" in text or default is argparse.SUPPRESS:
        return ""
    if isinstance(default, (tuple, list)):
        default = ",".join(str(v) for v in default)
    shown = "none" if default in ("", None) else (repr(default) if isinstance(default, str) else str(default))
    return f" (default: {shown})"


def option_line(spelling: str, value: str, text: str, default: Any = None, *, flag: bool = False) -> str:
    """One option's help line: ``  SPELLING VALUE  TEXT (default: X)`` (``value`` '' for a flag)."""
    hint = f" {value}" if value else ""
    return f"  {spelling}{hint}  {text}{default_note(text, default, flag=flag)}".rstrip()


def help_header(prog: str, usage: str, summary: str, options_title: str = "options (--opt val or --opt=val):") -> list[str]:
    """The lines before the options: usage, summary, the options' title."""
    return [f"usage: {prog} {usage}".rstrip(), "", summary, "", options_title]


OPTIONS_TITLE = "options (dash or underscore spelling; --opt val or --opt=val):"
"""The title of every command's options: each long option takes either spelling."""
HELP_LINE = option_line("-h, --help", "", "show this help and exit", flag=True)
"""The last option of every command."""
VERSION_LINE = option_line("--version", "", "print the version and exit", flag=True)
"""The ``--version`` option's line (the launchers answer it before parsing: csrun.launch.process)."""

HELP_WIDTH = 80
"""Columns ``--help`` wraps at off a terminal when ``COLUMNS`` is not set."""
MIN_HELP_WIDTH = 40
"""The narrowest ``--help`` is wrapped to, whatever the terminal or ``COLUMNS`` says."""
CONTINUATION = " " * 6
"""The indent of an option's wrapped lines (an option's own line is indented two)."""


def help_width() -> int:
    """The columns ``--help`` is wrapped to: ``COLUMNS`` when set, else the terminal's (stdout),
    else :data:`HELP_WIDTH`; never under :data:`MIN_HELP_WIDTH`."""
    return max(MIN_HELP_WIDTH, shutil.get_terminal_size((HELP_WIDTH, 24)).columns)


def wrap_help(lines: Iterable[str], width: int | None = None) -> str:
    """``lines`` as help text wrapped to ``width`` columns (default :func:`help_width`), at spaces only:
    an indented line (an option) continues indented :data:`CONTINUATION`, any other (prose) at the margin."""
    width = help_width() if width is None else width
    out: list[str] = []
    for line in lines:
        for part in line.split("\n"):
            if len(part) <= width:
                out.append(part)
                continue
            indent = CONTINUATION if part.startswith(" ") else ""
            out.extend(textwrap.wrap(part, width, subsequent_indent=indent, break_long_words=False,
                                     break_on_hyphens=False) or [part])
    return "\n".join(out)


def _value_hint(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return "{" + "|".join(str(c) for c in action.choices) + "}"
    metavar = action.metavar if isinstance(action.metavar, str) else None
    hint = metavar or "VALUE"
    return f"{hint} ..." if action.nargs in ("+", "*") else hint


def _action_line(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {**vars(action), "prog": prog}
    if action.required:
        text = f"{text} (required)" if text else "required"
    spelling = ", ".join(action.option_strings)
    if isinstance(action, argparse.BooleanOptionalAction):  # --x / --no-x: say which is the default
        if "default" not in text:
            text = f"{text} (default: {'on' if action.default else 'off'})".lstrip()
        return option_line(" / ".join(action.option_strings), "", text, flag=True)
    return option_line(spelling, _value_hint(action), text, action.default, flag=action.nargs == 0 or action.required)


class Parser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` in the house style (module manual): ``usage`` is the text
    after the program's name on the usage line, ``epilog`` the closing note."""

    def __init__(self, prog: str, description: str = "", *, usage: str = "[options]", epilog: str = "",
                 add_help: bool = True, parents: Sequence[argparse.ArgumentParser] = ()) -> None:
        super().__init__(prog=prog, description=description, usage=usage, epilog=epilog,
                         add_help=add_help, parents=list(parents), allow_abbrev=False)

    def format_help(self) -> str:
        """The help text in the house style."""
        lines = help_header(self.prog, self.usage or "", self.description or "", OPTIONS_TITLE)
        commands: list[str] = []
        for action in self._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                commands.extend(f"  {sub.dest}  {sub.help or ''}".rstrip() for sub in action._choices_actions)
                continue
            if not action.option_strings:
                lines.append(option_line(action.metavar if isinstance(action.metavar, str) else action.dest.upper(),
                                         "", action.help or "", flag=True))
                continue
            lines.append(_action_line(action, self.prog))
        if self.add_help:
            lines.append(HELP_LINE)
        if commands:
            lines += ["", "commands:", *commands]
        if self.epilog:
            lines += ["", self.epilog]
        return wrap_help(lines) + "\n"

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """argparse's, except that a long option takes dashes or underscores (``--max-steps`` is
        ``--max_steps``: :meth:`respell`) and an unknown option is named before a missing required one."""
        commands = any(isinstance(a, argparse._SubParsersAction) for a in self._actions)
        words = list(args) if args is not None else sys.argv[1:]
        for i, word in enumerate(words):
            if word == "--" or (commands and not word.startswith("-")):
                break  # the rest is a subcommand's
            words[i] = word = self.respell(word)
            name = word.split("=", 1)[0]
            if name.startswith("--") and name not in self._option_string_actions:
                self.error(f"unrecognized arguments: {word}")
        return super().parse_known_args(words, namespace)

    def respell(self, word: str) -> str:
        """``word`` with its long option spelt as this parser declares it, where it differs only in
        dashes for underscores or the other way round (``--model-dir=X`` -> ``--model_dir=X``);
        any other word as it is."""
        name, eq, value = word.partition("=")
        if not name.startswith("--") or name in self._option_string_actions:
            return word
        wanted = name[2:].replace("-", "_")
        for known in self._option_string_actions:
            if known.startswith("--") and known[2:].replace("-", "_") == wanted:
                return known + eq + value
        return word

    def error(self, message: str) -> NoReturn:
        """A bad command line: one :class:`UsageError` line (exit 2), no usage dump."""
        raise UsageError(f"{message} (see {self.prog} --help)")


__all__ = ["HELP_LINE", "OPTIONS_TITLE", "VERSION_LINE", "Parser", "default_note", "help_header", "help_width",
           "option_line", "wrap_help"]
