#!/usr/bin/env bash
# LOIRE on a Cloud TPU VM slice: copy this checkout to every worker, install it, and start
# one process per worker.
#
#   launch/tpu_pod.sh TPU_NAME ZONE WORKDIR [train.py arguments ...]
#   e.g. launch/tpu_pod.sh my-v5p-32 us-east5-a gs://my-bucket/runs/paper \
#          --config configs/gpt_paper.yaml data.data_dir=gs://my-bucket/loire_data
#
# TPU VMs share no disk: WORKDIR and the config's data.data_dir must be gs:// URIs (or on a
# filesystem every worker mounts, such as Filestore over NFS). JAX finds the coordinator and the ranks itself on
# Cloud TPU (--distributed auto). Output goes to ~/loire_jax/train.log on each worker;
# process 0's holds the progress. Rerunning the same command resumes the run.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 TPU_NAME ZONE WORKDIR [train.py arguments ...]" >&2
  exit 2
fi
TPU=$1 ZONE=$2 WORKDIR=$3
shift 3
on_all() { gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker=all --command "$1"; }

cd "$(dirname "$0")/.."
tar czf /tmp/loire_jax.tgz --exclude=.git --exclude='.venv*' --exclude='.ci-venv' --exclude=runs .
gcloud compute tpus tpu-vm scp /tmp/loire_jax.tgz "$TPU":/tmp/loire_jax.tgz --zone "$ZONE" --worker=all
on_all "mkdir -p ~/loire_jax && tar xzf /tmp/loire_jax.tgz -C ~/loire_jax && cd ~/loire_jax && \
        python3 -m venv .venv && . .venv/bin/activate && pip install -q -e '.[gcs]' 'jax[tpu]'"
args=$(printf ' %q' "$@")
on_all "cd ~/loire_jax && . .venv/bin/activate && \
        nohup python launch/train.py --distributed auto --workdir $(printf %q "$WORKDIR") --no-progress$args \
        > train.log 2>&1 < /dev/null &"
echo "started on every worker of $TPU; follow with: gcloud compute tpus tpu-vm ssh $TPU --zone $ZONE --worker=0 --command 'tail -f ~/loire_jax/train.log'"
