#!/bin/sh
# datamount with its GIL sampled by py-spy, for the side-by-side bench:
#   BENCH_DATAMOUNT=$PWD/benchmarks/gil_wrap.sh .../run.py ...
#   python benchmarks/_gil.py summary /tmp/datamount-bench/gil [RESULTS.json]
# One invocation = one <epoch>-<pid>.raw (py-spy's samples) + .argv (the arguments, one a
# line) in $DATAMOUNT_GIL_DIR (default /tmp/datamount-bench/gil). The process stays
# datamount (exec: same pid, so the harness's CPU and RSS figures are datamount's own);
# py-spy attaches 0.5 s after the start (the interpreter's start-up is not sampled) and
# stops when datamount exits. datamount: $DATAMOUNT_BIN, else `datamount` from PATH;
# py-spy: $PY_SPY, else from PATH (missing: datamount runs unsampled).
dir=${DATAMOUNT_GIL_DIR:-/tmp/datamount-bench/gil}
spy=${PY_SPY:-$(command -v py-spy)}
mkdir -p "$dir" || exit 1
stem="$dir/$(date +%s.%N)-$$"
if [ -n "$spy" ]; then
    printf '%s\n' "$@" > "$stem.argv"
    (sleep 0.5; exec "$spy" record --gil --nonblocking -r 200 -f raw -o "$stem.raw" --pid $$) \
        > "$stem.log" 2>&1 < /dev/null &
fi
exec "${DATAMOUNT_BIN:-datamount}" "$@"
