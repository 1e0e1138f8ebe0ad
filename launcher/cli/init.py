"""`launcher init`: from nothing to an inventory, a playbook that reads the trainer's own lines,
and a doctor run. Each answer is asked for unless given as a flag; the host key is shown by its
fingerprint and written to known_hosts only when confirmed; existing files are kept unless
--force."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from launcher.cli.context import AppContext, global_options, pass_app
from launcher.core.errors import HostKeyError, LauncherError, UsageError
from launcher.core.params import TRIAL

if TYPE_CHECKING:
    from launcher.deploy.init import HostKey

HOST_KEY_TIMEOUT = 10.0


@click.command("init")
@click.option("--host", "host_text", metavar="[USER@]ADDRESS[:PORT]", help="The Proxmox node.")
@click.option("--port", type=click.IntRange(1, 65535), default=22, show_default=True,
              help="SSH port, unless the host says one.")  # fmt: skip
@click.option("--user", default="root", show_default=True, help="SSH user, unless the host says.")
@click.option("--vmid", type=click.IntRange(100, 999_999_999), help="The container (CT) ID.")
@click.option("--trainer", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The training script on this machine.")  # fmt: skip
@click.option("--command", "command", help="How to run it in the workdir (default: python3 FILE).")
@click.option("--name", help="Target, playbook and tmux session name (default: the script's).")
@click.option("--gpus", type=click.IntRange(0, 256), default=0, show_default=True,
              help="GPUs the run uses (0: no GPU checks).")  # fmt: skip
@click.option("--identity-file", metavar="FILE", help="Key file to write into the inventory.")
@click.option("--sample", type=click.Path(dir_okay=False, path_type=Path),
              help="A log of the trainer's output to find its status lines in (else asked; "
              "none: a trial run in the container).")  # fmt: skip
@click.option("--trial-seconds", type=TRIAL, default=20.0, show_default=True, metavar="DURATION",
              help="How long the trial run lasts: 20, 45s, 2m; 2 s to 10 min.")  # fmt: skip
@click.option("--yes", "-y", "trust", is_flag=True, help="Trust the host key shown, unasked.")
@click.option("--force", is_flag=True, help="Replace an existing inventory or playbook.")
@click.option("--no-doctor", is_flag=True, help="Do not run doctor at the end.")
@global_options
@pass_app
def init_command(
    app: AppContext,
    host_text: str | None,
    port: int,
    user: str,
    vmid: int | None,
    trainer: Path | None,
    command: str | None,
    name: str | None,
    gpus: int,
    identity_file: str | None,
    sample: Path | None,
    trial_seconds: float,
    trust: bool,
    force: bool,
    no_doctor: bool,
) -> None:
    """Write inventory.yaml and a playbook for one trainer, then run doctor.

    Asks for the host, the VMID, the training script and its command (each also a flag),
    shows the host key's SHA256 fingerprint and adds it to known_hosts (--known-hosts, else
    ~/.ssh/known_hosts) only when you confirm it, and finds the playbook's `status:` block in
    the trainer's own output: a log you name, or a short trial run of the command in the
    container (in a temporary directory, stopped with C-c after --trial-seconds, removed).
    Existing files are never replaced without --force.

    \b
    Example:
      launcher init
      launcher init --host root@10.1.2.6 --vmid 200 --trainer train.py --sample train.log
    Exit codes: 0 written and doctor passed, 2 bad input or files exist, 3 unreachable or host
    key not trusted, else doctor's.
    """
    from launcher.deploy import init

    inventory = Path(app.inventory_option or "inventory.yaml")
    if app.inventory_from_env:  # a shell's LAUNCHER_INVENTORY is where it works, not new
        inventory = Path("inventory.yaml")
    _refuse_existing([inventory], force)
    user, address, port = init.parse_host(
        host_text or click.prompt("Proxmox host ([user@]address[:port])"), port=port, user=user
    )
    known_hosts = Path(
        os.environ.get("LAUNCHER_KNOWN_HOSTS") or os.path.expanduser("~/.ssh/known_hosts")
    )
    _trust_host_key(init.host_key(address, port, HOST_KEY_TIMEOUT), known_hosts, trust)
    vmid = vmid or click.prompt("Container VMID", type=click.IntRange(100, 999_999_999))
    trainer = trainer or click.prompt(
        "Training script on this machine",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
    )
    command = command or click.prompt("Command that runs it", default=f"python3 {trainer.name}")
    name = init.check_name(name or click.prompt("Name", default=init.default_name(trainer)))
    playbook = init.playbook_path(inventory, name)
    _refuse_existing([playbook], force)
    if sample is None:
        answer = click.prompt(
            f"A log of its output to read the status lines from (empty: a {trial_seconds:g} s "
            f"trial run in CT {vmid})",
            default="",
            show_default=False,
        )
        sample = Path(answer) if answer.strip() else None
    answers = init.Answers(
        address, port, user, vmid, trainer, command, name, gpus, identity_file=identity_file
    )
    header = "# written by launcher init\n"
    init.write_yaml(inventory, init.inventory_document(answers, playbook, inventory), header)
    init.write_yaml(playbook, init.playbook_document(answers, playbook, None), header)
    click.echo(f"wrote {inventory} and {playbook}", err=True)
    status = _find_status(app, inventory, name, sample, trial_seconds)
    if status:
        note = f"# written by launcher init; status: read from {status[1]}\n"
        init.write_yaml(playbook, init.playbook_document(answers, playbook, status[0]), note)
    click.echo(f"next: launcher -i {inventory} deploy   then: launcher verify", err=True)
    if no_doctor:
        return
    from launcher.cli.operate import doctor_command

    app.inventory_option, app.inventory_from_env = str(inventory), False
    app.target_names[:] = [name]
    doctor_command.run(app, {})


def _refuse_existing(paths: list[Path], force: bool) -> None:
    from launcher.deploy.init import existing

    found = existing(paths)
    if found and not force:
        raise UsageError(
            f"{', '.join(map(str, found))} exists: nothing written",
            hint="--force replaces it, or -i names another inventory",
        )


def _trust_host_key(key: HostKey, known_hosts: Path, trust: bool) -> None:
    from launcher.deploy import init

    state = init.host_key_state(known_hosts, key)
    if state == "same":
        click.echo(f"host key {key.key_type} {key.fingerprint}: known ({known_hosts})", err=True)
        return
    if state == "changed":
        raise HostKeyError(
            f"{key.entry}: host key CHANGED: {known_hosts} holds another {key.key_type} key; "
            f"the host offers {key.fingerprint}",
            hint=f"if the host was reinstalled: ssh-keygen -R '{key.entry}' -f {known_hosts}",
        )
    click.echo(f"{key.entry} offers the host key {key.key_type} {key.fingerprint}", err=True)
    question = f"Is this the host's key? Add it to {known_hosts}"
    if not (trust or click.confirm(question, default=False, err=True)):
        raise HostKeyError(
            f"{key.entry}: host key not trusted: nothing written",
            hint="compare it on the host: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub",
        )
    init.trust_host_key(known_hosts, key)
    click.echo(f"added to {known_hosts}", err=True)


def _find_status(
    app: AppContext, inventory: Path, name: str, sample: Path | None, seconds: float
) -> tuple[dict[str, object], str] | None:
    """The `status:` block the trainer's lines need (None: none needed, or none found)."""
    from launcher.config.models import load_inventory
    from launcher.deploy import init
    from launcher.output.termsafe import sanitize

    if sample is not None:
        lines, origin = init.sample_lines(sample), str(sample)
    else:
        target = load_inventory(inventory).target(name)
        click.echo(f"trial run in {target.label}: {seconds:g} s of its output", err=True)
        try:
            lines, origin = init.trial_lines(target, seconds), f"a {seconds:g} s trial run"
        except LauncherError as exc:
            click.echo(f"no trial run: {exc.message}", err=True)
            return None
    found = init.detect(lines)
    shown = [f"  | {sanitize(line, keep_sgr=False)[:120]}" for line in found.examples]
    if found.status is None:
        click.echo(f"no status: block found ({found.explanation}):", err=True)
        click.echo("\n".join(shown), err=True)
        click.echo(f"once it runs: launcher status-format detect -t {name}", err=True)
        return None
    click.echo(f"status lines: {found.explanation}", err=True)
    click.echo("\n".join(shown), err=True)
    return (found.status, origin) if found.status else None
