"""`launcher completion bash|zsh|fish`: print the shell's completion script."""

from __future__ import annotations

import click

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_LAUNCHER_COMPLETE"


def completion_script(shell: str, group: click.Command | None = None) -> str:
    """The script click generates for `shell`; it calls `launcher` back to complete a word
    (subcommands, options, and -t from the inventory's target and group names). `group` is the
    root command (default: the one running now, so this module never imports cli/main.py)."""
    from click.shell_completion import get_completion_class

    cli = group or click.get_current_context().find_root().command
    completion_class = get_completion_class(shell)
    if completion_class is None:  # click supports all three; a guard for its future
        raise click.UsageError(f"no completion for {shell}")
    return completion_class(cli, {}, "launcher", COMPLETE_VAR).source()


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion_command(shell: str) -> None:
    """Print the shell completion script for SHELL (bash, zsh or fish).

    Target and group names after -t come from the inventory (-i, env LAUNCHER_INVENTORY,
    else ./inventory.yaml).

    \b
    Examples:
      eval "$(launcher completion bash)"            # in ~/.bashrc
      eval "$(launcher completion zsh)"             # in ~/.zshrc
      launcher completion fish > ~/.config/fish/completions/launcher.fish
    Exit codes: 0 printed, 2 unknown shell.
    """
    click.echo(completion_script(shell), nl=False)
