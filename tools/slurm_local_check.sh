#!/usr/bin/env bash
# Runs launch/slurm.sbatch under a REAL single-node SLURM on this host and checks how it
# behaves: time limit, preemption, lost processes, the workdir lock, the log, exit codes.
#
#   sudo tools/slurm_local_check.sh                    # every scenario
#   sudo tools/slurm_local_check.sh timelimit lock     # some of them
#
# Scenarios: timelimit preempt_grace preempt_hard kill_worker kill_coordinator lock cancel
#            log_append finished bad_input bitwise suite
# Prints one line per scenario, `PASS <scenario>: <evidence>` or `FAIL <scenario>: <evidence>`,
# on stdout (progress goes to stderr) and exits 1 if any failed, 2 if the set-up failed.
#
# Set-up (tools/slurm_local/setup.sh, idempotent): Debian 12's slurm-wlm 22.05 and munge,
# one node (this host, all its CPUs), partitions low (GraceTime=60), lowhard (GraceTime=0)
# and high (preempts them, PreemptMode=REQUEUE), finished jobs kept 1 h for scontrol. Needs
# root. The runs are a two-stage model on the test fixtures' text (no download), two
# processes of one CPU device each (MESH=2), in a scratch directory (mktemp -d), deleted at
# the end when every scenario passed (KEEP=1 keeps it).
#
# Each job is submitted as `WORKDIR=... MESH=2 sbatch --nodes=1 --ntasks=2 --ntasks-per-node=2
# --cpus-per-task=1 --gpus-per-node=0 --output=... launch/slurm.sbatch --config run.yaml k=v`
# with the venv active (VIRTUAL_ENV, PATH), from the checkout (from /tmp for `finished`).
# --gpus-per-node=0 is what overrides the script's `#SBATCH --gpus-per-node=8` on a node
# without GPUs in sbatch 22.05 (--gres= , --gres=none and --gpus=0 are refused).
#
# Environment: LOIRE_VENV (default /work/venv), LOIRE_REPO (the checkout whose test fixtures
# and launch/slurm.sbatch are used; default the one holding this script), LOIRE_SBATCH (another
# batch script to check), STEPS_LONG (stage-1 steps of the time-limit run, default 2500: longer
# than its first attempt), STEPS_MID (of the preempted and killed runs and their uninterrupted
# reference, default 500), STEPS_SUITE (stage 1 of every run of the suite scenario, default 150),
# KEEP=1. About 12-15 min on 2 shared cores, and the suite scenario about 15 more.
#
# The suite scenario submits a small comparison suite whole with launch/slurm_suite.sh (GPT_L
# and LOIRE at seeds 1 and 2 after a two-setting sweep on LOIRE: 8 planned items in 4 chained
# job arrays, two processes a task, the main array one task at a time), preempts its first
# main run mid-run, and compares every run's steps with the same suite run whole by one job.
{  # the whole file is parsed before anything runs: editing it while it runs changes nothing
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=${LOIRE_REPO:-$(cd "$HERE/.." && pwd)}
VENV=${LOIRE_VENV:-/work/venv}
SBATCH_SCRIPT=${LOIRE_SBATCH:-$REPO/launch/slurm.sbatch}
HELP="$VENV/bin/python $HERE/slurm_local/helpers.py"
STEPS_LONG=${STEPS_LONG:-2500}   # the time-limit run: longer than its first attempt
STEPS_MID=${STEPS_MID:-500}      # preempted and killed runs, and their uninterrupted reference
STEPS_TWO=20                     # stage 2 of every run
STEPS_SUITE=${STEPS_SUITE:-150}  # stage 1 of every run of the suite scenario
ALL="timelimit preempt_grace preempt_hard kill_worker kill_coordinator lock cancel log_append finished bad_input bitwise suite"
T0=$(date +%s)

note() { echo "[$(date +%T) +$(( $(date +%s) - T0 ))s] $*" >&2; }
FAILED=0
RESULTS=()
verdict() {  # verdict SCENARIO OK(0/1) EVIDENCE
    local line
    if [ "$2" = 0 ]; then line="PASS $1: $3"; else line="FAIL $1: $3"; FAILED=$((FAILED + 1)); fi
    echo "$line"
    RESULTS+=("$line")
}

# --------------------------------------------------------------------------- set-up
if ! bash "$HERE/slurm_local/setup.sh"; then
    echo "FAIL setup: tools/slurm_local/setup.sh failed (see /var/log/slurm-local/)"
    exit 2
fi
[ -f "$SBATCH_SCRIPT" ] || { echo "FAIL setup: no $SBATCH_SCRIPT"; exit 2; }
[ -x "$VENV/bin/python" ] || { echo "FAIL setup: no Python in $VENV"; exit 2; }
SCR=$(mktemp -d /tmp/loire-slurm-check.XXXXXX)
note "scratch $SCR; batch script $SBATCH_SCRIPT"
JOBS=()
cleanup() {
    local j s
    for j in "${JOBS[@]}"; do   # only the jobs this script submitted, and only if still alive
        s=$(field "$j" JobState)
        case "$s" in PENDING|RUNNING|REQUEUED|SUSPENDED|COMPLETING|CONFIGURING|REQUEUE_*|RESIZING|SIGNALING|STAGE_OUT)
            scancel "$j" 2>/dev/null ;; esac
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

FIX=$REPO/tests/data/fixtures
cat >"$SCR/run.yaml" <<EOF
# A two-stage run on the test fixtures' text (tools/slurm_local_check.sh).
name: slurmcheck
model: {preset: paper, vocab_size: 320, max_seq_len: 32, hidden: 32, ffn: 64, heads: 2, head_dim: 16, layers: 1}
data:
  data_dir: $SCR/data
  tokenizer: {kind: trained_bpe, vocab_size: 320}
  validation_docs: 10
  split_seed: 0
  recovery_fraction: 0.1
  domains:
    - {name: SCI, source: {kind: local, paths: [$FIX/science.txt]}}
    - {name: NEWS, source: {kind: local, paths: [$FIX/news.jsonl]}}
batch_size: 8
seq_len: 32
precision: float32
seed: 0
mesh: "2"
optimizer: {name: adam, lr: 1.0e-2, schedule: cosine, warmup_steps: 1, clip_norm: 1.0}
checkpoint: {save_every: 10, keep: 2}
eval: {every: 0, batches: 2}
stage_defaults: {steps: $STEPS_TWO}
stages:
  - {name: A, domains: [SCI]}
  - {name: B, domains: [NEWS], growth: [{op: hidden, size: 64}], warmup_steps: 3, gate_ramp_steps: 3,
     teachers: all, replay_ratio: 0.2, beta: 0.1, beta_steps: 2}
EOF

# --------------------------------------------------------------------------- helpers
field() {  # field JOB NAME: NAME=value of `scontrol show job -o JOB`
    scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
}
TERMINAL='^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED|SPECIAL_EXIT|REQUEUE_HOLD)$'
held() {  # a pending job that will not start by itself (held by an admin or the user)
    [ "$(field "$1" JobState)" = PENDING ] && case "$(field "$1" Reason)" in *Held*) true ;; *) false ;; esac
}
wait_end() {  # wait_end JOB TIMEOUT [once]: until the job is in a final state (or held);
    # with "once", also as soon as it was requeued (a job that must not come back)
    local end=$(( $(date +%s) + $2 )) s
    while [ "$(date +%s)" -lt "$end" ]; do
        s=$(field "$1" JobState)
        [[ "$s" =~ $TERMINAL ]] && return 0
        held "$1" && return 0
        if [ "${3:-}" = once ] && [ "$(field "$1" Restarts)" -ge 1 ] 2>/dev/null; then
            scancel "$1" 2>/dev/null; return 0   # it came back: that is the finding; stop it
        fi
        sleep 2
    done
    return 1
}
wait_step() {  # wait_step JOB WORKDIR STEP TIMEOUT: until stage 1 trained STEP steps (0 if not)
    local end=$(( $(date +%s) + $4 )) p
    while [ "$(date +%s)" -lt "$end" ]; do
        p=$($HELP progress "$2")
        if [ "${p% *}" -ge 2 ] || { [ "${p% *}" = 1 ] && [ "${p#* }" -ge "$3" ]; }; then return 0; fi
        [[ "$(field "$1" JobState)" =~ $TERMINAL ]] && return 1
        sleep 1
    done
    return 1
}
wait_restart() {  # wait_restart JOB TIMEOUT: until Restarts >= 1
    local end=$(( $(date +%s) + $2 )) s
    while [ "$(date +%s)" -lt "$end" ]; do
        [ "$(field "$1" Restarts)" -ge 1 ] 2>/dev/null && return 0
        s=$(field "$1" JobState)
        [[ "$s" =~ $TERMINAL ]] && return 1
        sleep 1
    done
    return 1
}
submit() {  # submit NAME WORKDIR DIR [sbatch options] -- [run args]: prints the job id
    local name=$1 wd=$2 dir=$3; shift 3
    local opts=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    # The script's #SBATCH lines ask for 2 nodes, 16 CPUs a task and 8 GPUs a node: overridden
    # here (--gpus-per-node=0 is the override sbatch 22.05 accepts on a node without GPUs).
    ( cd "$dir" && WORKDIR=$wd MESH=2 VIRTUAL_ENV=$VENV PATH="$VENV/bin:$PATH" \
        sbatch --parsable --job-name="lc-$name" --nodes=1 --ntasks=2 --ntasks-per-node=2 --cpus-per-task=1 \
        --gpus-per-node=0 --output="$SCR/$name.out" "${opts[@]}" "$SBATCH_SCRIPT" --config "$SCR/run.yaml" "$@" \
        2>>"$SCR/sbatch.err" ) | tail -1 | cut -d';' -f1
}
track() { [ -n "$1" ] && JOBS+=("$1"); }
codes() {  # codes WORKDIR JOB: the exit codes the batch script recorded, "name=code ..."
    local f out=""
    for f in "$1"/.slurm/exit."$2".* "$1"/.slurm/exit."$2"; do
        [ -f "$f" ] && out+="${f##*/}=$(grep -o -m1 '[0-9]\+' "$f" | head -1) "
    done
    echo "${out% }"
}
code_of() {  # code_of WORKDIR JOB PROCID [RESTART]: the code the task recorded (its last attempt if no RESTART)
    local f rest r p best="" bestr=-1
    for f in "$1"/.slurm/exit."$2".*; do
        [ -f "$f" ] || continue
        rest=${f##*/exit."$2".}               # "<proc>" or "<restart>.<proc>"
        p=${rest##*.}; r=${rest%.*}; [ "$r" = "$rest" ] && r=0
        [ "$p" = "$3" ] || continue
        [ -n "${4:-}" ] && [ "$r" != "$4" ] && continue
        [ "$r" -gt "$bestr" ] 2>/dev/null && { bestr=$r; best=$f; }
    done
    [ -n "$best" ] && grep -o -m1 '[0-9]\+' "$best" | head -1
}
jobinfo() {  # one evidence string: state, exit code, restarts
    echo "JobState=$(field "$1" JobState) ExitCode=$(field "$1" ExitCode) Restarts=$(field "$1" Restarts)"
}
count() { grep -c -E "$2" "$1" 2>/dev/null || true; }
stop_step() {  # the step of the first mid-stage stop line: "stopped (SIGTERM) in stage S at step N"
    grep -o -E 'stopped \([A-Z]+\)[^:]*stage [0-9]+ at step [0-9]+' "$1" | head -1 | grep -o -E '[0-9]+$'
}
resume_step() {  # the step of the first resume line: "resuming at step N/M" or "resuming stage S from step N"
    grep -i -E 'resuming' "$1" | grep -o -E 'step [0-9]+' | head -1 | grep -o -E '[0-9]+'
}
# What must never reach the log: a Python traceback, a C++ fatal log and its stack.
CRASH='Traceback|Fatal Python error|terminate called|Check failure|^F[0-9]{4} |@ +0x[0-9a-f]+ |Segmentation fault|core dumped'
# Reported, not failed: the XLA runtime's own warning and error log lines (gRPC noise).
NOISE='^[WE][0-9]{4} [0-9:.]+ +[0-9]+ [A-Za-z_]+\.(cc|h):[0-9]+\]|^Additional GRPC error|^:UNKNOWN:Error received'
noise_lines() { grep -c -E "$NOISE" "$1" 2>/dev/null || true; }
crash_lines() { grep -c -E "$CRASH" "$1" 2>/dev/null || true; }
short() { tr '\n' ' ' | sed 's/  */ /g; s/ $//' | cut -c1-"${1:-200}"; }
blocker() {  # a high-partition job that needs every CPU of the node: preempts the low ones
    local j
    j=$(sbatch --parsable --job-name=lc-blocker -p high --nodes=1 --ntasks=1 --cpus-per-task="$(nproc)" --time=2 \
        --output="$SCR/blocker.%j.out" --wrap 'sleep 5' 2>>"$SCR/sbatch.err" | cut -d';' -f1)
    track "$j"; echo "$j"
}
FINALS_CHECK=()   # "scenario workdir" pairs the bitwise check compares with the reference
REQUEUED_LOGS=()  # "scenario log" of runs that came back by themselves (for log_append)

want() { case " $SELECTED " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
SELECTED=" ${*:-$ALL} "
for s in $SELECTED; do case " $ALL " in *" $s "*) ;; *) echo "unknown scenario '$s' (known: $ALL)" >&2; exit 2 ;; esac; done

# --------------------------------------------------------------------------- scenarios
# An interrupted run that must come back by itself: checks the requeue, the stop at a saved
# step, the resume from it and the completion. $1 scenario, $2 job, $3 workdir, $4 log,
# $5 "graceful" (a stop line at step N and a resume at N) or "hard" (a resume at a saved step).
judge_requeued() {
    local sc=$1 j=$2 wd=$3 log=$4 kind=$5 ok=0 why=() st rs
    wait_end "$j" 600 || why+=("no final state in 600 s")
    [ "$(field "$j" Restarts)" -ge 1 ] 2>/dev/null || { ok=1; why+=("not requeued"); }
    [ "$(field "$j" JobState)" = COMPLETED ] || { ok=1; why+=("not COMPLETED"); }
    st=$(stop_step "$log"); rs=$(resume_step "$log")
    if [ "$kind" = graceful ]; then
        [ -n "$st" ] || { ok=1; why+=("no 'stopped ... at step N' line"); }
        [ -n "$rs" ] && [ "$rs" = "$st" ] || { ok=1; why+=("resume step '${rs}' != stop step '${st}'"); }
    else
        [ -n "$rs" ] && [ "$rs" -gt 0 ] || { ok=1; why+=("no resume from a saved step (got '${rs}')"); }
    fi
    grep -q -E 'run complete' "$log" || { ok=1; why+=("no 'run complete'"); }
    [ "$(crash_lines "$log")" = 0 ] || { ok=1; why+=("$(crash_lines "$log") crash/traceback lines"); }
    verdict "$sc" "$ok" "$( [ ${#why[@]} -gt 0 ] && echo "${why[*]}; ")job $j $(jobinfo "$j"); stop at step ${st:--}, resume at step ${rs:--}; codes [$(codes "$wd" "$j")]; $(grep -m1 -E 'stopped \(' "$log" | short 90)"
    [ "$(field "$j" Restarts)" -ge 1 ] 2>/dev/null && REQUEUED_LOGS+=("$sc $log $j")
}

sc_timelimit() {
    local wd=$SCR/w_timelimit j
    # 2 min limit, SIGTERM 45 s before it (SLURM checks limits every ~30 s, so it comes 45-75 s
    # early): the first attempt stops mid-stage-1, saves, exits 75, and the script requeues it.
    j=$(submit timelimit "$wd" "$REPO" --time=2 --signal=TERM@45 -- "stages.M1.steps=$STEPS_LONG"); track "$j"
    [ -n "$j" ] || { verdict timelimit 1 "sbatch refused: $(tail -2 "$SCR/sbatch.err" | short)"; return; }
    note "timelimit: job $j (--time=2 --signal=TERM@45, stage 1 = $STEPS_LONG steps)"
    if wait_restart "$j" 240; then
        # The second attempt gets time to finish (SLURM keeps the job's 2 min limit otherwise).
        scontrol update jobid="$j" TimeLimit=15 2>>"$SCR/sbatch.err"
        note "timelimit: requeued ($(jobinfo "$j")); time limit raised to 15 min for the rest"
    fi
    judge_requeued timelimit "$j" "$wd" "$SCR/timelimit.out" graceful
}

preempt() {  # preempt SCENARIO PARTITION KIND
    local sc=$1 wd=$SCR/w_$1 j b
    j=$(submit "$sc" "$wd" "$REPO" -p "$2" --time=15 -- "stages.M1.steps=$STEPS_MID"); track "$j"
    [ -n "$j" ] || { verdict "$sc" 1 "sbatch refused: $(tail -2 "$SCR/sbatch.err" | short)"; return; }
    note "$sc: job $j on $2"
    if ! wait_step "$j" "$wd" 15 240; then
        verdict "$sc" 1 "the run never reached step 15 of stage 1: $(jobinfo "$j"); $(tail -3 "$SCR/$sc.out" | short)"; return
    fi
    b=$(blocker)
    note "$sc: at $($HELP progress "$wd") (stage step), blocker job $b on high"
    wait_restart "$j" 180 || note "$sc: no requeue seen ($(jobinfo "$j"))"
    judge_requeued "$sc" "$j" "$wd" "$SCR/$sc.out" "$3"
    [ "$(field "$j" JobState)" = COMPLETED ] && FINALS_CHECK+=("$sc $wd")
}
sc_preempt_grace() { preempt preempt_grace low graceful; }
sc_preempt_hard() { preempt preempt_hard lowhard hard; }

kill_task() {  # kill_task SCENARIO PROCID: kill -9 one task's python; the other must report it
    local sc=$1 victim=$2 survivor=$(( 1 - $2 )) wd=$SCR/w_$1 j pids end lost ok=0 why=() c at
    j=$(submit "$sc" "$wd" "$REPO" --time=15 -- "stages.M1.steps=$STEPS_MID"); track "$j"
    [ -n "$j" ] || { verdict "$sc" 1 "sbatch refused: $(tail -2 "$SCR/sbatch.err" | short)"; return; }
    if ! wait_step "$j" "$wd" 25 240; then
        verdict "$sc" 1 "the run never reached step 25: $(jobinfo "$j"); $(tail -3 "$SCR/$sc.out" | short)"; return
    fi
    pids=$($HELP pids "$j" "$victim")
    if [ -z "$pids" ]; then verdict "$sc" 1 "no python process of task $victim found"; scancel "$j"; return; fi
    at="step $($HELP progress "$wd" | cut -d' ' -f2)"
    note "$sc: job $j at $at of stage 1; kill -9 task $victim (pid $pids)"
    kill -9 $pids
    end=$(( $(date +%s) + 240 ))   # the survivor notices within its heartbeat, then the script ends the attempt
    while [ "$(date +%s)" -lt "$end" ]; do
        [ -n "$(code_of "$wd" "$j" "$survivor" 0)" ] && break
        [ "$(field "$j" Restarts)" -ge 1 ] 2>/dev/null && break
        [[ "$(field "$j" JobState)" =~ $TERMINAL ]] && break
        sleep 2
    done
    sleep 3
    c=$(code_of "$wd" "$j" "$survivor" 0)
    lost=$(grep -E 'lost process' "$SCR/$sc.out" | head -3)
    [ "$(grep -c -E "error: lost process $victim\b" "$SCR/$sc.out")" = 1 ] \
        || { ok=1; why+=("expected one 'error: lost process $victim' line, got $(count "$SCR/$sc.out" 'lost process')"); }
    [ "$(crash_lines "$SCR/$sc.out")" = 0 ] || { ok=1; why+=("$(crash_lines "$SCR/$sc.out") crash/traceback lines: $(grep -m2 -E "$CRASH" "$SCR/$sc.out" | short 120)"); }
    [ "$c" = 76 ] || { ok=1; why+=("task $survivor recorded '${c}', not 76"); }
    local first; first="codes [$(codes "$wd" "$j")]; $(noise_lines "$SCR/$sc.out") runtime W/E log lines; survivor said: $(echo "$lost" | short 150)"
    # Then the script requeues it (76, a bounded number of times) and it resumes from its last
    # periodic checkpoint (no save at a kill -9) to the end.
    local rs then
    if [ "$ok" = 0 ]; then
        wait_end "$j" 400
        rs=$(resume_step "$SCR/$sc.out")
        then="then $(jobinfo "$j"), resumed at step ${rs:--}"
        [ "$(field "$j" Restarts)" -ge 1 ] 2>/dev/null || { ok=1; why+=("not requeued after 76"); }
        [ "$(field "$j" JobState)" = COMPLETED ] && grep -q 'run complete' "$SCR/$sc.out" || { ok=1; why+=("the requeued run did not complete"); }
        [ -n "$rs" ] || { ok=1; why+=("no resume line"); }
        [ "$(crash_lines "$SCR/$sc.out")" = 0 ] || { ok=1; why+=("crash/traceback lines after the requeue"); }
        [ "$ok" = 0 ] && FINALS_CHECK+=("$sc $wd")
    else
        then="$(jobinfo "$j") (cancelled here)"
        scancel "$j" 2>/dev/null
        wait_end "$j" 60 >/dev/null
    fi
    verdict "$sc" "$ok" "$( [ ${#why[@]} -gt 0 ] && echo "${why[*]}; ")job $j killed at $at: $first; $then"
}
sc_kill_worker() { kill_task kill_worker 1; }
sc_kill_coordinator() { kill_task kill_coordinator 0; }

FINISHED_WD=""
FINISHED_JOB=""
sc_finished() {  # a short run, submitted from /tmp: completes, is not requeued, records 0
    local wd=$SCR/w_finished j ok=0 why=() r1
    j=$(submit finished "$wd" /tmp --time=10 -- "stages.M1.steps=$STEPS_TWO"); track "$j"
    [ -n "$j" ] || { verdict finished 1 "sbatch refused (submitted from /tmp): $(tail -2 "$SCR/sbatch.err" | short)"; return; }
    note "finished: job $j (submitted from /tmp)"
    wait_end "$j" 300 once || why+=("no final state in 300 s")
    r1=$(field "$j" Restarts)
    sleep 3    # the script requeues before it exits, so a requeue shows as Restarts>=1 by now
    [ "$(field "$j" JobState)" = COMPLETED ] || { ok=1; why+=("not COMPLETED"); }
    [ "$(field "$j" Restarts)" = 0 ] && [ "$r1" = 0 ] || { ok=1; why+=("requeued"); }
    [ "$(code_of "$wd" "$j" 0)" = 0 ] && [ "$(code_of "$wd" "$j" 1)" = 0 ] || { ok=1; why+=("recorded codes not 0"); }
    grep -q 'run complete' "$SCR/finished.out" || { ok=1; why+=("no 'run complete'"); }
    [ "$(crash_lines "$SCR/finished.out")" = 0 ] || { ok=1; why+=("crash/traceback lines"); }
    [ "$ok" = 0 ] || why+=("log: $(tail -3 "$SCR/finished.out" | short 200)")
    verdict finished "$ok" "$( [ ${#why[@]} -gt 0 ] && echo "${why[*]}; ")job $j $(jobinfo "$j") after the end; codes [$(codes "$wd" "$j")]; $(grep -m1 'run complete' "$SCR/finished.out" | cut -c1-40)"
    FINISHED_WD=$wd; FINISHED_JOB=$j
}

sc_bad_input() {  # an unknown override key: exit 2 recorded, one error line, no requeue
    local wd=$SCR/w_bad j ok=0 why=() errs
    j=$(submit bad_input "$wd" "$REPO" --time=10 -- "stages.M1.steps=$STEPS_TWO" no_such_key=1); track "$j"
    [ -n "$j" ] || { verdict bad_input 1 "sbatch refused: $(tail -2 "$SCR/sbatch.err" | short)"; return; }
    wait_end "$j" 180 once || why+=("no final state in 180 s")
    sleep 3
    errs=$(grep -E '^error:' "$SCR/bad_input.out")
    [ -n "$errs" ] || { ok=1; why+=("no 'error:' line"); }
    [ "$(echo "$errs" | sort -u | wc -l)" -le 1 ] && [ "$(echo "$errs" | wc -l)" -le 2 ] \
        || { ok=1; why+=("more than one error line a process"); }
    [ "$(field "$j" Restarts)" = 0 ] || { ok=1; why+=("requeued"); }
    case "$(field "$j" ExitCode)" in 2:0) ;; *) ok=1; why+=("job ExitCode $(field "$j" ExitCode), not 2:0") ;; esac
    case "$(field "$j" JobState)" in FAILED) ;; *) ok=1; why+=("JobState $(field "$j" JobState), not FAILED") ;; esac
    [ "$(crash_lines "$SCR/bad_input.out")" = 0 ] || { ok=1; why+=("crash/traceback lines"); }
    local rec; rec=$(codes "$wd" "$j")
    case "$rec" in *=2*) ;; "") why+=("no exit file (the workdir was never the run's)") ;; *) ok=1; why+=("recorded [$rec], not 2") ;; esac
    verdict bad_input "$ok" "$( [ ${#why[@]} -gt 0 ] && echo "${why[*]}; ")job $j $(jobinfo "$j"); codes [$rec]; $(echo "$errs" | sort | uniq -c | short 160)"
}

sc_cancel() {  # scancel mid-run: the run saves and exits 75, but a cancelled job is not requeued
    local wd=$SCR/w_cancel j ok=0 why=() rec
    j=$(submit cancel "$wd" "$REPO" --time=10 -- "stages.M1.steps=$STEPS_MID"); track "$j"
    [ -n "$j" ] || { verdict cancel 1 "sbatch refused: $(tail -2 "$SCR/sbatch.err" | short)"; return; }
    wait_step "$j" "$wd" 10 240 || why+=("never reached step 10")
    scancel "$j"
    wait_end "$j" 120 once || why+=("no final state in 120 s")
    sleep 5
    [ "$(field "$j" Restarts)" = 0 ] || { ok=1; why+=("requeued"); }
    case "$(field "$j" JobState)" in CANCELLED) ;; *) ok=1; why+=("JobState $(field "$j" JobState), not CANCELLED") ;; esac
    rec=$(codes "$wd" "$j")
    case "$rec" in *=75*) ;; *) ok=1; why+=("recorded [$rec], not 75 (saved)") ;; esac
    grep -q "(cancelled): not requeued" "$SCR/cancel.out" || { ok=1; why+=("no 'not requeued' line"); }
    verdict cancel "$ok" "$( [ ${#why[@]} -gt 0 ] && echo "${why[*]}; ")job $j $(jobinfo "$j"); codes [$rec]; $(grep -h "not requeued" "$SCR/cancel.out" | short 120)"
}

sc_lock() {
    # A run's workdir (the finished scenario's, or a fresh short run's) whose .lock claims
    # another host, renewed just now. (a) the lock names the very job that starts: a requeued
    # job reclaiming its own lock -> accepted. (b) another job -> refused, exit 2, no requeue.
    local wd j ok=0 why=() lockf tok info errs
    if [ -z "$FINISHED_WD" ]; then
        wd=$SCR/w_lock
        j=$(submit lock_prep "$wd" "$REPO" --time=10 -- "stages.M1.steps=$STEPS_TWO"); track "$j"
        wait_end "$j" 300
    else
        wd=$FINISHED_WD
    fi
    lockf=$wd/.lock
    # (a) the same job id
    j=$(submit lock_same "$wd" "$REPO" --hold --time=10 -- "stages.M1.steps=$STEPS_TWO"); track "$j"
    [ -n "$j" ] || { verdict lock 1 "sbatch refused: $(tail -2 "$SCR/sbatch.err" | short)"; return; }
    tok=$($HELP lock "$lockf" "$j" other-node-a)
    info=$($HELP lockinfo "$lockf")
    scontrol release "$j"
    note "lock: job $j, lock $info"
    wait_end "$j" 300 || why+=("(a) no final state")
    local a_state; a_state=$(jobinfo "$j")
    [ "$(field "$j" JobState)" = COMPLETED ] || { ok=1; why+=("(a) own-job lock not accepted: $(grep -m1 -E '^error:' "$SCR/lock_same.out" | short 160)"); }
    local a_note; a_note=$(grep -m1 -i -E 'took over|lock' "$SCR/lock_same.out" | short 120)
    local a_codes; a_codes=$(codes "$wd" "$j")
    # (b) a different job id, same fresh lock from another host
    j=$(submit lock_other "$wd" "$REPO" --hold --time=10 -- "stages.M1.steps=$STEPS_TWO"); track "$j"
    [ -n "$j" ] || { verdict lock 1 "sbatch refused: $(tail -2 "$SCR/sbatch.err" | short)"; return; }
    tok=$($HELP lock "$lockf" "$((j + 1000))" other-node-b)
    scontrol release "$j"
    wait_end "$j" 180 once || why+=("(b) no final state")
    sleep 3
    errs=$(grep -E '^error:.*in use' "$SCR/lock_other.out")
    [ -n "$errs" ] || { ok=1; why+=("(b) no 'error: workdir ... is in use' line: $(tail -2 "$SCR/lock_other.out" | short 160)"); }
    [ "$(field "$j" Restarts)" = 0 ] || { ok=1; why+=("(b) requeued"); }
    case "$(codes "$wd" "$j")" in *=2*) ;; *) ok=1; why+=("(b) exit 2 not recorded: [$(codes "$wd" "$j")]") ;; esac
    case "$(codes "$wd" "$j")" in *=[013-9]*) ok=1; why+=("(b) a code other than 2 recorded") ;; esac
    [ "$($HELP lockinfo "$lockf" | grep -o 'token=.*')" = "token=$tok" ] || { ok=1; why+=("(b) the other job's lock was changed: $($HELP lockinfo "$lockf")"); }
    [ "$(crash_lines "$SCR/lock_other.out")" = 0 ] || { ok=1; why+=("(b) crash/traceback lines"); }
    verdict lock "$ok" "$( [ ${#why[@]} -gt 0 ] && echo "${why[*]}; ")(a) same job: $a_state codes [$a_codes] '${a_note}'; (b) other job $j: $(jobinfo "$j") codes [$(codes "$wd" "$j")] $(echo "$errs" | wc -l) line(s) '$(echo "$errs" | head -1 | cut -c1-90)...'"
}

sc_log_append() {  # every requeued job's log keeps the lines of its first attempt
    local item sc log j ok=0 ev=() n
    if [ ${#REQUEUED_LOGS[@]} = 0 ]; then
        verdict log_append 1 "no run came back by itself in this session (run it with timelimit or preempt_*)"; return
    fi
    for item in "${REQUEUED_LOGS[@]}"; do
        read -r sc log j <<<"$item"
        n=$(count "$log" "^devices:|^run '")
        local first_stop first_resume
        first_stop=$(grep -n -m1 -E 'stopped \(|slurm.sbatch: .*requeue|requeueing' "$log" | cut -d: -f1)
        first_resume=$(grep -n -m1 -i -E 'resuming' "$log" | cut -d: -f1)
        if [ "$n" -ge 2 ] && [ -n "$first_stop" ] && [ -n "$first_resume" ] && [ "$first_stop" -lt "$first_resume" ]; then
            ev+=("$sc: $n run headers, stop at line $first_stop before resume at line $first_resume")
        else
            ok=1; ev+=("$sc: $n run headers, stop line ${first_stop:--}, resume line ${first_resume:--} (Restarts=$(field "$j" Restarts))")
        fi
    done
    verdict log_append "$ok" "$(IFS=';'; echo "${ev[*]}")"
}

sc_bitwise() {  # the interrupted runs end with the same final PPL as an uninterrupted run
    local wd=$SCR/w_reference j item sc w r ok=0 ev=()
    if [ ${#FINALS_CHECK[@]} = 0 ]; then
        verdict bitwise 1 "no interrupted run completed to compare (preempt_grace, preempt_hard, kill_worker, kill_coordinator)"; return
    fi
    j=$(submit reference "$wd" "$REPO" --time=15 -- "stages.M1.steps=$STEPS_MID"); track "$j"
    note "bitwise: uninterrupted reference job $j"
    wait_end "$j" 600
    [ "$(field "$j" JobState)" = COMPLETED ] || { verdict bitwise 1 "reference run: $(jobinfo "$j")"; return; }
    for item in "${FINALS_CHECK[@]}"; do
        read -r sc w <<<"$item"
        r=$($HELP compare "$w" "$wd")
        [ "$r" = identical ] || ok=1
        ev+=("$sc $r")
    done
    verdict bitwise "$ok" "final eval records vs uninterrupted job $j: $(IFS=';'; echo "${ev[*]}"); reference $($HELP summary "$wd")"
}

sc_suite() {  # a suite's phases as chained job arrays, one task preempted, against one job running it whole
    local dir=$SCR/suite wd=$SCR/w_suite ref=$SCR/w_suite_ref ok=0 why=() out ids sweep choice mainj report
    local t3 b j st rs same states tasks
    mkdir -p "$dir"
    sed -e 's/^name: slurmcheck/name: suitecheck/' "$SCR/run.yaml" >"$dir/loire.yaml"
    cat >"$dir/suite.yaml" <<EOF
# tools/slurm_local_check.sh's suite: GPT_L and LOIRE at seeds 1 and 2 after a sweep of two learning rates.
name: suitecheck
base: loire.yaml
overrides: [stages.M1.steps=$STEPS_SUITE]
systems: [GPT_L, LOIRE]
seeds: [1, 2]
sweep: {systems: [LOIRE], seed: 0, grid: {optimizer.lr: [1.0e-2, 3.0e-3]}}
EOF
    # as a user submits it: the venv active, from the checkout; two processes of one CPU each a
    # task (MESH=2), the main array one task at a time (--max-running 1) so that one is preempted
    out=$( cd "$REPO" && MESH=2 VIRTUAL_ENV=$VENV PATH="$VENV/bin:$PATH" LOIRE_SBATCH=$SBATCH_SCRIPT \
        bash "$REPO/launch/slurm_suite.sh" --max-running 1 "$wd" -p low --nodes=1 --ntasks=2 --ntasks-per-node=2 \
        --cpus-per-task=1 --gpus-per-node=0 --time=15 --output="$SCR/suite-%A_%a.out" -- --suite "$dir/suite.yaml" \
        2>>"$SCR/sbatch.err")
    ids=$(echo "$out" | sed -n 's/^submitted: //p')
    read -r sweep choice mainj report <<<"$(echo "$ids" | grep -o -E '[a-z]+ [0-9]+' | awk '{printf "%s ", $2}')"
    for j in $sweep $choice $mainj $report; do track "$j"; done
    if [ -z "$report" ]; then
        verdict suite 1 "launch/slurm_suite.sh submitted no chain: $(echo "$out" | short) $(tail -2 "$SCR/sbatch.err" | short)"
        return
    fi
    note "suite: $ids"
    t3="${mainj}_3"   # item 3, the first main run (GPT_L at seed 1): preempted once it trains
    if wait_step "$t3" "$wd/runs/GPT_L/seed1" 15 900; then
        b=$(blocker)
        note "suite: task $t3 at $($HELP progress "$wd/runs/GPT_L/seed1") (stage step); blocker job $b on high"
        wait_restart "$t3" 180 || note "suite: no requeue seen ($(jobinfo "$t3"))"
    else
        why+=("item 3 never reached step 15 of stage 1 ($(jobinfo "$t3"))")
    fi
    wait_end "$report" 1500 || why+=("the report job did not end in 1500 s")
    states=$(for j in $sweep $choice $mainj $report; do scontrol show job -o "$j" 2>/dev/null; done |
        tr ' ' '\n' | sed -n 's/^JobState=//p' | sort | uniq -c | awk '{print $1, $2}' | paste -sd, -)
    tasks=$(for j in $sweep $choice $mainj $report; do scontrol show job -o "$j" 2>/dev/null; done | grep -c 'JobState=')
    [ "$tasks" = 8 ] && [ "$states" = "8 COMPLETED" ] || { ok=1; why+=("$tasks array tasks: $states"); }
    [ "$(field "$t3" Restarts)" -ge 1 ] 2>/dev/null || { ok=1; why+=("item 3 was not requeued"); }
    st=$(stop_step "$SCR/suite-${mainj}_3.out"); rs=$(resume_step "$SCR/suite-${mainj}_3.out")
    [ -n "$st" ] && [ "$rs" = "$st" ] || { ok=1; why+=("item 3: stop at step '${st}', resume at '${rs}'"); }
    [ -f "$wd/report/report.md" ] || { ok=1; why+=("no report"); }
    [ "$(cat "$SCR"/suite-*.out | grep -c -E "$CRASH")" = 0 ] || { ok=1; why+=("crash/traceback lines in the task logs"); }
    # the same suite run whole by one job (no array: every item in order, in one command)
    j=$( cd "$REPO" && WORKDIR=$ref MESH=2 VIRTUAL_ENV=$VENV PATH="$VENV/bin:$PATH" sbatch --parsable \
        --job-name=lc-suite-ref -p low --nodes=1 --ntasks=2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 \
        --time=20 --output="$SCR/suite-ref.out" "$SBATCH_SCRIPT" --suite "$dir/suite.yaml" 2>>"$SCR/sbatch.err" |
        cut -d';' -f1)
    track "$j"
    wait_end "$j" 1200 || why+=("the reference job did not end")
    [ "$(field "$j" JobState)" = COMPLETED ] || { ok=1; why+=("reference job $j: $(jobinfo "$j")"); }
    same=$($HELP suite_compare "$wd" "$ref" 2>&1 | tail -1)
    case "$same" in identical:*) ;; *) ok=1 ;; esac
    verdict suite "$ok" "$( [ ${#why[@]} -gt 0 ] && echo "${why[*]}; ")$ids; tasks: $states; item 3 ($t3) $(jobinfo "$t3"), stopped at step ${st:--}, resumed at step ${rs:--}; every run's steps against job $j running the suite whole: $same; status: $("$VENV/bin/python" -m loire_jax.cli.experiment --suite "$dir/suite.yaml" --workdir "$wd" --status 2>&1 | head -1 | cut -d: -f2- | short 120)"
}

# --------------------------------------------------------------------------- order
# The short, quick scenarios first; log_append reads the requeued runs' logs; bitwise
# compares the interrupted runs that completed with a reference.
main() {
    for s in finished bad_input lock cancel timelimit preempt_grace preempt_hard kill_worker kill_coordinator log_append bitwise suite; do
        if want "$s"; then note "== $s"; "sc_$s"; fi
    done

    note "$((${#RESULTS[@]} - FAILED))/${#RESULTS[@]} passed in $(( $(date +%s) - T0 )) s"
    if [ "$FAILED" = 0 ] && [ "${KEEP:-0}" != 1 ]; then
        rm -rf -- "$SCR"
    else
        note "scratch kept: $SCR (job logs *.out, workdirs w_*)"
    fi
    [ "$FAILED" = 0 ]
}
main "$@"; exit $?
}
