# mypy: allow-untyped-calls
"""The run's command, checked before the old run is stopped: its program resolves (PATH as the
run will have it, or a path in the new release) and, for an interpreter or a launcher followed by
a script (`python3 x.py`, `python3 -m pkg`, `torchrun ... x.py`, `bash x.sh`, `uv run x.py`,
`accelerate launch ... x.py`), that script or module exists where the run starts.

Only a simple command is read (words, leading VAR=value assignments, `exec`, `env`, `nohup`);
one with shell syntax (`&&`, `|`, `;`, redirections, `$VAR`, globs, a subshell) is left to the
dry start of its environment: what the shell would make of it cannot be known without running it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess

PYTHONS = re.compile(r"^(python|pypy)[0-9.]*$")
SHELLS = ("sh", "bash", "dash", "zsh", "ksh")
# Launchers whose script is their first `*.py` argument or `-m MODULE` (their own options come
# first, some with a value: `torchrun --nproc_per_node 8 train.py`).
LAUNCHERS = ("torchrun", "deepspeed", "accelerate", "uv", "composer", "colossalai")
PYTHON_VALUE_OPTIONS = ("-W", "-X", "-Q")
SHELL_VALUE_OPTIONS = ("-o", "-O", "+o", "+O")
SHELL_SYNTAX = re.compile(r"[$`*?\[\]{}~\\]")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PREFIXES = ("exec", "nohup", "command")
# What the shell runs itself (POSIX special and regular built-ins, keywords): no program to find.
BUILTINS = frozenset((".", ":", "[", "!", "{", "alias", "bg", "break", "cd", "continue",
    "echo", "eval", "exit", "export", "false", "fg", "getopts", "hash", "if", "for", "case",
    "while", "until", "jobs", "kill", "local", "printf", "pwd", "read", "readonly", "return",
    "set", "shift", "source", "test", "time", "times", "trap", "true", "type", "ulimit",
    "umask", "unalias", "unset", "wait"))  # fmt: skip
# Is the top-level module importable by this interpreter (from where the run starts)? find_spec
# of a top-level name imports nothing of the user's.
FIND_MODULE = (
    "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)"
)


def simple_words(command):
    """The words of `command` if it is one simple command, else None."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:  # an unclosed quote: the dry start says so
        return None
    if not words or any(w and w[0] in "&|;<>()" for w in words):
        return None
    raw = shlex.split(command, posix=False)  # as written: expansions are still visible
    if any(SHELL_SYNTAX.search(w) for w in raw if not w.startswith("'")):
        return None
    return words


def program_and_args(words):
    """Past leading assignments and `exec`/`env`/`nohup`: (program, its arguments)."""
    i = 0
    while i < len(words):
        word = words[i]
        if ASSIGNMENT.match(word) or word in PREFIXES:
            i += 1
        elif word == "env":
            i += 1
            while i < len(words) and (words[i].startswith("-") or ASSIGNMENT.match(words[i])):
                i += 2 if words[i] in ("-u", "--unset", "-C", "--chdir") else 1
        else:
            return word, words[i + 1 :]
    return None, []


def script_of(program, args):
    """(kind, name) of what the program runs: ("file", path), ("module", name) or None."""
    name = os.path.basename(program)
    if PYTHONS.match(name):
        return python_script(args)
    if name in SHELLS:
        return shell_script(args)
    if name in LAUNCHERS:
        return launched_script(args)
    return None


def python_script(args):
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-m" and i + 1 < len(args):
            return ("module", args[i + 1])
        if arg.startswith("-m") and len(arg) > 2:
            return ("module", arg[2:])
        if arg == "-c" or arg.startswith("-c") or arg == "-":
            return None  # code on the command line, or stdin
        if arg in PYTHON_VALUE_OPTIONS:
            i += 2
            continue
        if arg == "--":
            return ("file", args[i + 1]) if i + 1 < len(args) else None
        if arg.startswith("-"):
            i += 1
            continue
        return ("file", arg)
    return None


def shell_script(args):
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-c" or (arg.startswith("-") and "c" in arg[1:] and not arg.startswith("--")):
            return None
        if arg in SHELL_VALUE_OPTIONS:
            i += 2
            continue
        if arg == "--":
            return ("file", args[i + 1]) if i + 1 < len(args) else None
        if arg.startswith(("-", "+")):
            i += 1
            continue
        return ("file", arg)
    return None


def launched_script(args):
    for i, arg in enumerate(args):
        if arg in ("-m", "--module") and i + 1 < len(args):
            return ("module", args[i + 1])
        if arg.startswith("--module="):
            return ("module", arg.split("=", 1)[1])
        if arg.endswith((".py", ".sh")) and not arg.startswith("-"):
            return ("file", arg.split("=", 1)[1] if "=" in arg and arg.startswith("--") else arg)
    return None


class CommandCheck:
    """Where the run starts and what it will find there: `start` (its working directory, as the
    run's shell names it), `moved` ({path: where it will lead by the launch}: the `current` link,
    switched to the new release only after the stop), `coming` (files the deploy installs after
    the checks: the script)."""

    def __init__(self, start, moved, coming, env):
        self.start, self.moved, self.coming, self.env = start, moved, set(coming), env
        self.root = self.path(".")  # the start directory as it will be

    def path(self, name):
        """Where `name` (as the run's shell sees it) will be once the deploy has switched."""
        full = os.path.join(self.start, name)  # an absolute name stays itself
        for old, new in self.moved.items():
            if full == old or full.startswith(old.rstrip("/") + "/"):
                full = new + full[len(old.rstrip("/")) :]
                break
        return os.path.normpath(full)

    def search_path(self):
        value = self.env.get("PATH", os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"))
        return [self.path(entry) for entry in value.split(":") if entry]

    def program(self, word):
        """The program's file, or None when it cannot be found or run."""
        candidates = [self.path(word)] if "/" in word else [
            os.path.join(d, word) for d in self.search_path()]  # fmt: skip
        for path in candidates:
            if path in self.coming or (os.path.isfile(path) and os.access(path, os.X_OK)):
                return path
        return None

    def not_runnable(self, word):
        """Why the program `word` is not found, for the message."""
        if "/" not in word:
            return "is not found on the run's PATH (%s)" % ":".join(self.search_path())
        path = self.path(word)
        if os.path.isfile(path):
            return "(%s) is not executable" % path
        return "does not exist (%s)" % path

    def problem(self, command):
        """Why `command` cannot start as written, or None (also when it cannot be judged)."""
        words = simple_words(command)
        if words is None:
            return None
        word, args = program_and_args(words)
        if word is None or word in BUILTINS:
            return None
        program = self.program(word)
        if program is None:
            return "the command's program %s %s; command: %s" % (
                word, self.not_runnable(word), command)  # fmt: skip
        script = script_of(program, args)
        if script is None:
            return None
        kind, name = script
        if kind == "file":
            path = self.path(name)
            if path in self.coming or os.path.isfile(path):
                return None
            return "the command's script %s does not exist (%s); command: %s" % (
                name, path, command)  # fmt: skip
        return self.module_problem(program, name, command)

    def module_problem(self, program, module, command):
        parts = module.split(".")
        local = self.path(os.path.join(*parts))
        if os.path.isfile(local + ".py") or os.path.isdir(local):
            return None
        top = self.path(parts[0])
        if os.path.isdir(top) or os.path.isfile(top + ".py"):  # the package is here, not the module
            return "the command's module %s does not exist in %s; command: %s" % (
                module, self.root, command)  # fmt: skip
        interpreter = program if PYTHONS.match(os.path.basename(program)) else None
        if interpreter is None:
            return None  # a launcher's own interpreter: not known here
        env = dict(os.environ)
        env.update(self.env)
        try:
            found = subprocess.run(
                [interpreter, "-c", FIND_MODULE, parts[0]], cwd=self.root, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                timeout=30,
            ).returncode  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return None
        if found == 3:
            return "the command's module %s is not found by %s (nor in %s); command: %s" % (
                module, interpreter, self.root, command)  # fmt: skip
        return None
