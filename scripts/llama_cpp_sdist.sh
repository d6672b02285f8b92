# Sourced by scripts/setup.sh and scripts/build_llama_server.sh: the llama-cpp-python source
# distribution both build from (its vendored llama.cpp), downloaded once into .cache/downloads/.
#   llama_sdist ROOT SPEC PY   -> prints the sdist's path (progress on stderr)
llama_sdist() {
  local root="$1" spec="$2" py="$3" version="${2#*==}" found tmp
  found="$(ls "$root"/.cache/downloads/llama[-_]cpp[-_]python-"$version".tar.gz 2>/dev/null | head -1)"
  if [ -z "$found" ]; then
    echo "[llama.cpp] downloading the $spec source distribution (76 MB; the first time only)" >&2
    tmp="$root/.cache/downloads/.llama-sdist.part.$$"
    rm -rf "$tmp" && mkdir -p "$tmp"
    "$py" -m pip download -q --no-deps --no-binary :all: --disable-pip-version-check -d "$tmp" "$spec" >&2
    mv "$tmp"/*.tar.gz "$root/.cache/downloads/" && rm -rf "$tmp"
    found="$(ls "$root"/.cache/downloads/llama[-_]cpp[-_]python-"$version".tar.gz | head -1)"
  fi
  echo "$found"
}
