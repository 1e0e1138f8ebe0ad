#!/usr/bin/env bash
# The redeploy people type by hand, one step per ssh command (the baseline launcher is compared to).
#
#   bench/handwritten.sh --host H --port P --key KEY --known-hosts FILE --vmid N \
#       --script LOCAL.py --workdir /root/demo --dest train_demo.py --session demo \
#       --checkpoints checkpoints --command 'python3 train_demo.py' [--env K=V ...] \
#       [--user root] [--control-dir DIR]
#
# Steps (A): scp the script to the host; pct push it into the container (and remove the host
# copy); tmux kill-session; rm -rf the checkpoints; tmux new-session -d; tmux send-keys the
# command. Each step is its own ssh (or scp) connection.
# With --control-dir DIR (B) the same steps share one multiplexed OpenSSH connection
# (ControlMaster=auto, ControlPath in DIR, ControlPersist): the first step opens the master.
# The caller closes it afterwards: ssh -O exit -o ControlPath=DIR/%C -p P USER@H
#
# Quoting: the host's login shell parses each remote command line once, so every argument is
# single-quoted for it; the command typed into the tmux pane is quoted for the pane's shell
# first and then, as one argument, for the host shell.
set -euo pipefail

host="" port=22 user=root key="" known_hosts="" vmid="" script="" workdir="" dest=""
session="" checkpoints="" command="" control_dir=""
envs=()

die() {
  printf 'handwritten.sh: %s\n' "$*" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "option $1 needs a value"
  case "$1" in
    --host) host=$2 ;;
    --port) port=$2 ;;
    --user) user=$2 ;;
    --key) key=$2 ;;
    --known-hosts) known_hosts=$2 ;;
    --vmid) vmid=$2 ;;
    --script) script=$2 ;;
    --workdir) workdir=$2 ;;
    --dest) dest=$2 ;;
    --session) session=$2 ;;
    --checkpoints) checkpoints=$2 ;;
    --command) command=$2 ;;
    --env) envs+=("$2") ;;
    --control-dir) control_dir=$2 ;;
    *) die "unknown option $1" ;;
  esac
  shift 2
done
for name in host key known_hosts vmid script workdir dest session checkpoints command; do
  [ -n "${!name}" ] || die "--${name//_/-} is required"
done
case "$known_hosts" in *'"'*) die "--known-hosts must not contain a double quote" ;; esac

# POSIX single quotes: 'it'\''s' (safe for sh, dash and bash alike).
q() {
  local s=${1//\'/\'\\\'\'}
  printf "'%s'" "$s"
}

# Quote every argument and join with spaces: one remote command line.
qjoin() {
  local out="" arg
  for arg in "$@"; do
    out+="${out:+ }$(q "$arg")"
  done
  printf '%s' "$out"
}

ssh_opts=(
  -F none -i "$key" -o IdentitiesOnly=yes -o BatchMode=yes
  -o "UserKnownHostsFile=\"$known_hosts\"" -o GlobalKnownHostsFile=/dev/null
  -o StrictHostKeyChecking=yes -o ConnectTimeout=10
)
if [ -n "$control_dir" ]; then
  ssh_opts+=(-o ControlMaster=auto -o "ControlPath=$control_dir/%C" -o ControlPersist=60)
fi

# on_host ARGV...: run ARGV on the host, quoted once for its login shell.
on_host() {
  ssh "${ssh_opts[@]}" -p "$port" "$user@$host" "$(qjoin "$@")" </dev/null
}

host_tmp="/tmp/handwritten-$$-$(basename "$dest")"
ct_dest="$workdir/$dest"
typed="cd $(q "$workdir") &&"
for kv in "${envs[@]+"${envs[@]}"}"; do
  case "$kv" in [A-Za-z_]*=*) ;; *) die "--env wants KEY=VALUE, not $kv" ;; esac
  typed+=" ${kv%%=*}=$(q "${kv#*=}")"
done
typed+=" $command"

# 1. the script to the host
scp -q "${ssh_opts[@]}" -P "$port" -- "$script" "$user@$host:$host_tmp"
# 2. into the container (and the host copy removed, in the same ssh command)
ssh "${ssh_opts[@]}" -p "$port" "$user@$host" \
  "$(qjoin pct push "$vmid" "$host_tmp" "$ct_dest") && $(qjoin rm -f -- "$host_tmp")" </dev/null
# 3. stop the old run (absent session: not an error)
on_host pct exec "$vmid" -- tmux kill-session -t "$session" 2>/dev/null || true
# 4. old checkpoints gone
on_host pct exec "$vmid" -- rm -rf -- "$workdir/$checkpoints"
# 5. a new session
on_host pct exec "$vmid" -- tmux new-session -d -s "$session" -c "$workdir"
# 6. the command typed into it
on_host pct exec "$vmid" -- tmux send-keys -t "$session" "$typed" Enter
