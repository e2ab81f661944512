"""`vgpuctl completion bash|zsh`: a completion script generated from the argparse parser itself.

The script knows the subcommands, each one's flags, the values of flags with choices (`-o`,
`--log-level`), files for flags that take a path, and kubeconfig contexts for `--context`, so it
cannot drift from the parser. zsh runs the same script through its bash emulation (bashcompinit).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterable

# The names the program is installed under (pyproject.toml [project.scripts]).
NAMES = ("vgpuctl", "kubectl-vgpu")
# Flags whose value is a file or directory, known by their metavar.
PATH_METAVARS = frozenset({"PATH", "FILE"})
FUNCTION = "_vgpuctl"


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings]


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _value_rule(action: argparse.Action) -> str | None:
    """The bash that completes this flag's value; None for a flag that takes none."""
    if action.nargs == 0:
        return None
    if action.choices:
        return f'COMPREPLY=($(compgen -W {_words(map(str, action.choices))} -- "$cur"))'
    if action.metavar in PATH_METAVARS:
        # compopt (bash) adds the `/` after directories; zsh's bash emulation lacks it
        return ('type compopt &>/dev/null && compopt -o filenames 2>/dev/null; '
                'COMPREPLY=($(compgen -f -- "$cur"))')
    if action.dest == "context":
        return 'COMPREPLY=($(compgen -W "$(kubectl config get-contexts -o name 2>/dev/null)" -- "$cur"))'
    return "COMPREPLY=()"  # a free value (a name): nothing to offer


def _words(words: Iterable[str]) -> str:
    return shlex.quote(" ".join(words))


def _function(parser: argparse.ArgumentParser) -> str:
    commands = _commands(parser)
    scopes = {"": parser, **commands}
    patterns: dict[str, list[str]] = {}  # one case branch per rule: the common flags share theirs
    words: list[str] = []
    for name, scope in scopes.items():
        for action in _options(scope):
            rule = _value_rule(action)
            if rule is not None:
                patterns.setdefault(rule, []).extend(f'"{name}/{flag}"' for flag in action.option_strings)
        offered = [flag for action in _options(scope) for flag in action.option_strings]
        offered += [str(c) for a in scope._actions if not a.option_strings and a.choices
                    and not isinstance(a, argparse._SubParsersAction) for c in a.choices]
        if not name:
            offered = list(commands) + offered
        words.append(f'        "{name}") COMPREPLY=($(compgen -W {_words(offered)} -- "$cur")) ;;')
    return "\n".join([
        f"{FUNCTION}() {{",
        '    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} command="" i',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        "        case ${COMP_WORDS[i]} in",
        f"            {'|'.join(commands)}) command=${{COMP_WORDS[i]}}; break ;;",
        "        esac",
        "    done",
        '    case "$command/$prev" in',
        *(f"        {'|'.join(names)}) {rule}; return ;;" for rule, names in patterns.items()),
        "    esac",
        '    case "$command" in',
        *words,
        "    esac",
        "}",
        f"complete -F {FUNCTION} {' '.join(NAMES)}",
        "",
    ])


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The script for `shell` (bash or zsh), to `source <(vgpuctl completion SHELL)`."""
    header = [f"# {' and '.join(NAMES)} completion for {shell}: source <({NAMES[0]} completion {shell})"]
    if shell == "zsh":
        header = [f"#compdef {' '.join(NAMES)}", *header, "autoload -U +X bashcompinit && bashcompinit"]
    return "\n".join([*header, _function(parser)])
