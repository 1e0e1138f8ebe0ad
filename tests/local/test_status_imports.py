"""What `launcher status` loads: only its own command, workflow and what a connection needs.

Each test runs a fresh interpreter (`sys.modules` and pydantic's built models are per process):
the modules a status imports, in the order its code path imports them, then what is loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.unit.projectfiles import write_project

# What `launcher status` imports on its way, named as its code names them: the group and its
# command (cli/main.py, cli/verify.py), the workflow and its fleet row (the table), the run on
# targets and the report (cli/verify.py's run_status and _report), the connection, the
# configuration, then the SSH libraries a new connection imports.
STATUS_PATH = """
import gc, json, sys
import launcher.cli.main as main
main.cli.commands["status"]
from launcher.commands import table as commands
from launcher.core.requests import StatusRequest
commands.workflow_for(StatusRequest)
commands.wiring(commands.BY_REQUEST[StatusRequest]).row
import launcher.cli.targets, launcher.probe.report, launcher.transport.pool
from launcher.config import models as config
models = [m for m in vars(config).values() if isinstance(m, type)
          and issubclass(m, config.BaseModel) and m.__module__ == config.__name__]
built_at_import = sorted(m.__name__ for m in models if m.__pydantic_complete__)
target = config.load_inventory(config.inventory_path(sys.argv[1])).target("prod")
import launcher.transport.sshopen, tenacity
print(json.dumps({
    "modules": sorted(sys.modules),
    "built_at_import": built_at_import,
    "built": sorted(m.__name__ for m in models if m.__pydantic_complete__),
    "gc": gc.isenabled(),
    "vmid": target.vmid,
}))
"""

# Modules of other commands, and libraries a status has no use for.
NOT_FOR_STATUS = {
    # the other command modules: the group loads a command's module when it is named
    "launcher.cli.buckets",
    "launcher.cli.completion",
    "launcher.cli.deploy",
    "launcher.cli.inventory",
    "launcher.cli.job",
    "launcher.cli.operate",
    "launcher.cli.sandbox",
    "launcher.cli.watch",
    # other workflows
    "launcher.api",
    "launcher.buckets",
    "launcher.deploy.deploy",  # smoke's and deploy's: status's table names DeployOptions only
    "launcher.deploy.localhistory",
    "launcher.deploy.doctor",
    "launcher.probe.htmlreport",
    "launcher.jobs.job",
    "launcher.jobs.deploy",
    "launcher.operate.attach",
    "launcher.operate.disconnect",
    "launcher.operate.history",
    "launcher.operate.logs",
    "launcher.operate.rollback",
    "launcher.operate.stop",
    "launcher.deploy.project",
    "launcher.deploy.releases",
    "launcher.sandbox",
    "launcher.tasks",
    "launcher.watch",
    # only for --junit (verify/report.py's JUnit writer)
    "pyexpat",
    "xml.etree.ElementTree",
    # watch's metrics, buckets' optimizer
    "numpy",
    "prometheus_client",
    # a connection is paramiko's client: Fabric's API (and invoke under it) only when asked for
    "fabric",
    "invoke",
    "launcher.transport.fabricview",
}


def run_python(code: str, *args: str, cwd: Path) -> Any:
    result = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_status_imports_only_what_it_needs(tmp_path: Path) -> None:
    found = run_python(STATUS_PATH, str(write_project(tmp_path)), cwd=tmp_path)
    assert found["vmid"] == 200  # the path ran to its end
    assert "launcher.cli.verify" in found["modules"]
    assert "paramiko" in found["modules"]
    assert sorted(NOT_FOR_STATUS & set(found["modules"])) == []


def test_configuration_models_are_built_when_first_used(tmp_path: Path) -> None:
    """No model builds its validator at import; loading an inventory builds the two it
    validates (their nested models' schemas inside theirs)."""
    found = run_python(STATUS_PATH, str(write_project(tmp_path)), cwd=tmp_path)
    assert found["built_at_import"] == []
    assert {"InventorySpec", "PlaybookSpec"} <= set(found["built"])


def test_the_first_validation_still_names_file_line_and_key(tmp_path: Path) -> None:
    """The models' deferred build changes no error: the first inventory a process reads names
    file, line and key as before."""
    inventory = write_project(tmp_path)
    inventory.write_text(inventory.read_text().replace("port: 22", "port: 70000"))
    code = textwrap.dedent(
        """
        import json, sys
        from launcher.config.models import inventory_path, load_inventory
        from launcher.core.errors import ConfigError
        try:
            load_inventory(inventory_path(sys.argv[1]))
        except ConfigError as error:
            print(json.dumps(str(error)))
        """
    )
    message = run_python(code, str(inventory), cwd=tmp_path)
    assert f"{inventory}:5: hosts.pve.port: Input should be less than or equal to 65535" in message


def test_the_ssh_libraries_load_without_collections(tmp_path: Path) -> None:
    """sshlibs.py pauses the cyclic garbage collector while paramiko loads (dozens of
    collections, a full one among them, that would free nothing),
    and puts it back as it found it: enabled stays enabled, a disabled one stays disabled."""
    code = """
import gc, json
import launcher.transport
collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info))
gc.{}()
import launcher.transport.sshlibs
print(json.dumps([[info["generation"] for info in collections], gc.isenabled()]))
"""
    generations, enabled = run_python(code.format("enable"), cwd=tmp_path)
    # A young collection or two around the pause (when the module itself loads, and after);
    # without it, dozens, a full one among them.
    assert enabled and len(generations) <= 3 and set(generations) <= {0}, generations
    assert run_python(code.format("disable"), cwd=tmp_path) == [[], False]


def test_paramiko_loads_invoke_only_for_a_match_exec(tmp_path: Path) -> None:
    """paramiko.config imports invoke (only to run a `Match exec` command): the SSH libraries
    load without it, its ssh_config parser still runs `Match exec` (invoke loaded then), and an
    `import invoke` afterwards is the real module."""
    code = """
import json, sys
import launcher.transport.sshlibs as sshlibs
loaded = "invoke" in sys.modules
config = sshlibs.paramiko.SSHConfig.from_text(
    "Match exec true\\n  User matched\\nMatch exec false\\n  Port 2\\n"
)
found = config.lookup("anyhost")
import invoke
print(json.dumps([loaded, found.get("user"), found.get("port"), invoke.run.__module__]))
"""
    assert run_python(code, cwd=tmp_path) == [False, "matched", None, "invoke"]
