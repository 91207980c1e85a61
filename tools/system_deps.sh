#!/usr/bin/env sh
# The one thing the test suite needs from outside PyPI: FFmpeg's shared libraries, which torchcodec
# (an optional decoder, tested like the others) loads at import. Installed with apt-get where FFmpeg
# is missing (as root, or through sudo); elsewhere, says what to install. Run by the README's test
# command and so by .ci/run.
set -eu
if command -v ffmpeg >/dev/null 2>&1; then
    exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
    as_root=""
    if [ "$(id -u)" != 0 ]; then
        as_root="sudo"
    fi
    echo "tools/system_deps.sh: installing FFmpeg (apt-get install ffmpeg) for torchcodec's tests" >&2
    $as_root apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq --no-install-recommends ffmpeg >/dev/null
    exit 0
fi
echo "tools/system_deps.sh: the tests need FFmpeg 4-7 and its shared libraries (torchcodec loads them):" \
    "install it with your system's package manager (brew install ffmpeg, dnf install ffmpeg ...)" >&2
exit 1
