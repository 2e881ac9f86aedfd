#!/usr/bin/env bash
# One prepared GPU run in stages, each in its own process under its own timeout; a stage that
# fails or times out is recorded (rc, log tail) and the next one runs. At the end every stage's
# results are merged into one JSON ($OUT/gpu_check.json, its markdown in $OUT/gpu_table.md) and a
# summary is printed. Stages (benchmarks/gpu_check.py), most important first, default timeouts:
#   a env 25 s, b kernels 60 s, c selection 50 s, d attention 105 s, e model 100 s
# and the whole run within --budget seconds (default 340: a stage gets what is left, if less).
# No pip, no network: where `import sketchwalk` fails, a package of symlinks to this checkout is
# put on PYTHONPATH. --device cpu runs the Triton kernels through the interpreter.
#
# Usage: OUT=DIR benchmarks/gpu_check.sh [--stages a,b,c,d,e] [--timeout c=90,e=150]
#                                        [--budget S] [--smoke --device cpu]
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=$PWD/.venv/bin/python; else PY=$(command -v python3 || command -v python); fi
fi

STAGES=a,b,c,d,e BUDGET= SMOKE=0 OVERRIDES= PASS=()
declare -A LIMIT=([a]=25 [b]=60 [c]=50 [d]=105 [e]=100)
die() { echo "gpu_check.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --stages) STAGES=${2:-}; shift 2 || die "--stages needs a value" ;;
    --timeout) OVERRIDES=${2:-}; shift 2 || die "--timeout needs a value" ;;
    --budget) BUDGET=${2:-}; shift 2 || die "--budget needs a value" ;;
    --smoke) SMOKE=1; PASS+=(--smoke); shift ;;
    --device) PASS+=(--device "${2:-}"); [ "${2:-}" = cpu ] && export TRITON_INTERPRET=1; shift 2 || die "--device needs a value" ;;
    *) die "unknown argument $1" ;;
  esac
done
if [ "$SMOKE" = 1 ]; then  # the interpreter on a small CPU: slower than a GPU, never hung
  for s in a b c d e; do LIMIT[$s]=300; done
  BUDGET=${BUDGET:-1500}
fi
BUDGET=${BUDGET:-340}
for kv in ${OVERRIDES//,/ }; do
  s=${kv%%=*} t=${kv#*=}
  [[ $s =~ ^[a-e]$ && $t =~ ^[0-9]+$ ]] || die "--timeout wants STAGE=SECONDS,..., got $kv"
  LIMIT[$s]=$t
done
[[ $BUDGET =~ ^[0-9]+$ ]] || die "--budget wants seconds, got $BUDGET"
for s in ${STAGES//,/ }; do [[ $s =~ ^[a-e]$ ]] || die "unknown stage $s; choose from a-e"; done

if [ -z "${OUT:-}" ]; then OUT=$(mktemp -d /tmp/gpu_check.XXXXXX); fi
mkdir -p "$OUT"
WORK=$OUT/gpu_check_stages
rm -rf "$WORK" && mkdir -p "$WORK"  # a rerun's stages never read the last run's files
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1  # a killed stage still has its log, without bars

# The project is not installed on a lent GPU: a package of symlinks to this checkout instead.
# (An installed sketchwalk that is not this checkout counts as none.)
FIND="import importlib.util as u, os, sys; s = u.find_spec('sketchwalk.benchmarks.gpu_check')
sys.exit(s is None or os.path.realpath(s.origin) != os.path.realpath(sys.argv[1]))"
HERE=$PWD
if ! (cd / && "$PY" -c "$FIND" "$HERE/benchmarks/gpu_check.py") 2>/dev/null; then
  SHIM=$(mktemp -d /tmp/sketchwalk-shim.XXXXXX)
  trap 'rm -rf "$SHIM"' EXIT
  mkdir "$SHIM/sketchwalk"
  ln -s "$PWD"/sketchwalk/*.py "$SHIM/sketchwalk/"
  for p in engine kernels store app cli worker eval benchmarks; do ln -s "$PWD/$p" "$SHIM/sketchwalk/$p"; done
  export PYTHONPATH=$SHIM${PYTHONPATH:+:$PYTHONPATH} GPU_CHECK_SHIM=$SHIM
  echo "gpu_check.sh: sketchwalk not installed; using the shim $SHIM"
fi

START=$SECONDS
for s in ${STAGES//,/ }; do
  left=$((BUDGET - (SECONDS - START) - 15))  # 15 s kept for the merge
  if ((left < 5)); then
    echo skip >"$WORK/$s.rc"
    echo "== stage $s skipped: the budget of ${BUDGET} s is spent"
    continue
  fi
  limit=${LIMIT[$s]}
  ((limit > left)) && limit=$left
  echo "$limit" >"$WORK/$s.limit"
  echo "== stage $s (at most $limit s)"
  t0=$SECONDS
  GPU_CHECK_DEADLINE=$(($(date +%s) + limit)) timeout -k 5 "$limit" \
    "$PY" benchmarks/gpu_check.py stage "$s" --work "$WORK" ${PASS[@]+"${PASS[@]}"} 2>&1 | tee "$WORK/$s.log"
  rc=${PIPESTATUS[0]}
  echo "$rc" >"$WORK/$s.rc"
  echo $((SECONDS - t0)) >"$WORK/$s.wall"
  echo "== stage $s: rc $rc after $((SECONDS - START)) s in all"
done
"$PY" benchmarks/gpu_check.py merge --work "$WORK" --stages "$STAGES" --out "$OUT/gpu_check.json" ${PASS[@]+"${PASS[@]}"}
