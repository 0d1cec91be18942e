# Static linking against a Debian sysroot: Debian's CMake packages (absl, gRPC, c-ares, ...)
# define imported targets whose locations are the shared objects (.so.N), so a `-static` link
# fails with "attempted static link of dynamic object". This file installs a CMake dependency
# provider (included through CMAKE_PROJECT_TOP_LEVEL_INCLUDES by the mips64el toolchain file)
# that runs every find_package() as usual and then points each imported library that lives
# in the sysroot at the static archive beside it (libX.so.N -> libX.a). spdlog and fmt have
# no archives in Debian: their targets become header-only interface targets
# (SPDLOG_HEADER_ONLY, FMT_HEADER_ONLY).
#
# Inputs: STRATA_MIPS64EL_SYSROOT (the sysroot; libraries elsewhere are left alone).

# Points every imported library target of the current directory that names a shared object
# inside the sysroot at its static archive (when the archive exists).
function(strata_static_retarget_imports)
  get_property(targets DIRECTORY PROPERTY IMPORTED_TARGETS)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(NOT type MATCHES "^(SHARED|UNKNOWN|STATIC)_LIBRARY$")
      continue()
    endif()
    get_target_property(configs ${t} IMPORTED_CONFIGURATIONS)
    set(props IMPORTED_LOCATION)
    if(configs)
      foreach(c IN LISTS configs)
        string(TOUPPER "${c}" c)
        list(APPEND props IMPORTED_LOCATION_${c})
      endforeach()
    endif()
    foreach(p IN LISTS props)
      get_target_property(loc ${t} ${p})
      if(NOT loc OR NOT loc MATCHES "^(.*/lib[^/]+)\\.so(\\.[0-9.]+)?$")
        continue()
      endif()
      set(archive "${CMAKE_MATCH_1}.a")
      string(FIND "${archive}" "${STRATA_MIPS64EL_SYSROOT}/" at)
      if(NOT at EQUAL 0 OR NOT EXISTS "${archive}")
        continue()
      endif()
      # By full path: IMPORTED_NO_SONAME would make CMake link it as -lX between
      # -Wl,-Bstatic/-Bdynamic, and the trailing -Bdynamic turns the link dynamic again.
      set_target_properties(${t} PROPERTIES ${p} "${archive}")
    endforeach()
  endforeach()
endfunction()

# spdlog/fmt as header-only interface targets (their Debian packages have shared objects only).
function(strata_header_only_spdlog)
  foreach(t spdlog::spdlog spdlog::spdlog_header_only)
    if(NOT TARGET ${t})
      add_library(${t} INTERFACE IMPORTED)
      set_target_properties(${t} PROPERTIES
        INTERFACE_COMPILE_DEFINITIONS "SPDLOG_HEADER_ONLY;SPDLOG_FMT_EXTERNAL;FMT_HEADER_ONLY"
        INTERFACE_LINK_LIBRARIES Threads::Threads)
    endif()
  endforeach()
endfunction()
function(strata_header_only_fmt)
  foreach(t fmt::fmt fmt::fmt-header-only)
    if(NOT TARGET ${t})
      add_library(${t} INTERFACE IMPORTED)
      set_target_properties(${t} PROPERTIES INTERFACE_COMPILE_DEFINITIONS FMT_HEADER_ONLY)
    endif()
  endforeach()
endfunction()

# A macro, so the package's result variables land in the caller's scope.
macro(strata_static_provider method strata_pkg_name)
  if("${strata_pkg_name}" STREQUAL "spdlog")
    if(NOT TARGET Threads::Threads)
      find_package(Threads REQUIRED BYPASS_PROVIDER)
    endif()
    strata_header_only_spdlog()
    set(spdlog_FOUND TRUE)
  elseif("${strata_pkg_name}" STREQUAL "fmt")
    strata_header_only_fmt()
    set(fmt_FOUND TRUE)
  else()
    find_package(${strata_pkg_name} ${ARGN} BYPASS_PROVIDER)
    strata_static_retarget_imports()
  endif()
endmacro()

cmake_language(SET_DEPENDENCY_PROVIDER strata_static_provider SUPPORTED_METHODS FIND_PACKAGE)
# Tells the project that imported libraries are archives: nothing here can go into a shared
# object (Debian's archives are not built for it, e.g. Abseil's initial-exec TLS).
set(STRATA_STATIC_IMPORTS ON)
