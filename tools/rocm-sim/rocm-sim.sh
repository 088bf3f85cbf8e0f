#!/usr/bin/env bash
# make rocm-sim: the real ROCm JAX stack (jax-rocm7-plugin 0.12.0, Debian's ROCm 7.2 runtime)
# on AMD's rocJITsu simulated MI350X (gfx950), in a Debian sid chroot, then our checks in it.
# A development-machine target (root, debootstrap, network, ~10 GB); never part of make test.
# Issue 46, item 1. Each stage leaves a stamp in $ROCM_SIM_DIR/stamps and is skipped when
# its stamp is there: delete a stamp to redo that stage.
#
#   ROCM_SIM_DIR   where everything is built and cached (default build/rocm-sim)
#   ROCJITSU       a rocJITsu build folder this script made before (copied, not rebuilt)
#   ROCJITSU_GIT   rocJITsu's public source (default ROCm/rocm-systems) ...
#   ROCJITSU_REF   ... at this commit (the one the checks ran on; also in NautRobot/Eze-P)
#   ROCJITSU_PATH  ... in this folder of it
#   STAGES         which stages to run (default: all, in order)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DIR=$(realpath -m "${ROCM_SIM_DIR:-$REPO/build/rocm-sim}")
ROOT=$DIR/sid
ROCJITSU_GIT=${ROCJITSU_GIT:-https://github.com/ROCm/rocm-systems.git}
ROCJITSU_REF=${ROCJITSU_REF:-96b8d0f254623442c4ffcb0eca6d6b6af2d313fb}
ROCJITSU_PATH=${ROCJITSU_PATH:-emulation/rocjitsu}
FLATBUFFERS_REF=v24.3.25
PY=3.14
WHEELS="jax==0.12.0 jaxlib==0.12.0 jax-rocm7-plugin==0.12.0 jax-rocm7-pjrt==0.12.0
        scikit-build-core cmake ninja pytest hypothesis flatbuffers ml_dtypes"
NODEPS_WHEELS="triton==3.6.0 flydsl==0.4.2"
PACKAGES="libamdhip64-7 libhsa-runtime64-1 librccl1 libhipblaslt1 libhipfft0 libmiopen1
          librocblas5 libamd-smi27 libdrm-amdgpu1 libnuma1 python3 python3-venv python3-dev
          binutils gcc libc6-dev cmake ninja-build g++ libdrm-dev libgtest-dev clang-22 lld-22
          libamdhip64-dev git"
ALL_STAGES="root packages rocjitsu shims venv package run"
mkdir -p "$DIR/stamps" "$DIR/logs"

log() { printf '[rocm-sim %s] %s\n' "$(date +%T)" "$*"; }
in_root() { chroot "$ROOT" env -i HOME=/root PATH=/opt/venv/bin:/usr/bin:/bin "$@"; }

mount_root() {
  for d in proc sys dev dev/pts; do
    mountpoint -q "$ROOT/$d" || mount --bind "/$d" "$ROOT/$d"
  done
  cp /etc/resolv.conf "$ROOT/etc/"
}

stage_root() {  # a minimal Debian sid with experimental (ROCm 7.2 lives there)
  command -v debootstrap >/dev/null || apt-get install -y debootstrap
  debootstrap --variant=minbase --include=ca-certificates sid "$ROOT" http://deb.debian.org/debian
  printf 'deb http://deb.debian.org/debian sid main\ndeb http://deb.debian.org/debian experimental main\n' \
    > "$ROOT/etc/apt/sources.list"
  echo 'Acquire::Check-Valid-Until "false";' > "$ROOT/etc/apt/apt.conf.d/99novalid"
}

stage_packages() {  # the ROCm runtime, Python 3.14, clang-22 for rocJITsu
  mount_root
  in_root apt-get update
  # shellcheck disable=SC2086
  in_root apt-get install -y -t experimental $PACKAGES
}

stage_rocjitsu() {  # built from its public source (never vendored), or a cached build copied
  local build=$ROOT/opt/rocjitsu/build src=$ROOT/opt/rocjitsu/src
  mkdir -p "$ROOT/opt/rocjitsu"
  if [[ -n "${ROCJITSU:-}" ]]; then
    cp -a "$ROCJITSU/." "$build/"
    return
  fi
  if [[ ! -d "$src" ]]; then
    local clone=$DIR/rocjitsu-git
    [[ -d "$clone" ]] || git clone --filter=blob:none --no-checkout "$ROCJITSU_GIT" "$clone"
    git -C "$clone" archive "$ROCJITSU_REF" "$ROCJITSU_PATH" | tar -x -C "$DIR"
    mv "$DIR/$ROCJITSU_PATH" "$src"
    git clone --depth 1 --branch "$FLATBUFFERS_REF" https://github.com/google/flatbuffers.git \
      "$ROOT/opt/rocjitsu/flatbuffers"
    # clang-22 warns where rocJITsu's CI compiler did not: drop -Werror
    grep -rl -- ' -Werror' "$src/cmake" "$src/lib" --include='*.cmake' --include=CMakeLists.txt \
      | xargs -r sed -i 's/ -Werror//'
    # a flat/global access with saddr = 106 (VCC) read SGPR 106 (docs/notes.md, rocJITsu)
    patch -d "$src/lib/rocjitsu/src/rocjitsu/isa/arch/amdgpu/shared" < "$HERE/rocjitsu-vcc-saddr.patch"
  fi
  mount_root
  in_root bash -c "cd /opt/rocjitsu/src && CC=clang-22 CXX=clang++-22 cmake -S . -B /opt/rocjitsu/build \
    -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS_RELEASE='-O1 -DNDEBUG' \
    -DCMAKE_CXX_FLAGS_RELEASE='-O1 -DNDEBUG' -DBUILD_TESTING=OFF -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
    -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=/usr/src/googletest \
    -DFETCHCONTENT_SOURCE_DIR_FLATBUFFERS=/opt/rocjitsu/flatbuffers \
    -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld-22 -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld-22 \
    && cmake --build /opt/rocjitsu/build -j$(nproc)"
}

stage_shims() {  # the five names the plugin links that Debian's ROCm spells otherwise
  mount_root
  mkdir -p "$ROOT/opt/shims/src" "$ROOT/opt/shims/lib"
  cp "$HERE"/shims/* "$ROOT/opt/shims/src/"
  in_root bash -ec 'cd /opt/shims/src; L=/opt/shims/lib
    python3 gen.py drm librocm_sysdeps_drm.so.2 libdrm.so.2 < drm.txt
    python3 gen.py drm_amdgpu librocm_sysdeps_drm_amdgpu.so.1 libdrm_amdgpu.so.1 < drm_amdgpu.txt
    python3 gen.py numa librocm_sysdeps_numa.so.1 libnuma.so.1 < numa.txt
    python3 gen.py amdsmi libamd_smi.so.26 libamd_smi.so.27 < amdsmi.txt
    for s in drm:librocm_sysdeps_drm.so.2 drm_amdgpu:librocm_sysdeps_drm_amdgpu.so.1 \
             numa:librocm_sysdeps_numa.so.1 amdsmi:libamd_smi.so.26; do
      gcc -O2 -shared -fPIC -o $L/${s#*:} ${s%%:*}.c -Wl,--version-script=${s%%:*}.map \
        -Wl,-soname,${s#*:} -ldl
    done
    gcc -O2 -shared -fPIC -o $L/librocprofiler-sdk.so.1 rocprof_stub.c -Wl,-soname,librocprofiler-sdk.so.1'
}

stage_venv() {  # the real ROCm JAX plugin, from PyPI wheels for the chroot's Python
  local w=$ROOT/opt/wheels plat="--platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
  mkdir -p "$w"
  # shellcheck disable=SC2086
  python3 -m pip download -q --only-binary=:all: --python-version $PY $plat -d "$w" $WHEELS
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version $PY $plat -d "$w" \
    $NODEPS_WHEELS
  mount_root
  in_root python3 -m venv /opt/venv
  # shellcheck disable=SC2086
  in_root /opt/venv/bin/pip install -q --no-index --find-links /opt/wheels $WHEELS $NODEPS_WHEELS
}

stage_package() {  # this checkout's HEAD, built into a wheel in the chroot (always redone)
  mount_root
  rm -rf "$ROOT/opt/jax_mxfp4" && mkdir -p "$ROOT/opt/jax_mxfp4"
  git -C "$REPO" archive HEAD | tar -x -C "$ROOT/opt/jax_mxfp4"
  cp -a "$HERE/checks" "$ROOT/opt/jax_mxfp4/"
  in_root bash -ec 'cd /opt/jax_mxfp4; rm -rf /opt/dist
    pip wheel -q --no-index --find-links /opt/wheels --no-build-isolation --no-deps -w /opt/dist .
    pip install -q --no-index --no-deps --force-reinstall /opt/dist/jax_mxfp4-*.whl'
  rm -f "$DIR/stamps/run"
}

sim() {  # sim NAME SCRIPT ARGS...: python under the simulated MI350X, its log in logs/NAME
  local name=$1; shift
  log "simulated gfx950: $* (log: $DIR/logs/$name.log)"
  in_root env JAX_MXFP4_CACHE_DIR=/opt/kernel_cache LD_LIBRARY_PATH=/opt/shims/lib \
    XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform \
    XLA_FLAGS=--xla_gpu_autotune_level=0 PYTHONUNBUFFERED=1 \
    /opt/rocjitsu/build/tools/rocjitsu/rocjitsu \
    --config /opt/rocjitsu/src/configs/gfx950_cdna4_kmd.json -- /opt/venv/bin/python "$@" \
    > "$DIR/logs/$name.log" 2>&1
}

cpu() {  # cpu NAME SCRIPT ARGS...: the same script on the CPU backend, in the chroot
  local name=$1; shift
  in_root env JAX_PLATFORMS=cpu PYTHONUNBUFFERED=1 /opt/venv/bin/python "$@" \
    > "$DIR/logs/$name.log" 2>&1
}

stage_run() {  # the checks: simulated gfx950 against the CPU backend, bits compared
  mount_root
  local c=/opt/jax_mxfp4/checks out=/opt/results
  mkdir -p "$ROOT$out"
  sim platform python -c "import jax; d = jax.devices()[0]; print(d.platform, d.device_kind); \
    assert d.device_kind.startswith('AMD Instinct MI3'), d"
  cpu use_cpu $c/use_example.py $out/use_cpu.npz
  sim use_sim $c/use_example.py $out/use_sim.npz
  in_root python $c/compare.py $out/use_sim.npz $out/use_cpu.npz | tee "$DIR/logs/use_compare.log"
  local layer="--layers 1 --hidden 128 --prompt-len 200 --decode-steps 2"
  cpu layer_cpu /opt/jax_mxfp4/examples/minimax_m3_layer.py $layer --save $out/layer_cpu.npz
  sim layer_sim /opt/jax_mxfp4/examples/minimax_m3_layer.py $layer --save $out/layer_sim.npz
  in_root python $c/compare.py $out/layer_sim.npz $out/layer_cpu.npz | tee "$DIR/logs/layer_compare.log"
  sim gpu_tests -m pytest -q -p no:cacheprovider /opt/jax_mxfp4/tests/gpu -x
  ! grep -q "bit-equal=False" "$DIR/logs/use_compare.log"
}

for stage in ${STAGES:-$ALL_STAGES}; do
  if [[ -e "$DIR/stamps/$stage" && $stage != package ]]; then
    log "$stage: cached"
    continue
  fi
  log "$stage ..."
  "stage_$stage"
  touch "$DIR/stamps/$stage"
done
log "done: logs in $DIR/logs"
