"""The sandbox sshd's configuration: the sessions' environment in one SetEnv line (sshd keeps
only the first), and the stock HOME that spares each SSH command this machine's ~/.bashrc."""

from __future__ import annotations

from pathlib import Path

from launcher.sandbox import sshd


def setenv_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("SetEnv")]


def test_the_machines_home_by_default_and_a_stock_one_on_request(tmp_path: Path) -> None:
    # A Proxmox node's root session: PAM's variables too (sshd_config's SetEnv stands in).
    node = " ".join(f'"{var}"' for var in sshd.NODE_SESSION_ENV)
    assert '"XDG_RUNTIME_DIR=/run/user/0"' in node and '"LANG=en_US.UTF-8"' in node
    assert setenv_lines(sshd.config_text(tmp_path, 2222)) == [
        f'SetEnv "PATH={tmp_path}/bin:{sshd.SESSION_PATH_TAIL}" {node}'
    ]
    home = tmp_path / "home"
    assert setenv_lines(sshd.config_text(tmp_path, 2222, home=home)) == [
        f'SetEnv "PATH={tmp_path}/bin:{sshd.SESSION_PATH_TAIL}" {node} "HOME={home}"'
    ]


def test_stock_home_holds_debians_root_dotfiles(tmp_path: Path) -> None:
    home = sshd.stock_home(tmp_path / "home")
    assert home.stat().st_mode & 0o777 == 0o700
    bashrc = (home / ".bashrc").read_text()
    stock = sshd.STOCK_DOTFILES / "dot.bashrc"
    if stock.is_file():
        assert bashrc == stock.read_text()
    # nothing in it runs: every line a comment or blank, as in Debian's
    assert all(not line.strip() or line.lstrip().startswith("#") for line in bashrc.splitlines())
    assert (home / ".profile").is_file()
    sshd.stock_home(home)  # again: idempotent
