#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU and nothing installed beyond its CUDA toolkit (plus a
# C compiler, meson, ninja and python3 with torch), builds the engine with CUDA, runs the GPU tests (every
# kernel against the scalar CPU path; every verb and scalar on a VRAM executor against a RAM executor on
# the same checkpoint: texts, pixels, image files, clips and sounds, at cosine >= 0.999; the CUDA libraries
# opened on first use), the training checks (every training kernel against the scalar path or the RAM
# trainer's formulas; the VRAM trainer against the RAM trainer on the same seed and batch: the first steps'
# losses within 1e-2, weights after 3 steps at cosine >= 0.999 per tensor, resume and repeated runs bit for
# bit, saves moving between residencies, non-finite losses and norms skipped), runs them again under
# compute-sanitizer, and benchmarks training (the base configuration, batch 256 of texts and images: samples/s
# and MFU beside a PyTorch bf16 autocast loop of the same model and batch, bench/bench_train.py --device
# cuda) and texts, images (from pixels and from JPEG files end to end), clips and sounds per second at batch
# 1, 64 and 1024 on the base configuration beside PyTorch bf16 (eager and SDPA) on the same weights, and the
# meshes of VRAM executors under mpirun (tests/train/mesh_train.c's vram modes): 2 ranks on the one GPU
# against 1 rank on the whole batch (weights to BF16 rounding; the collectives the mesh chose, NCCL's
# multi-rank mode or staged through pinned memory, are printed), and a rank injected late past the mesh's
# timeout, which must end its step and the other's with UFORM_DEVICE within the timeout of each one's
# collective, the mesh unusable after; and the pretrained families the VRAM path takes (text towers:
# all-MiniLM-L6-v2, BGE, E5, a last-token pooling BERT, all-mpnet-base-v2 (its bias by relative position),
# LaBSE (a Dense module with tanh) and multilingual E5 as tests/model/pretrained_folders.py writes them,
# CLIP's and SigLIP's as tests/model/test_families_reference.py --folders-only does, UForm 3's where PyPI's
# uform imports): each folder's text embeddings, and CLIP's and UForm 3's image embeddings of PNG files, on
# a VRAM executor against a RAM executor's, cosine >= 0.9999 per item, and items/s of both
# (bench/bench_families.c). Meant to finish in under 8
# minutes on an H200 (each stage has a limit and the whole a budget), writing its figures to one file:
# $OUT/gpu_check.txt, or build-gpu/gpu_check.txt.
#
#     bench/gpu_check.sh              # run the check
#     bench/gpu_check.sh --prepare    # on a Debian 12 machine with apt: gather the libraries the GPU
#                                     # machine lacks into .gpu-deps/ (ignored by git), to carry there
#
# --prepare fetches Debian's packages of jansson, cmocka, libjpeg-turbo, libspng, zlib and pkgconf (headers,
# shared objects, .pc files, the pkg-config program) and Open MPI's (mpirun, libmpi and the libraries
# they load: PMIx, hwloc, libevent, libfabric, UCX, verbs, ...), and builds a small static FFmpeg from Debian's source
# package (the demuxers, decoders, resampler, scaler and MPEG-4 encoder the engine and `uform dataset
# synth` use, nothing it would fetch; C only, position-independent, to link into libuform.so; about
# 9 MB), all under .gpu-deps/root. It takes about half an hour on two cores. On the GPU machine the carried libraries go
# on CPATH, LIBRARY_PATH and LD_LIBRARY_PATH, and the carried pkg-config finds them (PKG_CONFIG_LIBDIR,
# PKG_CONFIG_SYSROOT_DIR), so that the media verbs are built there too; Open MPI, built for /usr, is moved
# to the carried folder with OPAL_PREFIX (its plugins, help files and settings found there: this runs
# offline in a mount namespace where the system's Open MPI is hidden), and its mpirun is mpirun.openmpi.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

FFMPEG_VERSION=5.1.9
if [ "${1:-}" = "--prepare" ]; then
    set -e
    rm -rf .gpu-deps && mkdir -p .gpu-deps/debs .gpu-deps/apt/lists/partial .gpu-deps/apt/cache/archives/partial
    (cd .gpu-deps/debs && apt-get download libjansson4 libjansson-dev libcmocka0 libcmocka-dev libturbojpeg0 \
        libturbojpeg0-dev libspng0 libspng-dev zlib1g zlib1g-dev pkgconf pkgconf-bin libpkgconf3 \
        libopenmpi3 libopenmpi-dev openmpi-bin openmpi-common libpmix2 libhwloc15 libevent-2.1-7 \
        libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 librdmacm1 libpsm2-2 \
        libpsm-infinipath1 libnl-3-200 libnl-route-3-200 libmunge2 libnuma1 libgfortran5 libquadmath0 libltdl7 \
        libxnvctrl0 libpciaccess0)
    for deb in .gpu-deps/debs/*.deb; do dpkg -x "$deb" .gpu-deps/root; done
    # FFmpeg's source, through a sources list of its own (the system's is left as it is).
    APT=(-o Dir::Etc::SourceList="$ROOT/.gpu-deps/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
         -o Dir::State::Lists="$ROOT/.gpu-deps/apt/lists" -o Dir::Cache="$ROOT/.gpu-deps/apt/cache")
    echo "deb-src http://deb.debian.org/debian bookworm main" > .gpu-deps/apt/sources.list
    echo "deb-src http://deb.debian.org/debian-security bookworm-security main" >> .gpu-deps/apt/sources.list
    apt-get -q "${APT[@]}" update
    (cd .gpu-deps/apt && apt-get -q "${APT[@]}" source --download-only ffmpeg)
    tar -xf .gpu-deps/apt/ffmpeg_"$FFMPEG_VERSION".orig.tar.xz -C .gpu-deps/apt
    (cd .gpu-deps/apt/ffmpeg-"$FFMPEG_VERSION" &&
        ./configure --prefix=/usr/local/ffmpeg --disable-everything --disable-programs --disable-doc \
            --disable-network --disable-autodetect --disable-asm --disable-debug --enable-static --disable-shared \
            --enable-pic \
            --disable-avdevice --disable-avfilter --disable-postproc --enable-protocol=file \
            --enable-demuxer=mov,wav,avi,matroska,mp3,ogg,flac,aac --enable-muxer=mp4,mov,avi \
            --enable-encoder=mpeg4 \
            --enable-decoder=h264,mpeg4,mjpeg,ffv1,rawvideo,vp8,vp9,pcm_s16le,pcm_s24le,pcm_s32le,pcm_f32le,pcm_f64le,pcm_u8,mp3,mp3float,vorbis,flac,opus,aac \
            --enable-parser=h264,mpeg4video,mpegaudio,vorbis,opus,flac,aac,vp8,vp9,mjpeg > ../configure.log &&
        make -j"$(nproc)" > ../make.log && make install DESTDIR="$ROOT/.gpu-deps/root" > ../install.log)
    strip --strip-debug .gpu-deps/root/usr/local/ffmpeg/lib/*.a
    rm -rf .gpu-deps/debs .gpu-deps/apt
    # Links do not travel well: make every library link a copy.
    find .gpu-deps/root -type l | while read -r link; do cp --remove-destination "$(readlink -f "$link")" "$link"; done
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
echo "cpus: $(nproc)" | tee -a "$REPORT"
for tool in cc gcc c++ meson ninja pkg-config compute-sanitizer python3; do
    printf '%s: %s\n' "$tool" "$(command -v $tool || echo missing)" | tee -a "$REPORT"
done
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 | tee -a "$REPORT"

if [ -d .gpu-deps/root ]; then
    DEPS=$ROOT/.gpu-deps/root
    LIBS=$DEPS/usr/lib/x86_64-linux-gnu
    export CPATH=$DEPS/usr/include${CPATH:+:$CPATH}
    export LIBRARY_PATH=$LIBS${LIBRARY_PATH:+:$LIBRARY_PATH}
    export LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PATH=$PATH:$DEPS/usr/bin
    export PKG_CONFIG_LIBDIR=$LIBS/pkgconfig:$DEPS/usr/share/pkgconfig:$DEPS/usr/local/ffmpeg/lib/pkgconfig
    export PKG_CONFIG_SYSROOT_DIR=$DEPS
    export OPAL_PREFIX=$DEPS/usr OPAL_SYSCONFDIR=$DEPS/etc/openmpi
    export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$LIBS/openmpi/lib
    say "using carried libraries from .gpu-deps"
fi
MPIRUN=$(command -v mpirun || command -v mpirun.openmpi || echo mpirun)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# GPU_CHECK_PREBUILT=1 takes build-gpu as it is (built elsewhere with -Dcuda=enabled: the binaries only
# need glibc, the carried libraries and the CUDA toolkit's), when the device time is too short for a build.
if [ -z "${GPU_CHECK_PREBUILT:-}" ]; then
    stage "build (meson, CUDA enabled, sm_90 + PTX)"
    rm -rf build-gpu/meson-private build-gpu/build.ninja
    if ! meson setup build-gpu -Dcuda=enabled -Dbuildtype=release -Db_ndebug=false \
        -Dmicrohttpd=disabled > "$OUTDIR/setup.log" 2>&1; then
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

# Every stage has its own time limit, and the whole check a budget (GPU_CHECK_SECONDS, default 450 s):
# a stage that would start past it is skipped and said so.
BUDGET=${GPU_CHECK_SECONDS:-450}
FAILED=0
run_stage() { # name, limit in seconds, log file, command...
    local name=$1 limit=$2 log=$3
    shift 3
    local left=$(( BUDGET - ($(date +%s) - START) ))
    if [ $left -lt 15 ]; then say "$name: skipped (budget spent)"; return; fi
    [ $limit -gt $left ] && limit=$left
    timeout $limit "$@" > "$log" 2>&1
    local code=$?
    say "$name: $([ $code -eq 0 ] && echo OK || ([ $code -eq 77 ] && echo SKIPPED || echo "FAILED (exit $code)"))"
    [ $code -eq 0 ] || [ $code -eq 77 ] || FAILED=1
}

stage "VRAM executor against a RAM executor: every verb, every scalar, cosines"
run_stage "test_vram" 150 "$OUTDIR/test-vram.log" build-gpu/tests/test_vram build-gpu/tools/uform
grep -E 'cosine|max|bitwise|OK|FAIL|ERROR|error|SKIP' "$OUTDIR/test-vram.log" | head -80 | tee -a "$REPORT"

stage "CUDA kernels against the scalar CPU path; the CUDA libraries opened on first use"
run_stage "test_cuda" 60 "$OUTDIR/test-cuda.log" build-gpu/tests/test_cuda
grep -E 'max|bitwise|exact|FAIL|ERROR|error|SKIP' "$OUTDIR/test-cuda.log" | head -40 | tee -a "$REPORT"
run_stage "test_cuda_library" 30 "$OUTDIR/test-cuda-library.log" build-gpu/tests/test_cuda_library
run_stage "cpu_process_maps_no_cuda" 30 "$OUTDIR/maps.log" build-gpu/tests/cpu_process_maps_no_cuda
run_stage "test_vram_host" 30 "$OUTDIR/vram-host.log" build-gpu/tests/test_vram_host
grep -E 'FAIL|ERROR|create_vram' "$OUTDIR/test-cuda-library.log" "$OUTDIR/maps.log" "$OUTDIR/vram-host.log" | head | tee -a "$REPORT"

stage "pretrained families on a VRAM executor against a RAM executor: embeddings per item, items/s"
FAMILIES=$OUTDIR/families
mkdir -p "$FAMILIES"
families_folders() { # random weights at published shapes, BF16-valued, as the CPU path's reference tests make
    # them; multilingual E5 last (its tokenizer is trained on a corpus first)
    for family in all-minilm-l6-v2 bge-small-en-v1.5 e5-base last-token all-mpnet-base-v2 labse; do
        python3 tests/model/pretrained_folders.py "$family" "$FAMILIES/$family" --workdir "$FAMILIES/work" ||
            echo "folder $family: not written"
    done
    python3 tests/model/test_families_reference.py --folders-only --workdir "$FAMILIES/reference" \
        --families clip,siglip,uform3
    python3 tests/model/pretrained_folders.py multilingual-e5-small "$FAMILIES/multilingual-e5-small" \
        --workdir "$FAMILIES/work" || echo "folder multilingual-e5-small: not written"
}
families_images() { # PNG files of several sizes and aspects (Python's zlib alone), listed one a line
    python3 - "$FAMILIES/images" <<'PYTHON'
import pathlib, random, struct, sys, zlib
folder = pathlib.Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
paths = []
for index, (width, height) in enumerate([(320, 240), (375, 500), (224, 224), (700, 100), (97, 131), (1024, 768)]):
    noise = random.Random(index)
    rows = bytearray()
    for y in range(height):
        rows.append(0)
        for x in range(width):
            rows += bytes(((x * 255) // width, (y * 255) // height, (x * y + noise.randrange(64)) % 256))
    path = folder / f"image-{index}.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
                     chunk(b"IDAT", zlib.compress(bytes(rows))) + chunk(b"IEND", b""))
    paths.append(str(path))
(folder / "list.txt").write_text("\n".join(paths) + "\n")
PYTHON
}
families_check() { # every folder written: VRAM = RAM per text and image; a refused tower prints why
    local failed=0 folder code images=()
    [ -s "$FAMILIES/images/list.txt" ] && images=(--images "$FAMILIES/images/list.txt")
    for folder in all-minilm-l6-v2 bge-small-en-v1.5 e5-base last-token all-mpnet-base-v2 labse multilingual-e5-small \
        reference/clip reference/siglip reference/uform3; do
        [ -f "$FAMILIES/$folder/config.json" ] || continue
        build-gpu/bench/bench_families "$FAMILIES/$folder" --texts 512 --seconds 1 "${images[@]}"
        code=$?
        [ $code -eq 0 ] || [ $code -eq 77 ] || failed=1
    done
    return $failed
}
export -f families_folders families_images families_check
export FAMILIES
run_stage "family folders (transformers, sentence-transformers)" 90 "$OUTDIR/family-folders.log" \
    bash -c families_folders
grep -E 'not written|written:|cannot be imported|rror' "$OUTDIR/family-folders.log" | head -10 | tee -a "$REPORT"
run_stage "image files (PNG)" 20 "$OUTDIR/family-images.log" bash -c families_images
run_stage "families: VRAM = RAM per text and per image at cosine >= 0.9999" 75 "$OUTDIR/families.log" \
    bash -c families_check
grep -E '^\{|^item|bench_families' "$OUTDIR/families.log" | head -40 | tee -a "$REPORT"

stage "training: the VRAM trainer against the RAM trainer (losses, weights, resume, repeat, residencies)"
run_stage "test_vram_train" 120 "$OUTDIR/test-vram-train.log" build-gpu/tests/test_vram_train build-gpu/tools/uform
grep -E 'loss|cosine|OK|FAIL|ERROR|error|SKIP' "$OUTDIR/test-vram-train.log" | head -40 | tee -a "$REPORT"
run_stage "test_train_device" 30 "$OUTDIR/train-device.log" build-gpu/tests/test_train_device

stage "meshes of VRAM executors under mpirun: 2 ranks on the one GPU against 1; an injected rank failure"
MESHES=$OUTDIR/meshes
mkdir -p "$MESHES"
mesh_pair() { # 1 rank on the whole batch, 2 on halves, then their weights compared to BF16 rounding
    build-gpu/tests/mesh_train vram single "$MESHES/single.safetensors" &&
        "$MPIRUN" --oversubscribe --mca btl self,vader -n 2 build-gpu/tests/mesh_train vram mesh \
            "$MESHES/mesh.safetensors" &&
        build-gpu/tests/mesh_train compare "$MESHES/mesh.safetensors" "$MESHES/single.safetensors" 1e-2
}
export -f mesh_pair
export MESHES MPIRUN OUTDIR
run_stage "2 ranks on one GPU = 1 rank" 120 "$OUTDIR/mesh-pair.log" bash -c mesh_pair
grep -E 'collectives|worst|differs|FAIL|rror' "$OUTDIR/mesh-pair.log" | head -10 | tee -a "$REPORT"
mesh_fault() { # every rank's third step ends with UFORM_DEVICE inside its timeout, the mesh unusable after
    "$MPIRUN" --oversubscribe --mca btl self,vader -n 2 build-gpu/tests/mesh_train vram fault \
        "$MESHES/fault.safetensors"
    [ "$(grep -cE '^rank [01]: step 3: device after' "$OUTDIR/mesh-fault.log")" -eq 2 ] &&
        [ "$(grep -cE '^rank [01]: mesh usable 0, the next step refused 1' "$OUTDIR/mesh-fault.log")" -eq 2 ]
}
export -f mesh_fault
run_stage "injected rank failure ends in UFORM_DEVICE within the timeout" 90 "$OUTDIR/mesh-fault.log" bash -c mesh_fault
grep -E '^rank|FAIL|rror' "$OUTDIR/mesh-fault.log" | head -10 | tee -a "$REPORT"

stage "benchmark: training, base configuration, uform VRAM trainer vs PyTorch bf16 autocast"
run_stage "bench_train --device cuda" 150 "$OUTDIR/bench-train.log" python3 bench/bench_train.py --build build-gpu \
    --device cuda --steps 10 --warmup 3 --out "$REPORT"
tail -5 "$OUTDIR/bench-train.log" | grep -iE 'error|fail|Traceback' | tee -a "$REPORT"

stage "benchmark: texts, pixels, JPEG files, clips, sounds per second, uform VRAM vs PyTorch bf16"
run_stage "bench_gpu" 200 "$OUTDIR/bench.log" python3 bench/bench_gpu.py --build build-gpu --out "$REPORT" --seconds 1.0
tail -5 "$OUTDIR/bench.log" | grep -iE 'error|fail|Traceback' | tee -a "$REPORT"

stage "compute-sanitizer (memcheck) on the GPU tests"
if command -v compute-sanitizer >/dev/null; then
    export UFORM_VRAM_QUICK=1
    run_stage "test_vram under memcheck" 90 "$OUTDIR/sanitizer-vram.log" \
        compute-sanitizer --tool memcheck --error-exitcode 99 build-gpu/tests/test_vram build-gpu/tools/uform
    grep -E 'ERROR SUMMARY|Invalid|out of bounds' "$OUTDIR/sanitizer-vram.log" | head -10 | tee -a "$REPORT"
    run_stage "test_cuda under memcheck" 60 "$OUTDIR/sanitizer-cuda.log" \
        compute-sanitizer --tool memcheck --error-exitcode 99 build-gpu/tests/test_cuda
    grep -E 'ERROR SUMMARY|Invalid|out of bounds' "$OUTDIR/sanitizer-cuda.log" | head -10 | tee -a "$REPORT"
    run_stage "test_vram_train under memcheck" 90 "$OUTDIR/sanitizer-vram-train.log" \
        compute-sanitizer --tool memcheck --error-exitcode 99 build-gpu/tests/test_vram_train build-gpu/tools/uform
    grep -E 'ERROR SUMMARY|Invalid|out of bounds' "$OUTDIR/sanitizer-vram-train.log" | head -10 | tee -a "$REPORT"
else
    say "compute-sanitizer: not found"
fi

stage "done"
say "gpu_check: $([ $FAILED -eq 0 ] && echo PASSED || echo FAILED) in $(( $(date +%s) - START )) s"
exit $FAILED
