"""`launcher inventory check`: validate the inventory and every playbook, show the resolved view."""

from __future__ import annotations

from typing import Any

import click

from launcher.cli.context import AppContext, global_options, pass_app


@click.group()
def inventory() -> None:
    """Inspect the inventory (hosts, targets, playbooks).

    \b
    Example:
      launcher -i inventory.yaml inventory check
    """


@inventory.command("check")
@global_options
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the resolved view as JSON (schema launcher.inventory/1).",
)
@pass_app
def check(app: AppContext, as_json: bool) -> None:
    """Validate inventory.yaml and every playbook it names; print one line per problem.

    \b
    Example:
      launcher -i inventory.yaml inventory check
      launcher inventory check --json | jq '.targets[] | select(.target == "prod")'
    Identity files named in the inventory must exist and be readable; loose permissions,
    a missing known_hosts file and a check the playbook's status format can never feed
    (a queue a preset's lines do not print) are warnings.
    Exit codes: 0 valid, 2 a problem (each printed on stderr with its file and key).
    """
    from launcher.config.models import check_all, inventory_path
    from launcher.core.errors import ConfigError
    from launcher.deploy.keyfiles import key_file_findings

    inv, targets, problems = check_all(inventory_path(app.inventory_option))
    key_problems, warnings = key_file_findings(inv)
    for warning in [*warnings, *_check_warnings(targets)]:
        click.echo(f"warning: {warning}", err=True)
    problems.extend(key_problems)
    if problems:
        raise ConfigError(problems)
    target_views: dict[str, dict[str, Any]] = {
        t.name: {
            "target": t.name,
            "host": t.host_name,
            "vmid": t.vmid,
            "playbook": str(t.playbook.path),
            "session": t.playbook.spec.session,
            "workdir": t.playbook.spec.workdir,
            # A project playbook: its directory, and `current`, where its release runs.
            "script": str(t.playbook.script_source or t.playbook.project_source),
            "dest": t.playbook.dest_path or f"{t.playbook.spec.workdir}/current",
            "checkpoints": t.playbook.checkpoints_path,
            "command": t.playbook.spec.command,
            "gpus": t.playbook.spec.gpus,
        }
        for t in targets
    }
    if as_json:
        from launcher.output.jsonout import emit, envelope

        emit(
            envelope(
                "inventory",
                list(target_views.values()),
                exit_code=0,
                per_target=False,
                inventory=str(inv.path),
                default_target=inv.spec.default_target,
                hosts={name: host.model_dump() for name, host in inv.spec.hosts.items()},
                groups=inv.spec.groups,
            )
        )
        return
    click.echo(f"{inv.path}: ok ({len(targets)} targets, {len(inv.spec.hosts)} hosts)")
    for name, host in inv.spec.hosts.items():
        click.echo(
            f"  host {name}: {host.user}@{host.address}:{host.port} ({host.host_key_policy})"
        )
    for name, t in target_views.items():
        default = "  (default)" if name == inv.spec.default_target else ""
        click.echo(
            f"  target {name}: {t['host']} CT {t['vmid']}, session {t['session']}, "
            f"{t['dest']}{default}"
        )


def _check_warnings(targets: list[Any]) -> list[str]:
    """Each playbook's checks that name a field its status format cannot produce."""
    from launcher.config.yamlsource import load_yaml
    from launcher.verify.fieldcheck import unproducible

    found: list[str] = []
    seen: set[str] = set()
    for target in targets:
        playbook = target.playbook
        if str(playbook.path) in seen:
            continue
        seen.add(str(playbook.path))
        findings = unproducible(playbook.spec.status, playbook.spec.verify)
        if findings:
            document = load_yaml(playbook.path, what="playbook")
            found.extend(document.problem(where, message) for where, message in findings)
    return found
