# CMake toolchain for big-endian MIPS64 (n64). Debian has no mips64 port, so there is no
# library sysroot: this build covers the unwinding libraries and their tests only
# (STRATA_WITH_GRPC=OFF). GoogleTest is cross-built from /usr/src/googletest by build.sh
# into <build>/deps (STRATA_MIPS64_DEPS). Abseil has no big-endian build either: the top-level
# find_package(absl) is satisfied with the mips64el sysroot's CMake package (headers are
# architecture-neutral), so only targets that do not link Abseil libraries build here.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR mips64)
set(STRATA_CROSS_TRIPLE mips64-linux-gnuabi64)

foreach(v STRATA_MIPS64_DEPS STRATA_MIPS64EL_SYSROOT)
  if(NOT ${v} AND DEFINED ENV{${v}})
    set(${v} "$ENV{${v}}")
  endif()
endforeach()
if(NOT STRATA_MIPS64_DEPS)
  set(STRATA_MIPS64_DEPS "${CMAKE_BINARY_DIR}/deps")
endif()
set(STRATA_MIPS64_DEPS "${STRATA_MIPS64_DEPS}" CACHE PATH "cross-built GoogleTest prefix")
set(STRATA_MIPS64EL_SYSROOT "${STRATA_MIPS64EL_SYSROOT}" CACHE PATH "mips64el sysroot (Abseil CMake package only)")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES STRATA_MIPS64_DEPS STRATA_MIPS64EL_SYSROOT)

set(CMAKE_C_COMPILER ${STRATA_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${STRATA_CROSS_TRIPLE}-g++)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-mips64)

set(CMAKE_FIND_ROOT_PATH "${STRATA_MIPS64_DEPS}" "${STRATA_MIPS64EL_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(GTest_DIR "${STRATA_MIPS64_DEPS}/lib/cmake/GTest" CACHE PATH "")
if(STRATA_MIPS64EL_SYSROOT)
  set(absl_DIR "${STRATA_MIPS64EL_SYSROOT}/usr/lib/mips64el-linux-gnuabi64/cmake/absl" CACHE PATH "")
endif()

set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")
set(STRATA_WITH_GRPC OFF CACHE BOOL "" FORCE)
set(STRATA_BUILD_BENCHMARKS OFF CACHE BOOL "" FORCE)
set(STRATA_CROSS_ARCH mips64 CACHE STRING "cross target")
# Debian has no big-endian Abseil: only the MIPS64 unwinding tests (no Abseil) run here.
set(STRATA_TEST_DIRS_REGEX "/tests/mips64|/common/unwind/mips64" CACHE STRING "" FORCE)
