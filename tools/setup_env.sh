#!/usr/bin/env bash
# Create (or reuse) the CMT-AQR Python environment from the project's own files.
#
#   bash tools/setup_env.sh            # set up, print the activation line
#   CMT_AQR_HOME=/some/dir bash ...    # put the cache and the venv elsewhere
#   CMT_AQR_DEVICE=cuda bash ...        # build for CUDA (default auto: CUDA where a GPU is visible
#                                       # and nvcc is on PATH; cpu forces the CPU build); torch's,
#                                       # nvcc's and the driver's CUDA are checked first (tools/cuda_build.py)
#
# What it does, in order (each step is named when it fails):
#   1. a virtualenv at $CMT_AQR_HOME/venv (default ~/.cache/cmt-aqr/venv)
#   2. torch 2.13.0 + torchvision 0.28.0 from PyPI (~2.8 GB the first time)
#   3. mmcv-full 1.7.2 compiled from source with CPU ops (~12-17 minutes the
#      first time on 2 cores), or with CUDA ops in CUDA mode; the wheel is
#      cached in $CMT_AQR_HOME/wheels (a folder per mode)
#   4. mmdet3d 1.0.0rc6 from its sdist with the `mmcv<=1.7.0` assertion relaxed
#      to 1.7.2 and numpy's removed aliases (np.bool, ...) replaced, rebuilt as
#      a wheel and cached (see docs/install.md, "Why mmdet3d is patched")
#   5. the pinned runtime and test requirements (requirements/*.txt); in CUDA
#      mode spconv's CUDA build matching torch's CUDA instead of `spconv`
#      (the choices: tools/cuda_build.py)
#   6. this project in editable mode, then an import check
#   7. the project's C++ slot kernel for the CPU (~1 minute the first time), cached in
#      $CMT_AQR_HOME/extensions
#
# It is idempotent: a stamp file records a hash of the files that define the
# environment; when nothing changed, a second run only re-links the project
# (seconds).  Delete $CMT_AQR_HOME to start from scratch.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CMT_AQR_HOME="${CMT_AQR_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/cmt-aqr}"
VENV="${CMT_AQR_VENV:-$CMT_AQR_HOME/venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION=2.13.0
TORCH_PYPI_CUDA=13.0  # the CUDA of PyPI's torch==$TORCH_VERSION wheel (checked against nvcc and the driver up front)
TORCHVISION_VERSION=0.28.0
MMCV_VERSION=1.7.2
MMDET3D_VERSION=1.0.0rc6

STEP="start"
START_TIME=$(date +%s)
log() { printf '[setup %4ds] %s\n' "$(( $(date +%s) - START_TIME ))" "$*"; }
fail() { log "FAILED in step: $STEP${1:+ ($1)}"; exit 1; }
trap 'fail "exit code $?, line $LINENO"' ERR

# pip must take torch from PyPI: the machine's pip configuration points
# find-links at a local CPU-only torch that cannot load torchvision.  An empty
# PIP_FIND_LINKS is ignored by pip; a single space overrides the config file.
export PIP_FIND_LINKS=' '
export PIP_DISABLE_PIP_VERSION_CHECK=1

mkdir -p "$CMT_AQR_HOME"
exec 9>"$CMT_AQR_HOME/setup.lock"
if ! flock -n 9; then
    log "another setup is running (lock $CMT_AQR_HOME/setup.lock); waiting for it"
    flock 9
fi

STEP="check python"
"$PYTHON" - <<'EOF' || fail "need Python 3.11 (the cached mmcv wheel and the pinned stack are for 3.11); set PYTHON=/path/to/python3.11"
import sys
sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)
EOF

STEP="choose the CPU or CUDA build"
BUILD_CHOICE=("$PYTHON" "$REPO_ROOT/tools/cuda_build.py" --device "${CMT_AQR_DEVICE:-auto}")
# torch's CUDA, nvcc's and the driver's are compared before anything is installed
read -r BUILD_MODE _ FORCE_CUDA COMPILE_JOBS < <("${BUILD_CHOICE[@]}" --torch-cuda "$TORCH_PYPI_CUDA") \
    || fail "see the cuda_build line above"
[[ -n "$BUILD_MODE" ]] || fail "see the cuda_build line above"

STAMP_FILE="$VENV/.cmt_aqr_stamp"
STAMP="$( (cat "$REPO_ROOT/tools/setup_env.sh" "$REPO_ROOT/tools/cuda_build.py" "$REPO_ROOT"/tools/setup_support/*.py \
    "$REPO_ROOT"/requirements/*.txt; echo "$BUILD_MODE") | sha256sum | cut -c1-16)"
PY="$VENV/bin/python"
PIP=("$PY" -m pip)

install_project() {
    STEP="install project (editable)"
    log "linking this checkout ($REPO_ROOT) into the environment"
    "${PIP[@]}" install -q --no-deps --no-build-isolation -e "$REPO_ROOT"
    STEP="OpenMP wait policy"
    # OpenMP threads that spin while waiting thrash when another process (a data loader worker, a second job)
    # shares the cores: spconv's CPU kernels then ran 10x slower. A .pth line runs at interpreter start-up,
    # before torch loads libgomp, for every entry point of the environment; an explicit setting wins.
    local site
    site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "import os; os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')" >"$site/cmt_aqr_omp_wait_policy.pth"
    # `python tools/x.py` imports `projects` and `tools.data_converter` from the checkout: put its root on sys.path
    # whatever editable-install mode pip chose (newer ones expose only the `projects` package)
    echo "$REPO_ROOT" >"$site/cmt_aqr_repo_root.pth"
    STEP="import check"
    (cd "$REPO_ROOT" && "$PY" -c "import mmcv, mmdet, mmdet3d, spconv.pytorch, projects.mmdet3d_plugin; \
from mmcv.ops import Voxelization; print('imports OK: mmcv', mmcv.__version__, 'mmdet', mmdet.__version__, 'mmdet3d', mmdet3d.__version__)")
    if [[ "$BUILD_MODE" == cuda ]]; then
        STEP="check mmcv's CUDA ops"
        local compiled
        compiled="$("$PY" -c 'from mmcv.ops import get_compiling_cuda_version as v; print(v())')"
        [[ "$compiled" =~ ^[0-9] ]] || fail "mmcv.ops has no CUDA ops (get_compiling_cuda_version: $compiled): delete \
$CMT_AQR_HOME/wheels and run again"
        log "mmcv.ops compiled with CUDA $compiled"
    fi
    STEP="build the C++ slot kernel"
    # the CPU's window slot dot products (attention/slots/cpu_slot_dot.py): compiled once (~1 minute),
    # then only checked against its source's hash (seconds)
    (cd "$REPO_ROOT" && "$PY" -c "from projects.mmdet3d_plugin.attention.slots.cpu_slot_dot import main; \
main()")
}

if [[ -f "$STAMP_FILE" && "$(cat "$STAMP_FILE")" == "$STAMP" ]]; then
    log "environment $VENV is up to date (stamp $STAMP)"
    install_project
    log "done in $(( $(date +%s) - START_TIME ))s. Activate with: source $VENV/bin/activate"
    exit 0
fi

STEP="create virtualenv"
if [[ ! -x "$PY" ]]; then
    log "creating virtualenv $VENV"
    "$PYTHON" -m venv "$VENV"
fi
rm -f "$STAMP_FILE"

STEP="install torch"
if "$PY" -c "import torch, torchvision, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' and torchvision.__version__.split('+')[0] == '$TORCHVISION_VERSION' else 1)" 2>/dev/null; then
    log "torch $TORCH_VERSION / torchvision $TORCHVISION_VERSION already installed"
else
    log "installing torch $TORCH_VERSION + torchvision $TORCHVISION_VERSION from PyPI (~2.8 GB the first time, ~2 min)"
    "${PIP[@]}" install -q "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
fi

STEP="install build tools"
# mmcv's and mmdet3d's setup.py need pkg_resources, gone from setuptools>=70.
# pip then reports "torch requires setuptools>=77": harmless (README, "Known pip check conflicts").
"${PIP[@]}" install -q "setuptools<70" wheel ninja packaging
"$PY" -c "import pkg_resources" || fail "setuptools<70 did not install"

STEP="choose the spconv build"
TORCH_CUDA="$("$PY" -c 'import torch; print(torch.version.cuda or "")')"
read -r _ SPCONV_REQUIREMENT _ < <("${BUILD_CHOICE[@]}" --torch-cuda "$TORCH_CUDA") || fail "see the cuda_build line above"

PY_TAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
WHEELS="$CMT_AQR_HOME/wheels/$PY_TAG-torch$TORCH_VERSION"
[[ "$BUILD_MODE" == cuda ]] && WHEELS="$WHEELS-cuda"
mkdir -p "$WHEELS"

STEP="build mmcv-full $MMCV_VERSION"
MMCV_WHEEL="$(ls "$WHEELS"/mmcv_full-$MMCV_VERSION-*.whl 2>/dev/null | head -n1 || true)"
if [[ -z "$MMCV_WHEEL" ]]; then
    BUILD_LOG="$CMT_AQR_HOME/mmcv-build.log"
    if [[ "$BUILD_MODE" == cuda && -z "${TORCH_CUDA_ARCH_LIST:-}" ]]; then
        # the GPU architectures torch itself was built for (without the variable, torch compiles for the
        # visible GPU only, and a build machine has none)
        export TORCH_CUDA_ARCH_LIST="$("$PY" -c 'import torch; print(";".join(a[3:-1] + "." + a[-1] for a in torch.cuda.get_arch_list() if a.startswith("sm_")))')"
        [[ -n "$TORCH_CUDA_ARCH_LIST" ]] || export TORCH_CUDA_ARCH_LIST="8.0;8.6;8.9;9.0+PTX"
    fi
    if [[ "$BUILD_MODE" == cuda ]]; then
        # PyPI's torch brings CUDA's library headers (cusparse.h, cublas_v2.h, ...) in its nvidia-* wheels; a
        # toolkit with nvcc and the runtime alone lacks them, and torch's CUDA headers include them. Only the
        # headers the toolkit lacks are added (after its own: the wheels' copies of its headers are incomplete)
        NVIDIA_ROOT="$("$PY" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null || true)"
        # the toolkit nvcc belongs to, as nvcc itself reports it (torch takes `which nvcc`'s parent otherwise, e.g.
        # /usr/local for a wrapper script in /usr/local/bin, and looks for the CUDA headers there)
        NVCC_TOP="$(nvcc -v --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n1)"
        [[ -n "$NVCC_TOP" ]] && export CUDA_HOME="${CUDA_HOME:-$(readlink -f "$NVCC_TOP")}"
        TOOLKIT_INCLUDE="$CUDA_HOME/include"
        EXTRA_INCLUDE="$CMT_AQR_HOME/cuda-extra-include"
        rm -rf "$EXTRA_INCLUDE" && mkdir -p "$EXTRA_INCLUDE"
        for header in "${NVIDIA_ROOT:-/nonexistent}"/*/include/*; do
            name="$(basename "$header")"
            [[ -e "$header" && ! -e "$TOOLKIT_INCLUDE/$name" && ! -e "$EXTRA_INCLUDE/$name" ]] \
                && ln -s "$header" "$EXTRA_INCLUDE/$name"
        done
        export CPATH="${CPATH:+$CPATH:}$EXTRA_INCLUDE"
    fi
    log "compiling mmcv-full $MMCV_VERSION with $BUILD_MODE ops (FORCE_CUDA=$FORCE_CUDA${TORCH_CUDA_ARCH_LIST:+, GPU architectures $TORCH_CUDA_ARCH_LIST}, ${MAX_JOBS:-$COMPILE_JOBS} jobs; how long it takes: docs/results.md, \"Test suite and setup times\"; log: $BUILD_LOG)"
    BUILD_DIR="$(mktemp -d)"
    # --no-cache-dir: pip would otherwise take a wheel it built before (the CPU build, or one for another torch)
    # from its own cache instead of compiling; this script's cache above is per mode and torch version
    MMCV_WITH_OPS=1 FORCE_CUDA="$FORCE_CUDA" MAX_JOBS="${MAX_JOBS:-$COMPILE_JOBS}" \
        "${PIP[@]}" wheel -v --no-cache-dir --no-build-isolation --no-deps -w "$BUILD_DIR" "mmcv-full==$MMCV_VERSION" \
        >"$BUILD_LOG" 2>&1 &
    BUILD_PID=$!
    while kill -0 "$BUILD_PID" 2>/dev/null; do
        sleep 60
        kill -0 "$BUILD_PID" 2>/dev/null && log "  still compiling mmcv: $(grep -o '\[[0-9]*/[0-9]*\]' "$BUILD_LOG" | tail -n1 || true) compile units done"
    done
    wait "$BUILD_PID" || { tail -n 40 "$BUILD_LOG"; fail "mmcv compilation failed, see $BUILD_LOG"; }
    mv "$BUILD_DIR"/mmcv_full-*.whl "$WHEELS"/
    rm -rf "$BUILD_DIR"
    MMCV_WHEEL="$(ls "$WHEELS"/mmcv_full-$MMCV_VERSION-*.whl | head -n1)"
    log "cached $MMCV_WHEEL"
else
    log "using cached mmcv wheel $MMCV_WHEEL"
fi

STEP="build patched mmdet3d $MMDET3D_VERSION"
# Bump MMDET3D_PATCH when the patch below changes: it names the cache folder of the patched wheel.
MMDET3D_PATCH=2
MMDET3D_WHEELS="$WHEELS/mmdet3d-patch$MMDET3D_PATCH"
mkdir -p "$MMDET3D_WHEELS"
MMDET3D_WHEEL="$(ls "$MMDET3D_WHEELS"/mmdet3d-$MMDET3D_VERSION-*.whl 2>/dev/null | head -n1 || true)"
if [[ -z "$MMDET3D_WHEEL" ]]; then
    log "building mmdet3d $MMDET3D_VERSION: mmcv version assertion relaxed to $MMCV_VERSION, numpy>=1.24 aliases fixed"
    SRC_DIR="$(mktemp -d)"
    "${PIP[@]}" download -q --no-deps --no-binary :all: --no-build-isolation -d "$SRC_DIR" "mmdet3d==$MMDET3D_VERSION"
    tar -xzf "$SRC_DIR"/mmdet3d-*.tar.gz -C "$SRC_DIR"
    INIT="$(ls "$SRC_DIR"/mmdet3d-*/mmdet3d/__init__.py)"
    PKG_DIR="$(dirname "$INIT")"
    grep -q "mmcv_maximum_version = '1.7.0'" "$INIT" || fail "mmdet3d's version assertion is not where expected in $INIT"
    sed -i "s/mmcv_maximum_version = '1.7.0'/mmcv_maximum_version = '$MMCV_VERSION'/" "$INIT"
    # numpy 1.24 removed the aliases np.bool/np.int/np.float/np.long/np.object that mmdet3d still uses
    # (e.g. ObjectRangeFilter's `mask.astype(np.bool)`); numpy<2 is pinned for nuscenes-devkit.
    find "$PKG_DIR" -name '*.py' -print0 | xargs -0 sed -i -E \
        -e 's/\bnp\.bool\b([^_]|$)/np.bool_\1/g' -e 's/\bnp\.int\b([^_0-9]|$)/np.int_\1/g' \
        -e 's/\bnp\.float\b([^_0-9]|$)/np.float64\1/g' -e 's/\bnp\.long\b([^_]|$)/np.int64\1/g' \
        -e 's/\bnp\.object\b([^_]|$)/np.object_\1/g'
    if grep -rn -E '\bnp\.(bool|int|float|long|object)\b([^_0-9]|$)' "$PKG_DIR" --include='*.py'; then
        fail "removed numpy aliases are left in mmdet3d (listed above)"
    fi
    "${PIP[@]}" wheel -q --no-build-isolation --no-deps -w "$MMDET3D_WHEELS" "$(dirname "$PKG_DIR")"
    rm -rf "$SRC_DIR"
    MMDET3D_WHEEL="$(ls "$MMDET3D_WHEELS"/mmdet3d-$MMDET3D_VERSION-*.whl | head -n1)"
    log "cached $MMDET3D_WHEEL"
else
    log "using cached mmdet3d wheel $MMDET3D_WHEEL"
fi

STEP="install mmcv, mmdet3d and pinned requirements"
log "installing mmcv-full, mmdet3d (--no-deps), requirements/*.txt and $SPCONV_REQUIREMENT"
RUNTIME_REQUIREMENTS="$(mktemp)"
grep -v -E '^spconv([=<>~ ]|$)' "$REPO_ROOT/requirements/runtime.txt" >"$RUNTIME_REQUIREMENTS"
if [[ "$BUILD_MODE" == cuda ]]; then
    "${PIP[@]}" uninstall -q -y spconv 2>/dev/null || true  # the CPU build and a CUDA build both provide `spconv`
fi
"${PIP[@]}" install -q "$MMCV_WHEEL" "$SPCONV_REQUIREMENT" -r "$RUNTIME_REQUIREMENTS" -r "$REPO_ROOT/requirements/tests.txt"
rm -f "$RUNTIME_REQUIREMENTS"
"${PIP[@]}" install -q --no-deps "mmsegmentation==0.30.0" "lyft-dataset-sdk==0.0.8"
# the patched wheel keeps mmdet3d's version number: force it over an older patch level
"${PIP[@]}" install -q --no-deps --force-reinstall "$MMDET3D_WHEEL"
# Two cv2 distributions must agree, or they overwrite each other's files.
"${PIP[@]}" install -q --force-reinstall --no-deps "opencv-python-headless==4.11.0.86" "opencv-python==4.11.0.86"
"$PY" -c "import numpy, cv2; assert numpy.__version__.startswith('1.'), numpy.__version__; print('numpy', numpy.__version__, 'cv2', cv2.__version__)" \
    || fail "numpy<2 / opencv<4.12 pins were not honoured"

install_project
echo "$STAMP" >"$STAMP_FILE"
log "environment ready in $(( $(date +%s) - START_TIME ))s. Activate with: source $VENV/bin/activate"
