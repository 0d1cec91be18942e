#!/usr/bin/env bash
# The linker launcher of strata-agent (agent/CMakeLists.txt, STRATA_AGENT_ARCHIVES): runs the
# link command it is given ("$@") with gRPC, protobuf and Abseil taken from the static archives
# beside their shared objects, and everything else (glibc, libstdc++, OpenSSL, zlib, c-ares,
# re2, spdlog, fmt) left shared.
#
# Why: the shipper runs gRPC's code once a batch, from cold caches; across some 50 shared
# objects each call between them goes through a PLT stub and a GOT entry on pages of their own.
# Linked into the binary, the shipper takes 0.8x the CPU (docs/developing/agent-cost.md). CMake
# names imported libraries by the paths of their shared objects, and a target cannot ask for
# their archives instead, so the command line is rewritten here: every such library is dropped
# from where it stands and their archives go, as one group (Abseil's archives refer to each
# other both ways), where the first of them stood, before the shared libraries they need.
set -euo pipefail
libraries='grpc\+\+|grpc|gpr|upb|address_sorting|protobuf|absl_[a-z0-9_]+'
pattern="^(.*/)?lib($libraries)\\.so(\\.[0-9.]+)?\$"
command=()
archives=()
group_at=-1
for arg in "$@"; do
  if [[ $arg =~ $pattern ]]; then
    archive="${BASH_REMATCH[1]}lib${BASH_REMATCH[2]}.a"
    if [[ -f $archive ]]; then
      if ((group_at < 0)); then
        group_at=${#command[@]}
        command+=(GROUP)
      fi
      [[ " ${archives[*]} " == *" $archive "* ]] || archives+=("$archive")
      continue
    fi
  fi
  command+=("$arg")
done
if ((group_at >= 0)); then
  command=("${command[@]:0:group_at}" -Wl,--start-group "${archives[@]}" -Wl,--end-group
           "${command[@]:group_at+1}")
fi
exec "${command[@]}"
