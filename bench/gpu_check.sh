#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU and nothing installed beyond its CUDA toolkit (plus a
# C compiler, meson, ninja and python3 with torch), builds the engine with CUDA, runs the GPU tests
# (kernels against the scalar CPU path, every tower on a VRAM executor against a RAM executor on the
# same checkpoint), runs them again under compute-sanitizer, and benchmarks texts per second at batch
# 1, 64 and 1024 on the base configuration beside PyTorch bf16 on the same weights. Finishes in under
# 8 minutes on an H200 and writes its figures to one file: $OUT/gpu_check.txt, or build-gpu/gpu_check.txt.
#
#     bench/gpu_check.sh              # run the check
#     bench/gpu_check.sh --prepare    # on a Debian machine with apt: fetch the two libraries the GPU
#                                     # machine lacks (jansson, cmocka) into .gpu-deps/ to carry there
#
# Libraries the machine lacks are taken from .gpu-deps/ when it is there (headers and shared objects
# from Debian's packages, unpacked by --prepare): they go on CPATH, LIBRARY_PATH and LD_LIBRARY_PATH,
# and meson finds them without pkg-config.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ "${1:-}" = "--prepare" ]; then
    set -e
    rm -rf .gpu-deps && mkdir -p .gpu-deps/debs
    (cd .gpu-deps/debs && apt-get download libjansson4 libjansson-dev libcmocka0 libcmocka-dev)
    for deb in .gpu-deps/debs/*.deb; do dpkg -x "$deb" .gpu-deps/root; done
    rm -rf .gpu-deps/debs
    # Links do not travel well: make every library link a copy.
    find .gpu-deps/root -type l | while read -r link; do cp --remove-destination "$(readlink -f "$link")" "$link"; done
    grep -qx '/.gpu-deps/' .git/info/exclude 2>/dev/null || echo '/.gpu-deps/' >> .git/info/exclude
    du -sh .gpu-deps
    exit 0
fi

OUTDIR=${OUT:-$ROOT/build-gpu}
mkdir -p "$OUTDIR"
REPORT=$OUTDIR/gpu_check.txt
: > "$REPORT"
START=$(date +%s)
say() { echo "$*" | tee -a "$REPORT"; }
stage() { say ""; say "== $* ($(( $(date +%s) - START )) s)"; }

stage "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$REPORT"
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvcc --version | tail -1 | tee -a "$REPORT"
for tool in cc gcc c++ meson ninja pkg-config compute-sanitizer python3; do
    printf '%s: %s\n' "$tool" "$(command -v $tool || echo missing)" | tee -a "$REPORT"
done
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 | tee -a "$REPORT"

if [ -d .gpu-deps/root ]; then
    DEPS=$ROOT/.gpu-deps/root
    export CPATH=$DEPS/usr/include${CPATH:+:$CPATH}
    export LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
    export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    say "using carried libraries from .gpu-deps"
fi

export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# GPU_CHECK_PREBUILT=1 takes build-gpu as it is (built elsewhere with -Dcuda=enabled: the binaries only
# need glibc, jansson, cmocka and the CUDA runtime), when the device time is too short for a build.
if [ -z "${GPU_CHECK_PREBUILT:-}" ]; then
    stage "build (meson, CUDA enabled, sm_90 + PTX)"
    rm -rf build-gpu/meson-private build-gpu/build.ninja
    if ! meson setup build-gpu -Dcuda=enabled -Dbuildtype=release -Db_ndebug=false > "$OUTDIR/setup.log" 2>&1; then
        tail -40 "$OUTDIR/setup.log" | tee -a "$REPORT"
        say "FAILED: meson setup"
        exit 1
    fi
    grep -A14 '^  Features' "$OUTDIR/setup.log" | tee -a "$REPORT"
    if ! ninja -C build-gpu > "$OUTDIR/build.log" 2>&1; then
        grep -E 'error|Error' "$OUTDIR/build.log" | head -40 | tee -a "$REPORT"
        say "FAILED: build"
        exit 1
    fi
    say "built"
fi

# Every stage has its own time limit, and the whole check a budget (GPU_CHECK_SECONDS, default 420 s):
# a stage that would start past it is skipped and said so.
BUDGET=${GPU_CHECK_SECONDS:-420}
FAILED=0
run_stage() { # name, limit in seconds, log file, command...
    local name=$1 limit=$2 log=$3
    shift 3
    local left=$(( BUDGET - ($(date +%s) - START) ))
    if [ $left -lt 15 ]; then say "$name: skipped (budget spent)"; return; fi
    [ $limit -gt $left ] && limit=$left
    timeout $limit "$@" > "$log" 2>&1
    local code=$?
    say "$name: $([ $code -eq 0 ] && echo OK || echo "FAILED (exit $code)")"
    [ $code -eq 0 ] || FAILED=1
}

stage "VRAM executor against a RAM executor: every verb, every scalar, cosines"
run_stage "test_vram" 120 "$OUTDIR/test-vram.log" build-gpu/tests/test_vram
grep -E 'cosine|max|OK|FAIL|ERROR|error|SKIP' "$OUTDIR/test-vram.log" | head -60 | tee -a "$REPORT"

stage "benchmark: texts/s, base configuration, uform VRAM vs PyTorch bf16"
run_stage "bench_gpu" 150 "$OUTDIR/bench.log" python3 bench/bench_gpu.py --build build-gpu --out "$REPORT" --seconds 1.5
tail -5 "$OUTDIR/bench.log" | grep -iE 'error|fail|Traceback' | tee -a "$REPORT"

stage "compute-sanitizer (memcheck) on the GPU tests"
if command -v compute-sanitizer >/dev/null; then
    export UFORM_VRAM_QUICK=1
    run_stage "test_vram under memcheck" 90 "$OUTDIR/sanitizer-vram.log" \
        compute-sanitizer --tool memcheck --error-exitcode 99 build-gpu/tests/test_vram
    grep -E 'ERROR SUMMARY|Invalid|out of bounds' "$OUTDIR/sanitizer-vram.log" | head -10 | tee -a "$REPORT"
    run_stage "test_cuda under memcheck" 90 "$OUTDIR/sanitizer-cuda.log" \
        compute-sanitizer --tool memcheck --error-exitcode 99 build-gpu/tests/test_cuda
    grep -E 'ERROR SUMMARY|Invalid|out of bounds' "$OUTDIR/sanitizer-cuda.log" | head -10 | tee -a "$REPORT"
else
    say "compute-sanitizer: not found"
fi

stage "CUDA kernels against the scalar CPU path"
run_stage "test_cuda" 60 "$OUTDIR/test-cuda.log" build-gpu/tests/test_cuda
grep -E 'max|FAIL|ERROR|error' "$OUTDIR/test-cuda.log" | head -40 | tee -a "$REPORT"

stage "done"
say "gpu_check: $([ $FAILED -eq 0 ] && echo PASSED || echo FAILED) in $(( $(date +%s) - START )) s"
exit $FAILED
