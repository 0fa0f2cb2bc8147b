#!/usr/bin/env bash
# A whole suite on a SLURM cluster: each phase of its plan a job array of launch/slurm.sbatch,
# each array task one planned item, each phase starting once the one before succeeded.
#
#   launch/slurm_suite.sh [--max-running N] [--dry-run] WORKDIR [sbatch options ...] -- --suite SUITE [options ...]
#   e.g. launch/slurm_suite.sh --max-running 16 /shared/runs/paper --nodes=1 --gpus-per-node=8 --time=24:00:00 \
#          -- --suite paper --mesh 8 --compile-cache /shared/xla
#
# The phases come from `launch/experiment.py ... --plan` (its `phase NAME FIRST-LAST` lines):
#   sweep -> choice -> main -> finetune -> report, each `sbatch --array=FIRST-LAST[%N]
#   --dependency=afterok:<the previous phase's job>`, so an array task's $SLURM_ARRAY_TASK_ID is
#   the item's index in the plan. A phase the suite lacks (no sweep, no downstream part) is left out.
# Every task is a normal launch/slurm.sbatch job: the sbatch options given here (nodes, GPUs,
# time, partition, account) apply to the runs; a task may span several nodes, and one stopped
# by its time limit or a preemption saves, exits 75 and requeues itself. The choice and the
# report need no accelerator: they get `--nodes=1 --ntasks=1 --ntasks-per-node=1` after your options, and
# $LOIRE_LIGHT_SBATCH (e.g. "--partition=cpu --gpus-per-node=0") if you set it.
# --max-running N appends %N to every array (at most N of its tasks run at once).
# --dry-run prints the sbatch commands instead of submitting them.
#
# A task that fails (bad input 2, a bug 1) is not retried, and the phases after it stay
# pending (DependencyNeverSatisfied): `launch/experiment.py --suite SUITE --workdir WORKDIR
# --status` names it with its line; fix it, rerun that item (`--index I`), and submit again
# (finished items are skipped). Submit from the environment loire_jax is installed in (or
# set LOIRE_PYTHON), as for launch/slurm.sbatch.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SBATCH_SCRIPT=${LOIRE_SBATCH:-$HERE/slurm.sbatch}
fail() { echo "error: $*" >&2; exit 2; }

THROTTLE="" DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --max-running) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || fail "--max-running takes a positive integer, got '${2:-}'"
                   THROTTLE="%$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || fail "usage: $0 [--max-running N] [--dry-run] WORKDIR [sbatch options ...] -- --suite SUITE [options ...]"
WORKDIR=$1
shift
case "$WORKDIR" in /* | *://*) ;; *) WORKDIR="$PWD/$WORKDIR" ;; esac
OPTS=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do OPTS+=("$1"); shift; done
[ "${1:-}" = -- ] || fail "give the suite after --: $0 WORKDIR [sbatch options ...] -- --suite SUITE [options ...]"
shift
[ "${1:-}" = --suite ] && [ -n "${2:-}" ] || fail "the experiment's arguments start with --suite SUITE (after --)"
SUITE_ARGS=("$@")

PY=${LOIRE_PYTHON:-${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}}
PY=${PY:-$(command -v python3 || command -v python)}
plan=$("$PY" -m loire_jax.cli.experiment "${SUITE_ARGS[@]}" --workdir "$WORKDIR" --plan) || exit $?

submit() {  # submit PHASE RANGE DEPENDENCY [extra sbatch options]: prints the job id
  local phase=$1 range=$2 dep=$3
  shift 3
  local cmd=(sbatch --parsable --job-name="loire-$phase" --array="$range$THROTTLE" ${dep:+--dependency=afterok:$dep}
             "${OPTS[@]}" "$@" "$SBATCH_SCRIPT" "${SUITE_ARGS[@]}")
  if [ "$DRY" = 1 ]; then
    echo "WORKDIR=$(printf %q "$WORKDIR")$(printf ' %q' "${cmd[@]}")" >&2
    echo "<$phase>"
  else
    WORKDIR=$WORKDIR "${cmd[@]}" | cut -d';' -f1
  fi
}

previous="" summary=()
while read -r word phase range _; do
  [ "$word" = phase ] || continue
  case "$phase" in
    choice | report) id=$(submit "$phase" "$range" "$previous" --nodes=1 --ntasks=1 --ntasks-per-node=1 \
                                   ${LOIRE_LIGHT_SBATCH:-}) ;;
    *) id=$(submit "$phase" "$range" "$previous") ;;
  esac
  [ -n "$id" ] || fail "sbatch submitted no job for phase $phase"
  summary+=("$phase $id ($range)")
  previous=$id
done <<<"$plan"
[ ${#summary[@]} -gt 0 ] || fail "--plan listed no phase: $plan"
echo "submitted: $(IFS=,; echo "${summary[*]}" | sed 's/,/, /g')"
echo "follow it: $PY -m loire_jax.cli.experiment ${SUITE_ARGS[*]} --workdir $WORKDIR --status"
