# CMake toolchain for little-endian MIPS64 (n64, Debian mips64el) with a sysroot made by
# make-sysroot.sh. Everything is linked statically: a dynamically linked gRPC binary hangs in
# ld.so under qemu-mips64el, the static one runs (see shared notes on the cross build).
#
# Inputs (cache or environment): STRATA_MIPS64EL_SYSROOT (default <build>/sysroot).
# Code generators (protoc, grpc_cpp_plugin) are the host's.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR mips64)
set(STRATA_CROSS_TRIPLE mips64el-linux-gnuabi64)

if(NOT STRATA_MIPS64EL_SYSROOT)
  if(DEFINED ENV{STRATA_MIPS64EL_SYSROOT})
    set(STRATA_MIPS64EL_SYSROOT "$ENV{STRATA_MIPS64EL_SYSROOT}")
  else()
    set(STRATA_MIPS64EL_SYSROOT "${CMAKE_BINARY_DIR}/sysroot")
  endif()
endif()
set(STRATA_MIPS64EL_SYSROOT "${STRATA_MIPS64EL_SYSROOT}" CACHE PATH "mips64el sysroot (make-sysroot.sh)")
# Try-compile projects must see the same settings.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES STRATA_MIPS64EL_SYSROOT)
set(_sr "${STRATA_MIPS64EL_SYSROOT}")

set(CMAKE_C_COMPILER ${STRATA_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${STRATA_CROSS_TRIPLE}-g++)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-mips64el)

# The sysroot is a find root only: the compiler keeps its own libc (the sysroot has none).
set(CMAKE_FIND_ROOT_PATH "${_sr}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_LIBRARY_ARCHITECTURE ${STRATA_CROSS_TRIPLE})
# Prefer static archives wherever both exist.
set(CMAKE_FIND_LIBRARY_SUFFIXES .a .so)

set(_libdirs "${_sr}/usr/lib/${STRATA_CROSS_TRIPLE}" "${_sr}/lib/${STRATA_CROSS_TRIPLE}")
set(CMAKE_C_FLAGS_INIT "-isystem ${_sr}/usr/include")
set(CMAKE_CXX_FLAGS_INIT "-isystem ${_sr}/usr/include -DSPDLOG_HEADER_ONLY -DFMT_HEADER_ONLY")
# Multiarch headers (OpenSSL's opensslconf.h, configuration.h): not in the flags above, which
# a build directory caches from its first configuration.
set(CMAKE_C_STANDARD_INCLUDE_DIRECTORIES "${_sr}/usr/include/${STRATA_CROSS_TRIPLE}")
set(CMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES "${_sr}/usr/include/${STRATA_CROSS_TRIPLE}")
set(_ld "-static -L${_sr}/usr/lib/${STRATA_CROSS_TRIPLE} -L${_sr}/lib/${STRATA_CROSS_TRIPLE}")
string(APPEND _ld " -Wl,-rpath-link,${_sr}/usr/lib/${STRATA_CROSS_TRIPLE}")
string(APPEND _ld " -Wl,-rpath-link,${_sr}/lib/${STRATA_CROSS_TRIPLE}")
set(CMAKE_EXE_LINKER_FLAGS_INIT "${_ld}")

# pkg-config answers from the sysroot (pkg_check_modules, and `pkg-config --static`).
set(ENV{PKG_CONFIG_LIBDIR} "${_sr}/usr/lib/${STRATA_CROSS_TRIPLE}/pkgconfig:${_sr}/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${_sr}")
set(ENV{PKG_CONFIG_PATH} "")

# Debian's CMake packages name shared objects: retarget their imported libraries to the
# sysroot's static archives, spdlog/fmt header-only (static-imports.cmake).
set(CMAKE_PROJECT_TOP_LEVEL_INCLUDES "${CMAKE_CURRENT_LIST_DIR}/static-imports.cmake")

# Host code generators.
set(STRATA_PROTOC /usr/bin/protoc CACHE FILEPATH "host protoc")
set(STRATA_GRPC_CPP_PLUGIN /usr/bin/grpc_cpp_plugin CACHE FILEPATH "host grpc_cpp_plugin")
set(Protobuf_PROTOC_EXECUTABLE /usr/bin/protoc CACHE FILEPATH "host protoc")
set(STRATA_CROSS_ARCH mips64el CACHE STRING "cross target")
