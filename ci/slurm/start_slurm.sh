#!/usr/bin/env bash
# Start a one-node SLURM cluster on this machine (slurmctld + slurmd on 127.0.0.1, munge auth),
# for the tests' SLURM build (tests/test_slurm.py, tests/test_workflow_figures.py) and for trying
# profiles/slurm without a real cluster.
#
#   eval "$(ci/slurm/start_slurm.sh)"     # prints `export SLURM_CONF=...` on stdout
#   ... sbatch / snakemake --profile profiles/slurm ...
#   ci/slurm/stop_slurm.sh                # stops exactly the daemons this script started
#
# Needs root (daemons run as root, SlurmUser=root) and, if SLURM is not installed yet, apt-get
# (Debian packages slurm-wlm and munge). No cgroups: proctrack/linuxproc and task/none, so it works
# in an unprivileged container. No accounting database: finished jobs stay visible to
# squeue/scontrol for MinJobAge (1 h) and are appended to $STATE/jobcomp.log (jobcomp/filetxt).
#
# Environment (all optional):
#   FASTSLOW_SLURM_DIR        state dir: slurm.conf, pid files, logs, spool   [/tmp/fastslow-slurm]
#   FASTSLOW_SLURM_PARTITION  name of the single partition                   [fastslow]
#   FASTSLOW_SLURMCTLD_PORT   slurmctld port                                 [6817]
#   FASTSLOW_SLURMD_PORT      slurmd port                                    [6818]
#   FASTSLOW_SLURM_TIMEOUT    seconds to wait for the node to become idle     [60]
# Exit codes: 0 started (or already running from this state dir), 2 cannot run here (not root,
# no apt-get, install failed), 3 daemons did not come up (see $STATE/log/*.log).
set -euo pipefail

STATE=${FASTSLOW_SLURM_DIR:-/tmp/fastslow-slurm}
PARTITION=${FASTSLOW_SLURM_PARTITION:-fastslow}
CTLD_PORT=${FASTSLOW_SLURMCTLD_PORT:-6817}
SLURMD_PORT=${FASTSLOW_SLURMD_PORT:-6818}
TIMEOUT=${FASTSLOW_SLURM_TIMEOUT:-60}
CONF=$STATE/slurm.conf

say() { echo "start_slurm: $*" >&2; }
alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

if [[ $(id -u) -ne 0 ]]; then say "needs root (daemons run as root)"; exit 2; fi

# --- 1. packages --------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
   || ! command -v sbatch >/dev/null; then
  if ! command -v apt-get >/dev/null; then say "SLURM is not installed and there is no apt-get"; exit 2; fi
  say "installing slurm-wlm and munge from Debian (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  if ! { apt-get update -q && apt-get install -y -q --no-install-recommends slurm-wlm munge; } >&2; then
    say "apt-get install slurm-wlm munge failed"; exit 2
  fi
fi

mkdir -p "$STATE"/{log,spool,state,munge}
chmod 755 "$STATE"

# Already running from this state dir: nothing to do (idempotent).
if alive "$STATE/slurmctld.pid" && alive "$STATE/slurmd.pid" && SLURM_CONF=$CONF sinfo -h >/dev/null 2>&1; then
  say "already running ($STATE)"; echo "export SLURM_CONF=$CONF"; exit 0
fi

# --- 2. munge -----------------------------------------------------------------------------------
# Reuse a munged already listening on the default socket (not ours: never stopped by us);
# otherwise start one as the munge user and record its pid in $STATE/munged.pid.
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [[ ! -s /etc/munge/munge.key ]]; then
    say "creating /etc/munge/munge.key"
    if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key >&2
    else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
  fi
  id munge >/dev/null 2>&1 || { say "no munge user"; exit 2; }
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge /etc/munge/munge.key "$STATE/munge"
  chmod 0755 /run/munge; chmod 0700 /etc/munge /var/log/munge /var/lib/munge; chmod 0400 /etc/munge/munge.key
  rm -f "$STATE/munge/munged.pid"
  runuser -u munge -- munged --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log" >&2
  for _ in $(seq 1 50); do
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.1
  done
  if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "munged did not start (see $STATE/munge/munged.log)"; exit 3
  fi
  cp "$STATE/munge/munged.pid" "$STATE/munged.pid"
  say "munged started (pid $(cat "$STATE/munged.pid"))"
else
  say "reusing the munged already running"
fi

# --- 3. slurm.conf: one node, this machine's real CPUs and memory --------------------------------
HOST=$(hostname -s)
NODE_LINE=$(slurmd -C | sed -n 1p)               # NodeName=<host> CPUs=.. ... RealMemory=..
cat > "$CONF" <<CONF
# Written by ci/slurm/start_slurm.sh: a one-node cluster on 127.0.0.1, no cgroups, no accounting.
ClusterName=fastslow
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.log
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MinJobAge=3600
KillWait=10
SlurmdTimeout=60
InactiveLimit=0
$NODE_LINE NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$CONF

# Job steps need the config without SLURM_CONF: snakemake's slurm-jobstep executor strips SLURM_*
# variables before its nested `srun`, which then reads the compiled-in /etc/slurm/slurm.conf. Link
# that to ours; never replace a slurm.conf that is not ours or belongs to a cluster still running.
SYS_CONF=/etc/slurm/slurm.conf
if [[ -L $SYS_CONF ]]; then
  target=$(readlink -f "$SYS_CONF" || true)
  if [[ $target != "$(readlink -f "$CONF")" && -f $target ]]; then
    other=$(dirname "$target")
    if ! grep -q "Written by ci/slurm/start_slurm.sh" "$target" || alive "$other/slurmctld.pid"; then
      say "$SYS_CONF links to $target (another cluster); stop it first"; exit 2
    fi
  fi
elif [[ -e $SYS_CONF ]]; then
  say "$SYS_CONF exists and is not ours: this machine has a SLURM installation; not touching it"; exit 2
fi
mkdir -p /etc/slurm
ln -sfn "$CONF" "$SYS_CONF"

# --- 4. daemons ---------------------------------------------------------------------------------
rm -f "$STATE/slurmctld.pid" "$STATE/slurmd.pid"
slurmctld -f "$CONF" -c >&2 || { say "slurmctld failed (see $STATE/log/slurmctld.log)"; exit 3; }
slurmd -f "$CONF" >&2 || { say "slurmd failed (see $STATE/log/slurmd.log)"; exit 3; }

# --- 5. wait (bounded) until the node is idle -------------------------------------------------------
deadline=$((SECONDS + TIMEOUT))
state=""
while (( SECONDS < deadline )); do
  state=$(sinfo -h -N -o '%T' 2>/dev/null | head -1 || true)
  [[ $state == idle ]] && break
  sleep 1
done
if [[ $state != idle ]]; then
  say "node not idle after ${TIMEOUT}s (state: '${state:-none}'); see $STATE/log/"
  tail -n 20 "$STATE"/log/*.log >&2 || true
  exit 3
fi
say "cluster up: $(sinfo -h -o '%P %a %D %T %c CPUs %m MB' | head -1) (slurmctld $(cat "$STATE/slurmctld.pid"), slurmd $(cat "$STATE/slurmd.pid"))"
echo "export SLURM_CONF=$CONF"
