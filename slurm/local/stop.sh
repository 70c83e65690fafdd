#!/usr/bin/env bash
# Stop the daemons that slurm/local/start.sh started (listed in $CLUSTER_REPRO_SLURM_RECORD,
# default $D/started), by their pid files;
# nothing else. Jobs still queued or running are cancelled first (their slurmstepd processes
# would outlive slurmd otherwise). CLUSTER_REPRO_SLURM_PURGE=1 also deletes $D (state, logs, DB).
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
D=${CLUSTER_REPRO_SLURM_DIR:-/tmp/cluster-repro-slurm}
export SLURM_CONF="$D/etc/slurm.conf"
RECORD=${CLUSTER_REPRO_SLURM_RECORD:-$D/started}
[ -s "$RECORD" ] || { echo "slurm/local/stop.sh: nothing recorded in $RECORD; nothing to stop"; exit 0; }

live() { [ -d "/proc/$1" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
stop_one() { # stop_one NAME PIDFILE
  local name=$1 pidfile=$2 pid
  grep -qxF "$name" "$RECORD" || return 0
  if pid=$(cat "$pidfile" 2>/dev/null) && [ -n "$pid" ] && live "$pid"; then
    kill -TERM "$pid"
    for _ in $(seq 60); do live "$pid" || break; sleep 0.25; done
    if live "$pid"; then echo "slurm/local/stop.sh: $name ($pid) ignored SIGTERM; SIGKILL"; kill -KILL "$pid"; fi
    echo "slurm/local/stop.sh: stopped $name ($pid)"
  fi
  rm -f "$pidfile"
  grep -vxF "$name" "$RECORD" > "$RECORD.tmp"; mv "$RECORD.tmp" "$RECORD"
}

if grep -qx slurmctld "$RECORD" && scontrol ping >/dev/null 2>&1; then
  jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// }" ]; then
    scancel $jobs
    for _ in $(seq 40); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.25; done
  fi
fi
# Reverse start order (slurmctld's helper slurmscriptd exits with it).
# Every slurmd a start recorded ("slurmd@NODE"; one per node, pid file $D/slurmd.NODE.pid).
for entry in $(grep '^slurmd@' "$RECORD"); do stop_one "$entry" "$D/slurmd.${entry#slurmd@}.pid"; done
stop_one slurmctld "$D/slurmctld.pid"
stop_one slurmdbd  "$D/slurmdbd.pid"
stop_one mariadb   "$D/mysqlrun/mariadb.pid"
stop_one munged    "$D/munge/munged.pid"
if [ "${CLUSTER_REPRO_SLURM_PURGE:-0}" = 1 ]; then rm -rf "$D"; echo "slurm/local/stop.sh: removed $D"; fi
exit 0
