"""Shell completion scripts (bash, zsh, fish) built from the command line's own argparse parser,
so that a new command or option is completed without anyone editing a script.

Each script finds the command typed so far (`regen`, `regen export`, ...) by walking the words
before the cursor, then offers that command's options, its subcommands, an option's choices, or
the shell's own file names (job files and output directories are paths).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import dataclass

SHELLS = ("bash", "zsh", "fish")


@dataclass(frozen=True)
class Option:
    """One option of a command: its flags, whether it takes a value, and the values allowed."""

    flags: tuple[str, ...]
    help: str
    takes_value: bool
    choices: tuple[str, ...]


@dataclass(frozen=True)
class Command:
    """A command as typed (`regen export`), its options, its subcommands and the values its
    positional arguments allow (`bash` for `regen completion`), each word with its help."""

    words: str
    options: tuple[Option, ...]
    subcommands: tuple[tuple[str, str], ...]
    values: tuple[tuple[str, str], ...]

    @property
    def offered(self) -> tuple[tuple[str, str], ...]:
        """The words offered where no option is being typed."""
        return self.subcommands + self.values


def commands(parser: argparse.ArgumentParser, words: str = "") -> Iterator[Command]:
    """Every command of `parser`, itself first, as the user types it."""
    words = words or parser.prog
    options, subs, values = [], [], []
    children: list[tuple[str, argparse.ArgumentParser]] = []
    # argparse has no public walk of a parser's arguments: _actions (and its subparsers'
    # _get_subactions) are what its own help reads.
    for action in parser._actions:
        text = _text(action.help or "", parser, action)
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._get_subactions()}
            children += action.choices.items()
            subs += [(name, _text(helps.get(name, ""), parser)) for name in action.choices]
        elif not action.option_strings:
            values += [(str(choice), text) for choice in action.choices or ()]
        elif action.help != argparse.SUPPRESS:
            choices = tuple(map(str, action.choices or ()))
            options.append(Option(tuple(action.option_strings), text, action.nargs != 0, choices))
    yield Command(words, tuple(options), tuple(subs), tuple(values))
    for name, sub in children:
        yield from commands(sub, f"{words} {name}")


def _text(text: str, parser: argparse.ArgumentParser, action: argparse.Action | None = None) -> str:
    """A help string as `--help` shows it (its %(default)s filled in), on one line."""
    try:
        text = text % {**(vars(action) if action else {}), "prog": parser.prog}
    except (KeyError, TypeError, ValueError):
        text = text.replace("%%", "%")
    return " ".join(text.split())


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for `shell` (one of SHELLS) of the program `parser` parses for."""
    makers: dict[str, Callable[[list[Command], str], str]] = {
        "bash": _bash,
        "zsh": _zsh,
        "fish": _fish,
    }
    return makers[shell](list(commands(parser)), parser.prog)


def _single(text: str) -> str:
    """`text` in POSIX single quotes (bash and zsh)."""
    return "'" + text.replace("'", "'\\''") + "'"


def _walk(cmds: list[Command], word: str, indent: str) -> list[str]:
    """A POSIX `case` that moves `cmd` down to the subcommand named by `$word` (bash and zsh)."""
    paths = " | ".join(_single(f"{c.words} {n}") for c in cmds for n, _ in c.subcommands)
    return [
        f'{indent}case "$cmd {word}" in',
        f'{indent}    {paths}) cmd="$cmd {word}" ;;',
        f"{indent}esac",
    ]


def _value_cases(cmds: list[Command], indent: str, choices: str, files: str) -> list[str]:
    """`case "$cmd $prev"` arms: an option's choices, or files for any other option's value."""
    lines = [f'{indent}case "$cmd $prev" in']
    rest = []
    for c in cmds:
        for o in c.options:
            if o.choices:
                keys = " | ".join(_single(f"{c.words} {f}") for f in o.flags)
                lines.append(
                    f"{indent}    {keys}) {choices.format(' '.join(o.choices))}; return ;;"
                )
            elif o.takes_value:
                rest += [_single(f"{c.words} {f}") for f in o.flags]
    if rest:
        lines.append(f"{indent}    {' | '.join(rest)}) {files}; return ;;")
    return [*lines, f"{indent}esac"]


def _bash(cmds: list[Command], prog: str) -> str:
    lines = [
        f"# bash completion for {prog}: {prog} completion bash > "
        f"~/.local/share/bash-completion/completions/{prog}",
        f"_{prog}() {{",
        "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}",
        f"    local cmd={prog} opts='' subs='' i",
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        *_walk(cmds, "${COMP_WORDS[i]}", "        "),
        "    done",
        *_value_cases(cmds, "    ", "COMPREPLY=($(compgen -W '{}' -- \"$cur\"))", "COMPREPLY=()"),
        '    case "$cmd" in',
    ]
    for c in cmds:
        opts = " ".join(f for o in c.options for f in o.flags)
        subs = " ".join(n for n, _ in c.offered)
        lines.append(f"        {_single(c.words)}) opts={_single(opts)} subs={_single(subs)} ;;")
    lines += [
        "    esac",
        '    if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
        '    elif [[ -n $subs ]]; then COMPREPLY=($(compgen -W "$subs" -- "$cur"))',
        "    else COMPREPLY=()",  # -o default: the shell completes file names
        "    fi",
        "}",
        f"complete -o default -F _{prog} {prog}",
    ]
    return "\n".join(lines) + "\n"


def _described(name: str, help: str) -> str:
    """One `_describe` entry, `name:help`, its name's colons escaped."""
    return _single(name.replace(":", "\\:") + (f":{help}" if help else ""))


def _zsh(cmds: list[Command], prog: str) -> str:
    lines = [
        f"#compdef {prog}",
        f"# zsh completion for {prog}: `{prog} completion zsh > ~/.zfunc/_{prog}`, with ~/.zfunc",
        "# on $fpath before compinit",
        f"_{prog}() {{",
        "    local cur=${words[CURRENT]} prev=${words[CURRENT-1]}",
        f"    local cmd={prog} i",
        "    local -a opts subs",
        "    for ((i = 2; i < CURRENT; i++)); do",
        *_walk(cmds, "${words[i]}", "        "),
        "    done",
        *_value_cases(cmds, "    ", "compadd -- {}", "_files"),
        '    case "$cmd" in',
    ]
    for c in cmds:
        opts = " ".join(_described(f, o.help) for o in c.options for f in o.flags)
        subs = " ".join(_described(n, h) for n, h in c.offered)
        lines.append(f"        {_single(c.words)}) opts=({opts}) subs=({subs}) ;;")
    lines += [
        "    esac",
        "    if [[ $cur == -* ]]; then _describe -t options option opts",
        "    elif (( ${#subs} )); then _describe -t commands command subs",
        "    else _files",
        "    fi",
        "}",
        f'if [[ $zsh_eval_context[-1] == loadautofunc ]]; then _{prog} "$@"; '
        f"else compdef _{prog} {prog}; fi",
    ]
    return "\n".join(lines) + "\n"


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish(cmds: list[Command], prog: str) -> str:
    paths = " ".join(_fish_quote(f"{c.words} {n}") for c in cmds for n, _ in c.subcommands)
    lines = [
        f"# fish completion for {prog}: {prog} completion fish > "
        f"~/.config/fish/completions/{prog}.fish",
        f"function __{prog}_command",
        f"    set -l cmd {prog}",
        "    for word in (commandline -opc)[2..-1]",
        f'        if contains -- "$cmd $word" {paths}',
        '            set cmd "$cmd $word"',
        "        end",
        "    end",
        "    echo $cmd",
        "end",
    ]
    for c in cmds:
        when = f"-n {_fish_quote(f'test (__{prog}_command) = {_fish_quote(c.words)}')}"
        for name, help in c.offered:
            lines.append(
                f"complete -c {prog} {when} -f -a {_fish_quote(name)} -d {_fish_quote(help)}"
            )
        for o in c.options:
            flags = " ".join(
                f"-l {f[2:]}" if f.startswith("--") else f"-s {f[1:]}" for f in o.flags
            )
            value = f" -x -a {_fish_quote(' '.join(o.choices))}" if o.choices else ""
            value = value or (" -r" if o.takes_value else "")
            lines.append(f"complete -c {prog} {when} {flags}{value} -d {_fish_quote(o.help)}")
    return "\n".join(lines) + "\n"
