#!/usr/bin/env bash
# Start a REAL SLURM cluster on this machine, for tests and CI (Debian/Ubuntu, root, no systemd
# needed): one node by default, or several nodes on this one host (one slurmd each, with its own
# port, spool, log and pid file). Installs Debian's slurm-wlm packages when they are missing.
#
#   bash slurm/local/start.sh            # then: source "$CLUSTER_REPRO_SLURM_DIR/env" (default below)
#   bash slurm/local/stop.sh             # stops only what this script started
#
# Daemons: munged (a private one, on a socket under $D), mariadbd + slurmdbd (accounting: `sacct`
# must know every job, or submitit waits forever on a job that died without writing its result:
# scancel, kill -9, node failure), slurmctld, one slurmd per node. Each node advertises 4 fake GPUs
# (gres/gpu files that are links to /dev/null), so jobs asking --gpus-per-node=4 schedule and see
# CUDA_VISIBLE_DEVICES=0,1,2,3.
#
# Nothing under /etc/slurm is touched: the config lives in $D/etc and clients find it through
# SLURM_CONF (written to $D/env). Idempotent: a daemon whose pid file names a live process is left
# alone; every daemon this script starts is listed in $CLUSTER_REPRO_SLURM_RECORD (default
# $D/started), which stop.sh reads: give both the same private record to stop exactly what one
# start started (CI and the test fixture do).
#
# Knobs (environment):
#   CLUSTER_REPRO_SLURM_DIR=/tmp/cluster-repro-slurm  state, spool, logs, pid files, private DB
#   CLUSTER_REPRO_SLURM_CPUS=16      CPUs advertised (more than the machine has: a 4-task job
#                                    would pend forever on 2 real cores otherwise)
#   CLUSTER_REPRO_SLURM_GPUS=4       fake GPUs per node; 0 for none
#   CLUSTER_REPRO_SLURM_NODES=1      nodes; 1: one node named `hostname -s`; N > 1: nodes
#                                    127.0.0.[1-N], one slurmd each (see "Nodes" below)
#   CLUSTER_REPRO_SLURM_PORT=6817    slurmctld's port; slurmd of the first node PORT+1, slurmdbd
#                                    PORT+2, slurmd of node k > 1 PORT+1+k. Change it (and the DB
#                                    port and the dir) to run a second cluster beside another one.
#   CLUSTER_REPRO_SLURM_DB_PORT=3307 the private MariaDB's port (127.0.0.1 only)
#
# Nodes: with N > 1 each node is named by a loopback address (127.0.0.1 .. 127.0.0.N), because a
# job's rendezvous (repro/core/distributed.py) uses the first name of SLURM_JOB_NODELIST as the
# torch.distributed master address, as on a real cluster, so node names must resolve; loopback
# addresses do on every machine without editing /etc/hosts. The job's node list then reads
# `127.0.0.[1-2]`, SLURM's compressed form.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

D=${CLUSTER_REPRO_SLURM_DIR:-/tmp/cluster-repro-slurm}
CPUS=${CLUSTER_REPRO_SLURM_CPUS:-16}
GPUS=${CLUSTER_REPRO_SLURM_GPUS:-4}
NODES=${CLUSTER_REPRO_SLURM_NODES:-1}
PORT=${CLUSTER_REPRO_SLURM_PORT:-6817}
DBPORT=${CLUSTER_REPRO_SLURM_DB_PORT:-3307}
MEM=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
# NAMES: the node names; NODELIST: the same in SLURM's compressed form
if [ "$NODES" -gt 1 ]; then
  NAMES=$(seq -f '127.0.0.%g' 1 "$NODES"); NODELIST="127.0.0.[1-$NODES]"
else
  NAMES=$(hostname -s); NODELIST=$NAMES
fi
DBDPORT=$((PORT + 2))
# slurmd_port K: the port of node K's slurmd (K = 1..NODES)
slurmd_port() { if [ "$1" = 1 ]; then echo $((PORT + 1)); else echo $((PORT + 1 + $1)); fi; }
MUNGE_SOCK="$D/munge/munge.socket"
ETC="$D/etc"
RECORD=${CLUSTER_REPRO_SLURM_RECORD:-$D/started}
export SLURM_CONF="$ETC/slurm.conf"
T0=$(date +%s%N)

say() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '[slurm-local %d.%02ds] %s\n' $((ms / 1000)) $((ms % 1000 / 10)) "$*"; }
fail() { echo "slurm/local/start.sh: ERROR: $*" >&2; exit 1; }
case "$NODES" in ''|*[!0-9]*|0) fail "CLUSTER_REPRO_SLURM_NODES must be a whole number >= 1, got '$NODES'" ;; esac
[ "$(id -u)" = 0 ] || fail "needs root (it installs packages and starts daemons); run it as root or use an existing cluster"

# running(pidfile): the pid file names a live, non-zombie process
running() { local p; p=$(cat "$1" 2>/dev/null) || return 1
            [ -n "$p" ] && [ -d "/proc/$p" ] && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ]; }
# until_ok SECONDS WHAT CMD...: retry every 0.25 s, fail naming WHAT and the log folder
until_ok() { local n=$(( $1 * 4 )) what=$2; shift 2
             for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.25; done
             fail "timed out waiting for $what (logs: $D/log)"; }
started() { grep -qx "$1" "$RECORD" 2>/dev/null || echo "$1" >> "$RECORD"; }

# ------------------------------------------------------------------ packages
want="slurmctld slurmd slurm-client slurmdbd munge mariadb-server"
missing=""
for p in $want; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  command -v apt-get >/dev/null || fail "packages missing ($missing) and no apt-get to install them"
  say "installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d 101: the packages' postinst must not try to start daemons (no systemd here)
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d.cluster-repro; chmod +x /usr/sbin/policy-rc.d.cluster-repro
  [ -e /usr/sbin/policy-rc.d ] || ln -s policy-rc.d.cluster-repro /usr/sbin/policy-rc.d
  apt-get install -y -qq --no-install-recommends $missing > "${TMPDIR:-/tmp}/cluster-repro-apt.log" 2>&1 ||
    fail "apt-get install$missing failed; see ${TMPDIR:-/tmp}/cluster-repro-apt.log"
  [ "$(readlink /usr/sbin/policy-rc.d 2>/dev/null)" = policy-rc.d.cluster-repro ] && rm -f /usr/sbin/policy-rc.d
  rm -f /usr/sbin/policy-rc.d.cluster-repro
fi
say "packages present: $(slurmctld -V)"

# ------------------------------------------------------------------ config
mkdir -p "$D"/{state,spool,log,gpu} "$ETC"
touch "$RECORD"
gres_types=""; node_gres=""; tres=""
: > "$ETC/gres.conf"
if [ "$GPUS" -gt 0 ]; then
  # A GPU needs a device file: regular files are rejected and file-less GPUs dropped, so each
  # fake GPU is a link to /dev/null.
  for i in $(seq 0 $((GPUS - 1))); do ln -sfn /dev/null "$D/gpu/nvidia$i"; done
  gres_types="GresTypes=gpu"; node_gres="Gres=gpu:$GPUS"; tres="AccountingStorageTRES=gres/gpu"
  printf 'AutoDetect=off\nNodeName=%s Name=gpu File=%s/gpu/nvidia[0-%d]\n' \
    "$NODELIST" "$D" $((GPUS - 1)) > "$ETC/gres.conf"
fi
node_lines=""; k=0
for name in $NAMES; do
  k=$((k + 1))
  node_lines="${node_lines}NodeName=$name NodeAddr=127.0.0.1 Port=$(slurmd_port $k) CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM $node_gres State=UNKNOWN
"
done
cat > "$ETC/slurm.conf" <<EOF
# Written by cluster-repro slurm/local/start.sh: a test cluster of $NODES node(s) on one host.
ClusterName=cluster-repro
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
CredType=cred/munge
MpiDefault=none
# No cgroups here: track processes through /proc, bind no tasks.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBDPORT
# The munge socket for talking to slurmdbd (AuthInfo is for the other daemons and clients).
AccountingStoragePass=$MUNGE_SOCK
$tres
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
SchedulerType=sched/backfill
# Schedule at once (submit-to-start about a second); cancel jobs whose dependency failed.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,kill_invalid_depend
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MailProg=/bin/true
SlurmctldPidFile=$D/slurmctld.pid
# %n: the node name, so that several slurmd on this host keep apart.
SlurmdPidFile=$D/slurmd.%n.pid
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldPort=$PORT
SlurmdPort=$(slurmd_port 1)
$gres_types
MinJobAge=300
KillWait=5
InactiveLimit=0
Waittime=0
${node_lines}PartitionName=debug Nodes=$NODELIST Default=YES MaxTime=INFINITE State=UP
EOF
printf 'export SLURM_CONF=%s\n' "$SLURM_CONF" > "$D/env"

# ------------------------------------------------------------------ munge
# A private munged on a socket under $D (AuthInfo in both configs): a cluster never uses another's
# munged, so stopping one cluster cannot break another started beside it.
if running "$D/munge/munged.pid"; then say "munged already running"
else
  install -d -o munge -g munge -m 0700 /etc/munge
  install -d -o munge -g munge -m 0755 "$D/munge"   # munged (user munge) writes socket, pid, seed, log here
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null ||
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
  chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
  rm -f "$MUNGE_SOCK" "$MUNGE_SOCK.lock" "$D/munge/munged.pid"
  runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCK" --pid-file="$D/munge/munged.pid" \
    --seed-file="$D/munge/munged.seed" --log-file="$D/munge/munged.log"
  started munged
  until_ok 10 munged sh -c "munge -S '$MUNGE_SOCK' -n | unmunge -S '$MUNGE_SOCK'"
  say "munged started ($MUNGE_SOCK)"
fi

# ------------------------------------------------------------------ mariadb + slurmdbd
DB="$D/mysql"; RUN="$D/mysqlrun"; SOCK="$RUN/mysqld.sock"
install -d -o mysql -g mysql -m 0755 "$RUN"   # mysql must own its socket and pid folder
if running "$RUN/mariadb.pid"; then say "mariadbd already running"; else
  if [ ! -d "$DB/mysql" ]; then
    install -d -o mysql -g mysql "$DB"
    mariadb-install-db --user=mysql --datadir="$DB" --auth-root-authentication-method=socket \
      --skip-test-db > "$D/log/mariadb-install.log" 2>&1 || fail "mariadb-install-db failed ($D/log/mariadb-install.log)"
  fi
  setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB" --socket="$SOCK" \
    --pid-file="$RUN/mariadb.pid" --port="$DBPORT" --bind-address=127.0.0.1 \
    --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 --log-error="$D/log/mariadb.err" \
    </dev/null >/dev/null 2>&1 &
  started mariadb
  until_ok 60 mariadbd mysqladmin --socket="$SOCK" ping
  say "mariadbd started"
fi
mysql --socket="$SOCK" -uroot -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
cat > "$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBDPORT
SlurmUser=root
DebugLevel=info
LogFile=$D/log/slurmdbd.log
PidFile=$D/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DBPORT
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=slurm
EOF
chmod 600 "$ETC/slurmdbd.conf"
if running "$D/slurmdbd.pid"; then say "slurmdbd already running"; else
  slurmdbd   # reads slurmdbd.conf next to $SLURM_CONF
  started slurmdbd
  until_ok 30 slurmdbd bash -c "exec 3<>/dev/tcp/127.0.0.1/$DBDPORT"
  say "slurmdbd started"
fi

# ------------------------------------------------------------------ slurmctld + slurmd
if running "$D/slurmctld.pid"; then say "slurmctld already running"; scontrol reconfigure || true; else
  slurmctld -f "$SLURM_CONF"
  started slurmctld
  until_ok 30 slurmctld sh -c 'scontrol ping | grep -q UP'
  say "slurmctld started"
fi
k=0
for name in $NAMES; do
  k=$((k + 1))
  mkdir -p "$D/spool/$name"
  if running "$D/slurmd.$name.pid"; then say "slurmd $name already running"; else
    # -N: this slurmd is node $name (its port, spool, log and pid file follow from the name)
    slurmd -f "$SLURM_CONF" -N "$name"
    started "slurmd@$name"
    say "slurmd $name started (port $(slurmd_port $k))"
  fi
done
# A node left DOWN/DRAIN by an earlier run keeps that state (it is saved): bring it back.
for name in $NAMES; do
  for _ in $(seq 40); do
    st=$(sinfo -h -n "$name" -o %T 2>/dev/null || true)
    case "$st" in idle*|mixed*|allocated*) break ;; down*|drain*|inval*) scontrol update nodename="$name" state=resume || true ;; esac
    sleep 0.25
  done
  until_ok 30 "node $name idle" sh -c "sinfo -h -n $name -o %T | grep -qE '^(idle|mixed|allocated)'"
done
until_ok 30 "cluster registered in slurmdbd" sh -c 'sacctmgr -n -P show cluster format=cluster | grep -qx cluster-repro'
say "cluster up: $(sinfo -h -o '%P %D %T %c CPUs %G %N') (source $D/env)"
