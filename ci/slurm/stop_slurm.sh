#!/usr/bin/env bash
# Stop exactly the daemons ci/slurm/start_slurm.sh started, by their pid files in the state dir:
# slurmd, slurmctld and (only if start_slurm.sh started it) munged, after cancelling the jobs left
# on that cluster. Safe to call twice.
set -uo pipefail

STATE=${FASTSLOW_SLURM_DIR:-/tmp/fastslow-slurm}

stop() {  # stop <name> <pidfile>: SIGTERM, wait up to 15 s, then SIGKILL
  local name=$1 pidfile=$2 pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; echo "stop_slurm: $name ($pid) killed" >&2
    else echo "stop_slurm: $name ($pid) stopped" >&2; fi
  fi
  rm -f "$pidfile"
}

# Jobs still on this private cluster (e.g. a test that timed out): cancel them first, bounded wait,
# so no slurmstepd outlives its slurmd.
if [[ -f $STATE/slurm.conf && -f $STATE/slurmctld.pid ]] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null; then
  export SLURM_CONF=$STATE/slurm.conf
  jobs=$(timeout 10 squeue -h -t PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED -o %i 2>/dev/null | tr '\n' ' ')
  if [[ -n ${jobs// } ]]; then
    echo "stop_slurm: cancelling jobs $jobs" >&2
    # shellcheck disable=SC2086
    timeout 10 scancel $jobs 2>/dev/null || true
    for _ in $(seq 1 30); do
      [[ -z $(timeout 10 squeue -h -t RUNNING,COMPLETING -o %i 2>/dev/null) ]] && break
      sleep 0.5
    done
  fi
fi

stop slurmd "$STATE/slurmd.pid"
stop slurmctld "$STATE/slurmctld.pid"
stop munged "$STATE/munged.pid"
# The /etc/slurm/slurm.conf link start_slurm.sh made, if it still points at this state dir.
if [[ -L /etc/slurm/slurm.conf && $(readlink /etc/slurm/slurm.conf) == "$STATE/slurm.conf" ]]; then
  rm -f /etc/slurm/slurm.conf
fi
exit 0
