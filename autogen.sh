#!/bin/sh
# autogen.sh: generate configure and Makefile.in from configure.ac and Makefile.am.
set -e
cd "$(dirname "$0")"
mkdir -p config/aux
autoreconf --install --force --warnings=all,no-portability
