"""`regen completion bash|zsh|fish`: scripts built from the parser, read by the real shells."""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import run_cli


@cache
def script(shell: str) -> str:
    out = run_cli("completion", shell)
    assert out.returncode == 0, out.stderr
    return out.stdout


@cache
def commands_and_options() -> dict[str, set[str]]:
    """Each subcommand and the options its own `--help` names, read from the help text (not
    from the parser the scripts are built from)."""
    top = run_cli("--help").stdout
    names = re.findall(r"^    ([a-z]+)(?:\s|$)", top.split("positional arguments:")[1], re.M)
    found = {"": set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", top.split("\n\n")[0]))}
    for name in names:
        usage = run_cli(name, "--help").stdout.split("\n\n")[0]
        found[name] = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", usage))
    return found


def bash_complete(line: str) -> list[str]:
    """What bash offers at the end of `line` (a trailing space: a new word), through the
    function the script registers, as readline would call it."""
    words = line.split() + ([""] if line.endswith(" ") else [])
    array = " ".join(f"'{w}'" for w in words)
    probe = (
        f'eval "$SCRIPT"; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; _regen; '
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run(
        ["bash", "--norc", "-c", probe],
        env={"SCRIPT": script("bash"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_each_script_names_every_subcommand_and_option(shell: str) -> None:
    text = script(shell)
    found = commands_and_options()
    assert len(found) > 10 and "completion" in found and "--format" in found["export"]
    for name, options in found.items():
        assert not name or re.search(rf"\b{name}\b", text), name
        for option in options:
            flag = option if shell != "fish" else re.sub(r"^--?", "", option)
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), (name, option)


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_shell_reads_the_script_without_an_error(shell: str, tmp_path: Path) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed here (bash always is: its test runs everywhere)")
    path = tmp_path / f"regen.{shell}"
    path.write_text(script(shell))
    subprocess.run([shell, "-n", str(path)], check=True, capture_output=True)


def test_bash_offers_commands_options_choices_and_leaves_values_to_file_names() -> None:
    assert "completion" in bash_complete("regen ") and "export" in bash_complete("regen ")
    assert bash_complete("regen exp") == ["export"]
    assert bash_complete("regen export --fo") == ["--format"]
    assert bash_complete("regen export --format ") == [
        "specforge",
        "openai",
        "sharegpt",
        "tokenized",
    ]
    assert bash_complete("regen completion ") == ["bash", "zsh", "fish"]
    assert bash_complete("regen --debug run job.toml --o") == ["--out"]
    # A value with no choices (a path, a number): nothing, so bash's -o default lists files.
    assert bash_complete("regen run job.toml --out ") == []
    assert bash_complete("regen run ") == []


def test_fish_offers_commands_and_an_options_choices(tmp_path: Path) -> None:
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed here")
    path = tmp_path / "regen.fish"
    path.write_text(script("fish"))
    probe = f"source {path}; complete -C 'regen '; echo ---; complete -C 'regen sim --dialect '"
    out = subprocess.run(["fish", "--no-config", "-c", probe], capture_output=True, text=True)
    before, after = (
        {line.split("\t")[0] for line in part.strip().split("\n")}
        for part in out.stdout.split("---")
    )
    assert {"run", "export", "completion"} <= before
    assert after == {"openrouter", "sglang", "vllm"}


ZSH_STUBS = """
compdef() { :; }
compadd() { shift; print -l -- "$@"; }
_describe() { print -l -- "${(@P)4}"; }
_files() { print -- "<files>"; }
"""
"""zsh's completion builtins as plain functions that print what they are given, so that the
script's own choice of words can be read without a terminal."""


def test_zsh_offers_commands_options_choices_and_files(tmp_path: Path) -> None:
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed here")
    path = tmp_path / "_regen"
    path.write_text(script("zsh"))
    lines = ["regen export --format ", "regen ", "regen completion ", "regen run job.toml --out "]
    probe = ZSH_STUBS + f"source {path}\n"
    for line in lines:
        words = " ".join(f"'{w}'" for w in line.split(" "))
        probe += f'words=({words}); CURRENT=${{#words}}; _regen; print -- "---"\n'
    out = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True, check=True)
    formats, commands, shells, files = (p.split() for p in out.stdout.split("---")[:4])
    assert formats == ["specforge", "openai", "sharegpt", "tokenized"]
    assert {"run:regenerate", "export:write", "completion:print"} <= set(commands)
    assert [s.split(":")[0] for s in shells if ":" in s] == ["bash", "zsh", "fish"]
    assert files == ["<files>"]
