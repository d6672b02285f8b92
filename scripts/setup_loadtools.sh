#!/usr/bin/env bash
# setup_loadtools.sh — make NVIDIA's real load-testing clients runnable here:
#   * perf_analyzer 2.60.0  (C++ binary from the `perf-analyzer` PyPI wheel)
#   * genai-perf   0.0.16   (pure Python, in its own venv)
#
# Everything lands under "$REPO/.cache/loadtools" (git-ignored via .cache/):
#   bin/perf_analyzer        wrapper: runs the binary through a Debian 13 loader
#   bin/genai-perf           wrapper: puts bin/ on PATH, execs the venv's genai-perf
#   dist/                    downloaded wheel + .debs (cache; never re-downloaded)
#   perf-analyzer-2.60.0/    unpacked wheel
#   sysroot-trixie/          libc6/libstdc++6/... from Debian 13 unpacked with dpkg -x
#   genai-perf-venv/         venv with genai-perf and exact-pinned dependencies
#   apt/                     private apt state (lists, cache, sources) — the system
#                            apt state (/var/lib/apt, /var/cache/apt) is never touched
#
# Idempotent: each step writes a stamp file when done and is skipped next time,
# so a second run makes no network access and finishes in about a second.
# Re-run with LOADTOOLS_FORCE=1 to rebuild everything from scratch.
#
# Why the loader trick: the perf-analyzer 2.60.0 wheel is manylinux_2_38 (needs
# glibc 2.38 and GLIBCXX_3.4.32) while this machine is Debian 12 (glibc 2.36,
# GCC 12 libstdc++). We do NOT upgrade the system: the wrapper starts the binary
# through Debian 13's own dynamic loader, `ld-linux-x86-64.so.2 --library-path
# SYSROOT/usr/lib/x86_64-linux-gnu`, so only that one process sees the newer libs.
#
# Gotchas (all handled below, listed for whoever touches this later):
#   * Debian 13's libc6 puts the real loader at usr/lib/x86_64-linux-gnu/
#     ld-linux-x86-64.so.2 (usr/lib64/ld-linux-x86-64.so.2 is a relative symlink
#     to it); there is no top-level lib64/ in the .deb (no merged-/usr symlinks).
#   * libssl3t64 3.5 in Debian 13 needs libzstd1 >= 1.5.5 (Debian 12 has 1.5.4),
#     so libzstd1 is taken from Debian 13 as well.
#   * `--library-path` replaces LD_LIBRARY_PATH for that process, so a caller's
#     LD_LIBRARY_PATH (e.g. the pytriton libs for tritonserver) cannot leak Debian
#     12 / bundled libs into perf_analyzer. LD_PRELOAD is dropped for the same
#     reason. `--inhibit-cache` keeps the system /etc/ld.so.cache out of it.
#   * GCONV_PATH points at Debian 13's gconv modules (the trixie libc must not
#     dlopen Debian 12's). OpenSSL still reads the system /usr/lib/ssl/openssl.cnf
#     (fine for perf_analyzer's plain-HTTP/gRPC use; TLS untested).
#   * The wheel is unpacked with Python's zipfile, which drops the exec bit:
#     the wrapper runs the binary through the loader, so that does not matter,
#     but it is chmod'ed +x anyway.
#   * genai-perf depends on a PyPI *placeholder* named `perf_analyzer==0.1.0`
#     (it only provides a Python module, no binary); the real binary is found via
#     PATH, which is why bin/genai-perf puts "$LT/bin" first on PATH.
#   * perf_analyzer 2.60 has no --help/-h option (exit 99, "Invalid long
#     option"); it prints its usage on stderr when run without arguments. The
#     wrapper maps a lone --help/-h to that usage (stdout, exit 0).
#   * genai-perf needs numpy < 2 (pinned 1.26.4 below).
#   * genai-perf writes its artifacts under ./artifacts of the current directory
#     (use --artifact-dir), and needs --tokenizer pointing at a local HF dir here
#     (no hub access on these machines). Its rich tables wrap to the terminal
#     width; set COLUMNS=200 for readable logs (the CSV/JSON exports are complete).
#   * genai-perf --backend tensorrtllm only passes --shape for text_input and
#     max_tokens to perf_analyzer: the model's scalar inputs (max_tokens, stream,
#     exclude_input_in_output) must be declared with dims [ 1 ], not [ -1 ], or
#     perf_analyzer exits 99 ("variable-sized tensor ... needs to have its shape
#     fully defined").
#
# Verified (2026-11) against Triton 2.51 from nvidia-pytriton==0.7.0 on CPU,
# loopback only: `bin/perf_analyzer -m M -u 127.0.0.1:GRPC -i grpc
# --concurrency-range 1:2 --measurement-interval 2000` and
# `bin/genai-perf profile -m M --endpoint-type kserve --backend tensorrtllm
# -u 127.0.0.1:GRPC --streaming --tokenizer LOCAL_HF_DIR --concurrency 2
# --request-count 20 --artifact-dir DIR` against a decoupled Python-backend model.
# (For tritonserver's Python backend: venv bin first on PATH and the Python's
# lib dir on LD_LIBRARY_PATH, see docs/environment.md; that LD_LIBRARY_PATH does not
# affect this perf_analyzer wrapper.)
#   * The Debian 13 .deb versions are pinned; if a Debian point release removed a
#     pinned version from the mirror, the script falls back to the suite's
#     current version with a loud warning (same ABI within a stable release).
#   * Signatures: the private sources list uses Signed-By the system's
#     /usr/share/keyrings/debian-archive-keyring.gpg, which on Debian 12
#     (debian-archive-keyring 2023.3+deb12u2) already carries the Debian 13
#     archive keys; apt verifies InRelease and each .deb's SHA256 against it.
#     The script aborts if that key is missing (no unverified fallback).
#   * No registry host name is written anywhere: the Debian mirror URI is read at
#     run time from /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list
#     (override with LOADTOOLS_DEBIAN_MIRROR), and pip uses its own configuration.
set -euo pipefail

# ----------------------------------------------------------------- pinned versions
PERF_ANALYZER_VERSION=2.60.0
PERF_ANALYZER_PLATFORM=manylinux_2_38_x86_64
GENAI_PERF_VERSION=0.0.16
DEBIAN_SUITE=trixie            # Debian 13
# Debian 13 packages (name=version) unpacked into the private sysroot.
TRIXIE_DEBS=(
  "libc6=2.41-12+deb13u4"
  "libstdc++6=14.2.0-19"
  "libgcc-s1=14.2.0-19"
  "zlib1g=1:1.3.dfsg+really1.3.1-1+b1"
  "libssl3t64=3.5.7-1~deb13u2"
  "libzstd1=1.5.7+dfsg-1"
)
# genai-perf venv: the complete, exact dependency set (resolved once with
# `pip install genai-perf==0.0.16 'numpy<2'` on Python 3.11 and frozen).
GENAI_PERF_REQUIREMENTS="$(cat <<'EOF'
genai-perf==0.0.16
numpy==1.26.4
alembic==1.20.1
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
certifi==2026.10.18
cffi==2.1.1
charset-normalizer==3.5.2
choreographer==1.4.0
click==8.5.1
colorlog==6.12.0
cramjam==2.14.0
fastparquet==2026.9.0
filelock==4.2.11
formulaic==1.2.2
fsspec==2026.9.0
h11==0.16.0
hf-xet==1.8.0
httpcore2==2.16.2
httpx2==2.16.2
huggingface_hub==2.4.0
idna==3.20
iniconfig==2.3.1
interface_meta==2.0.1
Jinja2==3.1.6
kaleido==1.5.0
logistro==2.0.1
Mako==1.4.3
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mdurl==0.1.2
narwhals==2.29.0
optuna==3.6.1
orjson==3.13.0
packaging==26.3
pandas==3.0.6
patsy==1.0.3
perf_analyzer==0.1.0
pillow==13.0.0
platformdirs==4.14.7
plotly==7.1.0
pluggy==1.7.0
pyarrow==26.0.1
pycparser==3.12
pydantic==2.14.3
pydantic_core==2.50.4
Pygments==2.21.0
pytest==9.2.0
pytest-mock==3.17.0
python-dateutil==4.0.0
PyYAML==6.0.3
regex==2026.11.15
requests==2.34.2
responses==0.26.3
rich==15.0.0
safetensors==0.8.0
scipy==1.17.1
shellingham==1.5.4
simplejson==4.3.0
soundfile==0.14.0
SQLAlchemy==2.1.9
statsmodels==0.15.0
tokenizers==0.23.3
tqdm==4.70.1
transformers==5.23.0
truststore==0.10.5
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
tzdata==2026.6
urllib3==2.8.0
wrapt==2.5.2
EOF
)"

# ----------------------------------------------------------------- paths
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The physical path: the wrappers and the venv's scripts name it, and a .cache shared by symlink
# (another checkout's) must not get paths that die with that checkout.
mkdir -p "$REPO/.cache"
LT="$(cd "$REPO/.cache" && pwd -P)/loadtools"
DIST="$LT/dist"
APTDIR="$LT/apt"
SYSROOT="$LT/sysroot-trixie"
PA_DIR="$LT/perf-analyzer-$PERF_ANALYZER_VERSION"
VENV="$LT/genai-perf-venv"
BIN="$LT/bin"
STAMPS="$LT/stamps"
PYTHON="${PYTHON:-python3}"

log() { printf '[setup_loadtools] %s\n' "$*"; }
die() { printf '[setup_loadtools] ERROR: %s\n' "$*" >&2; exit 1; }

# A stamp records what was built (versions); a changed pin invalidates it.
stamp_ok() { [[ -f "$STAMPS/$1" && "$(cat "$STAMPS/$1")" == "$2" ]]; }
stamp_set() { mkdir -p "$STAMPS"; printf '%s' "$2" >"$STAMPS/$1"; }

if [[ "${LOADTOOLS_FORCE:-0}" == 1 ]]; then
  log "LOADTOOLS_FORCE=1: removing $LT"
  rm -rf "$LT"
fi
mkdir -p "$DIST" "$BIN" "$STAMPS"

[[ "$(uname -m)" == x86_64 ]] || die "only x86-64 is supported (got $(uname -m))"
for tool in apt-get dpkg "$PYTHON"; do
  command -v "$tool" >/dev/null || die "required tool not found: $tool"
done

# ----------------------------------------------------------------- 1. perf_analyzer wheel
PA_WHEEL="$DIST/perf_analyzer-$PERF_ANALYZER_VERSION-py3-none-$PERF_ANALYZER_PLATFORM.whl"
if stamp_ok perf-analyzer "$PERF_ANALYZER_VERSION"; then
  log "perf-analyzer $PERF_ANALYZER_VERSION: cached ($PA_DIR)"
else
  if [[ ! -f "$PA_WHEEL" ]]; then
    log "downloading perf-analyzer==$PERF_ANALYZER_VERSION ($PERF_ANALYZER_PLATFORM wheel)"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
      --platform "$PERF_ANALYZER_PLATFORM" \
      -d "$DIST" "perf-analyzer==$PERF_ANALYZER_VERSION"
  fi
  [[ -f "$PA_WHEEL" ]] || die "expected wheel not found: $PA_WHEEL"
  log "unpacking $(basename "$PA_WHEEL")"
  rm -rf "$PA_DIR" "$PA_DIR.tmp"
  "$PYTHON" -m zipfile -e "$PA_WHEEL" "$PA_DIR.tmp"
  chmod +x "$PA_DIR.tmp/perf_analyzer/bin/perf_analyzer"
  mv "$PA_DIR.tmp" "$PA_DIR"
  stamp_set perf-analyzer "$PERF_ANALYZER_VERSION"
fi
PA_BIN="$PA_DIR/perf_analyzer/bin/perf_analyzer"
[[ -f "$PA_BIN" ]] || die "perf_analyzer binary missing: $PA_BIN (re-run with LOADTOOLS_FORCE=1)"

# ----------------------------------------------------------------- 2. Debian 13 sysroot
# The mirror URI configured for this machine's Debian 12 suite, read at run time.
debian_mirror() {
  if [[ -n "${LOADTOOLS_DEBIAN_MIRROR:-}" ]]; then
    printf '%s\n' "$LOADTOOLS_DEBIAN_MIRROR"; return
  fi
  local f uri
  # deb822 files: first URIs: of a stanza whose Suites are not *-security.
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    uri="$(awk '
      function flush() { if (uri != "" && suites !~ /-security/ && types ~ /(^| )deb( |$)/) { print uri; found=1; exit } uri=""; suites=""; types="" }
      /^[[:space:]]*$/ { flush(); next }
      /^[[:space:]]*#/ { next }
      tolower($1) == "types:"  { types=$0; sub(/^[^:]*:[[:space:]]*/, "", types) }
      tolower($1) == "uris:"   { uri=$2 }
      tolower($1) == "suites:" { suites=$0 }
      END { if (!found) flush() }' "$f")"
    [[ -n "$uri" ]] && { printf '%s\n' "$uri"; return; }
  done
  # one-line format: deb [options] URI suite components
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    uri="$(awk '
      $1 == "deb" {
        i = 2
        if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
        if ($(i+1) !~ /-security/) { print $i; exit }
      }' "$f")"
    [[ -n "$uri" ]] && { printf '%s\n' "$uri"; return; }
  done
  return 1
}

KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
# Fail early (with a clear message) if the system keyring cannot verify the suite.
# apt enforces this anyway (signed-by + no --allow-unauthenticated); this only
# gives a readable error. A throw-away GNUPGHOME keeps ~/.gnupg untouched.
check_keyring() {
  [[ -r "$KEYRING" ]] || die "$KEYRING missing (install debian-archive-keyring)"
  command -v gpg >/dev/null || return 0
  local gh uids; gh="$(mktemp -d)"
  uids="$(GNUPGHOME="$gh" gpg --batch --show-keys "$KEYRING" 2>/dev/null || true)"
  rm -rf "$gh"
  # uids look like: Debian Archive Automatic Signing Key (13/trixie) <...>
  if ! grep -q "Debian Archive Automatic Signing Key ([0-9]*/$DEBIAN_SUITE)" <<<"$uids"; then
    die "$KEYRING has no Debian $DEBIAN_SUITE archive key; update debian-archive-keyring (refusing to use unverified packages)"
  fi
}

# Private apt configuration: own sources, lists, cache, status and preferences.
# The system's apt.conf.d is still read (proxy/auth settings apply to us too).
APT_OPTS=(
  -o "Dir::Etc::SourceList=$APTDIR/sources.list"
  -o "Dir::Etc::SourceParts=$APTDIR/sources.list.d"
  -o "Dir::Etc::Preferences=$APTDIR/preferences"
  -o "Dir::Etc::PreferencesParts=$APTDIR/preferences.d"
  -o "Dir::State=$APTDIR/state"
  -o "Dir::State::Lists=$APTDIR/lists"
  -o "Dir::State::status=$APTDIR/state/status"
  -o "Dir::Cache=$APTDIR/cache"
  -o "Dir::Cache::Archives=$APTDIR/cache/archives"
  -o "Dir::Log=$APTDIR/log"
  -o "APT::Architecture=amd64"
  -o "APT::Architectures::=amd64"
  -o "Acquire::Languages=none"
)
# As root, apt drops to the _apt user to download; our private dirs under the
# repo may not be reachable for it, so download as the invoking user instead.
if [[ "$(id -u)" == 0 ]]; then APT_OPTS+=(-o "APT::Sandbox::User=root"); fi

SYSROOT_KEY="$DEBIAN_SUITE ${TRIXIE_DEBS[*]}"
if stamp_ok sysroot "$SYSROOT_KEY"; then
  log "Debian $DEBIAN_SUITE sysroot: cached ($SYSROOT)"
else
  DEB_DIR="$DIST/debs-$DEBIAN_SUITE"
  mkdir -p "$DEB_DIR"
  # Only talk to the mirror if some pinned .deb is not in the cache yet.
  # resolved_deb NAME PINNED-VERSION: path of the cached .deb for the pin, or for
  # the fallback version recorded in resolved.txt; empty if neither is there.
  resolved_deb() {
    local name="$1" ver="$2" deb
    # .deb file names carry the version with ':' escaped as %3a
    deb="$DEB_DIR/${name}_${ver//:/%3a}_amd64.deb"
    if [[ ! -f "$deb" ]]; then
      ver="$(awk -F= -v n="$name" '$1 == n {v=substr($0, length(n) + 2)} END {print v}' "$DEB_DIR/resolved.txt" 2>/dev/null || true)"
      deb="$DEB_DIR/${name}_${ver//:/%3a}_amd64.deb"
    fi
    [[ -n "$ver" && -f "$deb" ]] && printf '%s\n' "$deb"
    return 0
  }
  missing=()
  for spec in "${TRIXIE_DEBS[@]}"; do
    [[ -n "$(resolved_deb "${spec%%=*}" "${spec#*=}")" ]] || missing+=("$spec")
  done
  if ((${#missing[@]})); then
    check_keyring
    MIRROR="$(debian_mirror)" || die "could not find a Debian mirror URI in /etc/apt/sources.list{,.d}; set LOADTOOLS_DEBIAN_MIRROR"
    log "Debian mirror (from apt config): $MIRROR"
    mkdir -p "$APTDIR"/{sources.list.d,preferences.d,state,lists/partial,cache/archives/partial,log}
    : >"$APTDIR/state/status"
    printf 'deb [signed-by=%s] %s %s main\n' "$KEYRING" "$MIRROR" "$DEBIAN_SUITE" >"$APTDIR/sources.list"
    log "apt-get update (private state in $APTDIR, suite $DEBIAN_SUITE)"
    # apt exits 0 on some fetch failures; treat any W:/E: about signatures as fatal.
    apt-get "${APT_OPTS[@]}" -q update >"$APTDIR/update.log" 2>&1 \
      || { cat "$APTDIR/update.log" >&2; die "apt-get update failed"; }
    if grep -Eq 'NO_PUBKEY|not signed|signature|InRelease.*(not|fail)' "$APTDIR/update.log"; then
      cat "$APTDIR/update.log" >&2; die "signature verification problem for $DEBIAN_SUITE"
    fi
    want=()
    for spec in "${missing[@]}"; do
      name="${spec%%=*}"; ver="${spec#*=}"
      if apt-cache "${APT_OPTS[@]}" madison "$name" | awk -F'|' '{gsub(/ /,"",$2); print $2}' | grep -qxF "$ver"; then
        want+=("$spec")
      else
        cand="$(apt-cache "${APT_OPTS[@]}" policy "$name" | awk '/Candidate:/{print $2}')"
        [[ -n "$cand" && "$cand" != "(none)" ]] || die "$name not found in $DEBIAN_SUITE"
        log "WARNING: pinned $name=$ver is no longer on the mirror; using $DEBIAN_SUITE's $name=$cand"
        want+=("$name=$cand")
      fi
    done
    log "apt-get download ${want[*]}"
    # apt-get download checks each .deb against the SHA256 in the signed index.
    (cd "$DEB_DIR" && apt-get "${APT_OPTS[@]}" -q download "${want[@]}")
    # record which versions were really taken (pins, or fallbacks)
    for spec in "${want[@]}"; do
      sed -i "/^${spec%%=*}=/d" "$DEB_DIR/resolved.txt" 2>/dev/null || true
      printf '%s\n' "$spec" >>"$DEB_DIR/resolved.txt"
    done
  else
    log "Debian $DEBIAN_SUITE .debs: cached ($DEB_DIR)"
  fi
  log "unpacking .debs into $SYSROOT (dpkg -x, no system changes)"
  rm -rf "$SYSROOT" "$SYSROOT.tmp"
  mkdir -p "$SYSROOT.tmp"
  for spec in "${TRIXIE_DEBS[@]}"; do
    name="${spec%%=*}"
    deb="$(resolved_deb "$name" "${spec#*=}")"
    [[ -n "$deb" ]] || die "no .deb for $name in $DEB_DIR"
    dpkg -x "$deb" "$SYSROOT.tmp"
  done
  mv "$SYSROOT.tmp" "$SYSROOT"
  stamp_set sysroot "$SYSROOT_KEY"
fi
LOADER="$SYSROOT/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
[[ -x "$LOADER" ]] || die "loader not found at $LOADER (re-run with LOADTOOLS_FORCE=1)"

# ----------------------------------------------------------------- 3. perf_analyzer wrapper
LIBPATH="$SYSROOT/usr/lib/x86_64-linux-gnu"
# If a future wheel bundles its own libs (auditwheel's *.libs dir), use them first.
for d in "$PA_DIR"/perf_analyzer.libs "$PA_DIR"/perf_analyzer/lib; do
  [[ -d "$d" ]] && LIBPATH="$d:$LIBPATH"
done
log "writing $BIN/perf_analyzer"
cat >"$BIN/perf_analyzer.tmp" <<EOF
#!/usr/bin/env bash
# Generated by scripts/setup_loadtools.sh — perf_analyzer $PERF_ANALYZER_VERSION run
# through Debian $DEBIAN_SUITE's loader and libs (the system glibc is too old).
# --library-path replaces LD_LIBRARY_PATH; --inhibit-cache skips /etc/ld.so.cache.
set -euo pipefail
unset LD_PRELOAD
export GCONV_PATH="$SYSROOT/usr/lib/x86_64-linux-gnu/gconv"
run() {
  exec "$LOADER" --inhibit-cache --library-path "$LIBPATH" \\
    --argv0 perf_analyzer "$PA_BIN" "\$@"
}
# perf_analyzer 2.60 has no --help/-h ("Invalid long option", exit 99); it prints
# its usage on stderr when run without arguments. Map a lone --help/-h to that,
# on stdout, exit 0 (the trailing "Failed to parse -m" error line is dropped).
if [[ \$# -eq 1 && ( "\$1" == --help || "\$1" == -h ) ]]; then
  ( run ) 2>&1 | grep -v '^Error: Failed to parse -m' || true
  exit 0
fi
run "\$@"
EOF
chmod +x "$BIN/perf_analyzer.tmp"
mv "$BIN/perf_analyzer.tmp" "$BIN/perf_analyzer"
# Smoke test: the binary must load through the trixie loader and print its usage.
"$BIN/perf_analyzer" --help 2>&1 | grep -q '^Usage: perf_analyzer' \
  || die "perf_analyzer wrapper does not run: try $BIN/perf_analyzer --help"

# ----------------------------------------------------------------- 4. genai-perf venv
REQ_HASH="$(printf '%s' "$GENAI_PERF_REQUIREMENTS" | sha256sum | cut -c1-16)"
# (a venv names its own path in its scripts: one made elsewhere, then moved, does not run)
if stamp_ok genai-perf "$REQ_HASH" && [[ -x "$VENV/bin/genai-perf" ]] \
    && [[ "$(head -1 "$VENV/bin/genai-perf")" == "#!$VENV/bin/python"* ]]; then
  log "genai-perf $GENAI_PERF_VERSION venv: cached ($VENV)"
else
  "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || die "genai-perf needs Python >= 3.10 (set PYTHON=...)"
  log "creating venv $VENV ($("$PYTHON" --version 2>&1))"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  printf '%s\n' "$GENAI_PERF_REQUIREMENTS" >"$LT/genai-perf-requirements.txt"
  log "pip install genai-perf==$GENAI_PERF_VERSION with $(wc -l <"$LT/genai-perf-requirements.txt") pinned packages (about 1 min)"
  # --no-deps: the list above is the complete frozen set, so nothing floats.
  "$VENV/bin/pip" install --quiet --no-deps -r "$LT/genai-perf-requirements.txt"
  "$VENV/bin/pip" check >/dev/null || { "$VENV/bin/pip" check >&2 || true; die "genai-perf venv has inconsistent dependencies"; }
  stamp_set genai-perf "$REQ_HASH"
fi

log "writing $BIN/genai-perf"
cat >"$BIN/genai-perf.tmp" <<EOF
#!/usr/bin/env bash
# Generated by scripts/setup_loadtools.sh — genai-perf $GENAI_PERF_VERSION from its own venv,
# with the perf_analyzer wrapper first on PATH (genai-perf runs \`perf_analyzer\`).
set -euo pipefail
export PATH="$BIN:\$PATH"
exec "$VENV/bin/genai-perf" "\$@"
EOF
chmod +x "$BIN/genai-perf.tmp"
mv "$BIN/genai-perf.tmp" "$BIN/genai-perf"
"$BIN/genai-perf" --help >/dev/null 2>&1 || die "genai-perf wrapper does not run: try $BIN/genai-perf --help"

log "done."
log "  perf_analyzer $PERF_ANALYZER_VERSION: $BIN/perf_analyzer"
log "  genai-perf    $GENAI_PERF_VERSION: $BIN/genai-perf"
