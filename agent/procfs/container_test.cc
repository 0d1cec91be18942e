// cgroup parsing on /proc/PID/cgroup files in the formats of the container runtimes
// (testdata/cgroup_*: cgroup v1 and v2, cgroupfs and systemd drivers).
#include "agent/procfs/container.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace strata::agent::procfs {
namespace {

std::string Sample(const std::string& name) {
  std::ifstream in(std::string(STRATA_PROCFS_TESTDATA) + "/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

constexpr char kDocker[] = "3f4e8b2c1d6a7e9f0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a";
constexpr char kContainerd[] = "9a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9";
constexpr char kCrio[] = "5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d";
constexpr char kPodman[] = "7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d";

TEST(ContainerTest, Docker) {
  EXPECT_EQ(ParseCgroup(Sample("cgroup_v1_docker")), (ContainerInfo{kDocker, "docker", ""}));
  EXPECT_EQ(ParseCgroup(Sample("cgroup_v2_docker")), (ContainerInfo{kDocker, "docker", ""}));
}

TEST(ContainerTest, KubernetesContainerd) {
  // cgroupfs driver (v1): the runtime is not in the path.
  EXPECT_EQ(ParseCgroup(Sample("cgroup_v1_kubepods_containerd")),
            (ContainerInfo{kContainerd, "", "8d0f2e3a-5b6c-4d7e-8f90-a1b2c3d4e5f6"}));
  // systemd driver (v2): the pod UID with underscores, the runtime's scope prefix.
  EXPECT_EQ(ParseCgroup(Sample("cgroup_v2_kubepods_containerd")),
            (ContainerInfo{kContainerd, "containerd", "8d0f2e3a-5b6c-4d7e-8f90-a1b2c3d4e5f6"}));
}

TEST(ContainerTest, KubernetesCrio) {
  const ContainerInfo want{kCrio, "cri-o", "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9"};
  EXPECT_EQ(ParseCgroup(Sample("cgroup_v2_kubepods_crio")), want);
  EXPECT_EQ(ParseCgroup(Sample("cgroup_v1_kubepods_crio")), want);
  // CRI-O's conmon is in the pod but not in the container.
  EXPECT_EQ(ParseCgroup(Sample("cgroup_v2_crio_conmon")),
            (ContainerInfo{"", "", "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9"}));
}

TEST(ContainerTest, Podman) {
  EXPECT_EQ(ParseCgroup(Sample("cgroup_v2_podman")), (ContainerInfo{kPodman, "podman", ""}));
}

TEST(ContainerTest, NoContainer) {
  for (const char* name : {"cgroup_v2_host", "cgroup_v1_host", "cgroup_v2_namespaced",
                           "cgroup_v1_hybrid_sandbox"}) {
    EXPECT_EQ(ParseCgroup(Sample(name)), ContainerInfo{}) << name;
  }
}

TEST(ContainerTest, MalformedTextYieldsNothing) {
  for (const char* text : {"", "\n\n", "garbage", "0:", "0::/docker/xyz",
                           "0::/docker/3f4e8b2c1d6a7e9f0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3",
                           "0::/kubepods/podnot-a-uid/x"}) {
    EXPECT_EQ(ParseCgroup(text), ContainerInfo{}) << text;
  }
}

TEST(ContainerTest, ReadsThisProcess) {
  auto text = ReadCgroup(getpid());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_FALSE(text->empty());
  ParseCgroup(*text);  // whatever this machine is, it parses
}

}  // namespace
}  // namespace strata::agent::procfs
