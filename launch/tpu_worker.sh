#!/usr/bin/env bash
# One TPU worker's process of a run (started by launch/tpu_pod.sh on every worker):
#
#   launch/tpu_worker.sh WORKDIR [train.py arguments ...]
#   launch/tpu_worker.sh WORKDIR --suite SUITE --index I [experiment.py arguments ...]   (a suite's items)
#
# Runs the training CLI under loire_jax.cli.supervise (a lost coordinator is one line and
# exit 76), records its exit code in ~/loire_jax/last_exit for tpu_pod.sh --watch, and starts
# it again after a lost peer (76), at most LOIRE_MAX_PEER_RESTARTS times (default 3). A run
# stopped by SIGTERM (75) is not started again here: the VM is usually going down (a
# maintenance event); tpu_pod.sh --watch starts it again once the slice is back.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .venv/bin/activate ] && . .venv/bin/activate
WORKDIR=$1
shift
stop=0
trap 'stop=1' TERM INT  # this loop was told to stop: do not start the run again
# A suite's planned items (launch/experiment.py --suite ... --index I) instead of one run: WORKDIR
# is then the suite's directory, and a rerun skips the items that are done.
MODULE=loire_jax.cli.train QUIET=(--no-progress)
if [ "${1:-}" = --suite ]; then MODULE=loire_jax.cli.experiment QUIET=(); fi
restarts=0
while :; do
  python -m loire_jax.cli.supervise -- python -m "$MODULE" --distributed auto --workdir "$WORKDIR" "${QUIET[@]}" "$@" &
  run=$!
  code=0
  wait "$run" || code=$?
  while kill -0 "$run" 2>/dev/null; do code=0; wait "$run" || code=$?; done
  echo "$code" > last_exit
  echo "tpu_worker.sh: $(date -u +%FT%TZ) the run exited $code"
  [ "$code" = 76 ] && [ "$stop" = 0 ] && [ "$restarts" -lt "${LOIRE_MAX_PEER_RESTARTS:-3}" ] || break
  restarts=$((restarts + 1))
  sleep "${LOIRE_RESTART_DELAY_S:-10}"
done
exit "$code"
