#!/bin/sh
# Builds the debug-file test fixtures: testdata_debug_fixture.c as a shared object, shipped the
# ways distributions ship symbols (see debug_file.h).
#   make_debug_fixtures.sh CC OBJCOPY STRIP NM XZ SOURCE OUT_DIR
# Writes to OUT_DIR:
#   full.so            unstripped, with a GNU build ID: the symbols the tests expect
#   stripped.so        full.so without .symtab (strip --strip-all), as Debian ships libraries
#   stripped.debug     objcopy --only-keep-debug of full.so (what -dbgsym installs by build ID)
#   nobid_full.so      built without a build ID (-Wl,--build-id=none), unstripped
#   nobid.so           nobid_full.so stripped, with a .gnu_debuglink to "nobid.so.debug"
#   nobid.so.debug     objcopy --only-keep-debug of nobid_full.so
#   mini.so            stripped.so with MiniDebugInfo, made as Fedora's find-debuginfo does:
#                      the debug file's function symbols not in .dynsym, everything else
#                      stripped, xz-compressed into .gnu_debugdata
#   stamp
set -eu
cc=$1 objcopy=$2 strip=$3 nm=$4 xz=$5 src=$6 out=$7
export LC_ALL=C
mkdir -p "$out"
cd "$out"
flags="-O1 -g -fPIC -shared -nostdlib"

$cc $flags -Wl,--build-id=sha1 -o full.so "$src"
$objcopy --only-keep-debug full.so stripped.debug
$strip --strip-all -o stripped.so full.so

$cc $flags -Wl,--build-id=none -o nobid_full.so "$src"
$objcopy --only-keep-debug nobid_full.so nobid.so.debug
$strip --strip-all -o nobid.so nobid_full.so
$objcopy --add-gnu-debuglink=nobid.so.debug nobid.so

# MiniDebugInfo (Fedora's find-debuginfo.sh, add_minidebug).
$nm -D stripped.so --format=posix --defined-only | awk '{ print $1 }' | sort > mini.dynsyms
$nm stripped.debug --format=sysv --defined-only |
  awk -F '|' '{ if ($4 ~ "FUNC") print $1 }' | sed 's/ *$//' | sort > mini.funcsyms
comm -13 mini.dynsyms mini.funcsyms > mini.keep
$objcopy -S --remove-section .gdb_index --remove-section .comment --keep-symbols=mini.keep \
  stripped.debug mini.debug
rm -f mini.debug.xz
$xz -k mini.debug
cp stripped.so mini.so
$objcopy --add-section .gnu_debugdata=mini.debug.xz mini.so
touch stamp
