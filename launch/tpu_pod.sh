#!/usr/bin/env bash
# LOIRE on a Cloud TPU VM slice: copy this checkout to every worker, install it, and start
# one process per worker.
#
#   launch/tpu_pod.sh [--watch] TPU_NAME ZONE WORKDIR [train.py arguments ...]
#   e.g. launch/tpu_pod.sh --watch my-v5p-32 us-east5-a gs://my-bucket/runs/paper \
#          --config configs/gpt_paper.yaml data.data_dir=gs://my-bucket/loire_data
#   launch/tpu_pod.sh --watch my-v5p-32 us-east5-a gs://my-bucket/suites/paper --suite paper --index 7-65
#          a suite's planned items on this slice, in order (launch/experiment.py --plan numbers them;
#          docs/operations.md, "A suite on a cluster"); WORKDIR is then the suite's directory
#
# TPU VMs share no disk: WORKDIR and the config's data.data_dir must be gs:// URIs (or on a
# filesystem every worker mounts, such as Filestore over NFS). JAX finds the coordinator and the ranks itself on
# Cloud TPU (--distributed auto). Output goes to ~/loire_jax/train.log on each worker (appended
# to); process 0's holds the progress. Rerunning the same command resumes the run.
#
# Coming back by itself: on each worker the run goes through launch/tpu_worker.sh, which
# starts it again after a lost peer (exit 76, at most LOIRE_MAX_PEER_RESTARTS times). With
# --watch this script stays in the foreground (run it in tmux, or on a small VM) and checks
# the slice every LOIRE_WATCH_S seconds (default 60): when a maintenance event restarted the
# VMs or the run stopped to be resumed (exit 75), it starts the run again, which resumes;
# while the slice is not READY it waits; when it is PREEMPTED (spot VMs, a queued resource)
# it runs $LOIRE_TPU_RECREATE (your command that deletes and recreates it, or re-requests the
# queued resource), if set; at most LOIRE_MAX_RESTARTS (default 20) times. It ends with the run's exit code once the run is done (0) or
# refused (2) or failed (1): docs/operations.md, "Exit codes".
set -euo pipefail
WATCH=0
if [ "${1:-}" = --watch ]; then WATCH=1; shift; fi
if [ $# -lt 3 ]; then
  echo "usage: $0 [--watch] TPU_NAME ZONE WORKDIR [train.py arguments ...]" >&2
  exit 2
fi
TPU=$1 ZONE=$2 WORKDIR=$3
shift 3
on_all() { gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker=all --command "$1"; }
on_first() { gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker=0 --command "$1"; }
say() { echo "tpu_pod.sh: $*" >&2; }

cd "$(dirname "$0")/.."
args=$(printf ' %q' "$@")

install() {
  local archive
  archive=$(mktemp "${TMPDIR:-/tmp}/loire_jax.XXXXXX.tgz")
  tar czf "$archive" --exclude=.git --exclude='.venv*' --exclude='.ci-venv' --exclude=runs .
  gcloud compute tpus tpu-vm scp "$archive" "$TPU":/tmp/loire_jax.tgz --zone "$ZONE" --worker=all
  rm -f "$archive"
  on_all "mkdir -p ~/loire_jax && tar xzf /tmp/loire_jax.tgz -C ~/loire_jax && cd ~/loire_jax && \
          { [ -x .venv/bin/python ] || python3 -m venv .venv; } && . .venv/bin/activate && \
          pip install -q -e '.[gcs,tpu]'"
}

start() {
  on_all "cd ~/loire_jax && rm -f last_exit && \
          nohup bash launch/tpu_worker.sh $(printf %q "$WORKDIR")$args >> train.log 2>&1 < /dev/null &"
}

install
start
say "started on every worker of $TPU; follow with: gcloud compute tpus tpu-vm ssh $TPU --zone $ZONE --worker=0 --command 'tail -f ~/loire_jax/train.log'"
[ "$WATCH" = 1 ] || exit 0

# ---------------------------------------------------------------- --watch: keep the run going
restarts=0
while :; do
  sleep "${LOIRE_WATCH_S:-60}"
  state=$(gcloud compute tpus tpu-vm describe "$TPU" --zone "$ZONE" --format='value(state)' 2>/dev/null || echo UNKNOWN)
  case "$state" in
    READY) ;;
    PREEMPTED | TERMINATED)
      if [ -n "${LOIRE_TPU_RECREATE:-}" ]; then
        say "$TPU is $state; recreating it: $LOIRE_TPU_RECREATE"
        bash -c "$LOIRE_TPU_RECREATE" || say "recreating $TPU failed; trying again later"
      else
        say "$TPU is $state; set LOIRE_TPU_RECREATE to recreate it, or recreate it yourself: this waits"
      fi
      continue ;;
    *) continue ;;  # CREATING, RESTARTING, REPAIRING, ...: wait
  esac
  status=$(on_first "cd ~/loire_jax 2>/dev/null && { pgrep -f 'loire_jax.cli.(train|experiment)' > /dev/null && echo running || \
                     cat last_exit 2>/dev/null || echo gone; }" 2>/dev/null | tail -n 1 || echo unreachable)
  case "$status" in
    running | unreachable) ;;
    0 | 1 | 2 | 130) say "the run ended with exit code $status"; exit "$status" ;;
    *)  # 75 (stopped to be resumed), 76 past its restarts, or gone (the VMs restarted, or were recreated)
      restarts=$((restarts + 1))
      if [ "$restarts" -gt "${LOIRE_MAX_RESTARTS:-20}" ]; then
        say "the run stopped again (${status}) after $((restarts - 1)) restarts; not restarting it"
        exit 1
      fi
      say "the run is not running (${status}); starting it again (restart $restarts), it resumes"
      install || { say "installing on $TPU failed; trying again later"; continue; }
      start || say "starting on $TPU failed; trying again later" ;;
  esac
done
