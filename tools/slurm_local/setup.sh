#!/usr/bin/env bash
# A real single-node SLURM (22.05, Debian 12) on this host, for tools/slurm_local_check.sh.
# Idempotent: installs slurm-wlm and munge if missing, starts munged, writes
# /etc/slurm/slurm.conf (only if it differs; the daemons are restarted then), starts
# slurmctld and slurmd if they are not running, and waits for the node to be idle.
# No systemd: the daemons are started directly. Needs root.
#
# Partitions (preempt/partition_prio, PreemptMode=REQUEUE):
#   low      PriorityTier=1  GraceTime=60   graceful preemption (SIGTERM, then 60 s)
#   lowhard  PriorityTier=1  GraceTime=0    hard requeue
#   high     PriorityTier=2                 preempts both
set -euo pipefail

log() { echo "[setup] $*" >&2; }
[ "$(id -u)" = 0 ] || { echo "setup: needs root" >&2; exit 2; }

NODE=$(hostname -s)
CPUS=${SLURM_LOCAL_CPUS:-$(nproc)}
STATE=/var/spool/slurm-local
RUN=/run/slurm-local
LOGS=/var/log/slurm-local
CONF=/etc/slurm/slurm.conf
# KillWait: seconds between SIGTERM and SIGKILL when a job is cancelled, times out or is
# preempted after its GraceTime. Short, so that the GraceTime=0 partition is a hard requeue.
KILLWAIT=${SLURM_LOCAL_KILLWAIT:-5}

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null || ! command -v sbatch >/dev/null; then
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y slurm-wlm munge >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y slurm-wlm munge >/dev/null; }
fi

# --------------------------------------------------------------------------- munge
if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    mkdir -p /etc/munge
    mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
        || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge
chmod 755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.2; done
    munge -n | unmunge >/dev/null || { echo "setup: munged does not answer" >&2; exit 1; }
fi

# --------------------------------------------------------------------------- slurm.conf
mkdir -p "$STATE/ctld" "$STATE/d" "$RUN" "$LOGS"
new=$(mktemp)
cat >"$new" <<EOF
# Written by tools/slurm_local/setup.sh (loire_jax): a one-node SLURM for the batch-script checks.
ClusterName=loirelocal
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job is eligible again after cred_expire + 1 s (default 120 s): short, for the checks.
AuthInfo=cred_expire=10
CredType=cred/munge
MpiDefault=none
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5,bf_interval=5
JobRequeue=1
MinJobAge=3600
KillWait=$KILLWAIT
InactiveLimit=0
ReturnToService=2
SlurmdTimeout=120
SlurmctldTimeout=120
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName=$NODE CPUs=$CPUS RealMemory=4000 State=UNKNOWN
PartitionName=low Nodes=$NODE Default=YES PriorityTier=1 GraceTime=60 PreemptMode=REQUEUE MaxTime=INFINITE State=UP
PartitionName=lowhard Nodes=$NODE PriorityTier=1 GraceTime=0 PreemptMode=REQUEUE MaxTime=INFINITE State=UP
PartitionName=high Nodes=$NODE PriorityTier=2 PreemptMode=OFF MaxTime=INFINITE State=UP
EOF
changed=0
if [ -s "$CONF" ] && ! head -n 1 "$CONF" | grep -q "^# Written by tools/slurm_local/setup.sh"; then
    rm -f "$new"   # a real cluster's config: never overwritten
    echo "setup: $CONF exists and was not written by this script; run the check on a scratch machine or container" >&2
    exit 2
fi
if ! cmp -s "$new" "$CONF"; then
    log "writing $CONF"
    cp "$new" "$CONF"
    changed=1
fi
rm -f "$new"
[ -f /etc/slurm/cgroup.conf ] || true   # task/none and proctrack/linuxproc need no cgroup.conf

alive() { [ -s "$RUN/$1.pid" ] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }
stop() {   # only the daemon this script started (its pid file)
    if alive "$1"; then
        local pid; pid=$(cat "$RUN/$1.pid")
        log "stopping $1 (pid $pid)"
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    fi
}
if [ "$changed" = 1 ]; then stop slurmd; stop slurmctld; fi
if ! alive slurmctld; then
    log "starting slurmctld"
    # -i: ignore state that does not fit the config (first start, or a changed config)
    slurmctld -i
fi
for _ in $(seq 50); do scontrol ping >/dev/null 2>&1 && break; sleep 0.2; done
scontrol ping >/dev/null || { echo "setup: slurmctld does not answer (see $LOGS/slurmctld.log)" >&2; exit 1; }
if ! alive slurmd; then
    log "starting slurmd"
    slurmd
fi

# --------------------------------------------------------------------------- the node
state() { sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1; }
for _ in $(seq 120); do
    s=$(state)
    case "$s" in
        idle|mixed|allocated) break ;;
        down*|drain*|fail*) scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 0.5
done
s=$(state)
case "$s" in
    idle|mixed|allocated) log "node $NODE is $s ($CPUS CPUs)" ;;
    *) echo "setup: node $NODE is '$s', not idle (see $LOGS/slurmd.log)" >&2; exit 1 ;;
esac
