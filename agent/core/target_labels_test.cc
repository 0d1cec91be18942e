#include "agent/core/target_labels.h"

#include "gtest/gtest.h"

namespace strata::agent {
namespace {

TEST(TargetLabelsTest, PackageNoteVersion) {
  EXPECT_EQ(PackageNoteVersion(
                R"({"type":"deb","name":"checkout","version":"1.4.2-1","architecture":"amd64"})"),
            "1.4.2-1");
  EXPECT_EQ(PackageNoteVersion(R"({"type":"rpm", "version" : "2.0" })"), "2.0");
  EXPECT_EQ(PackageNoteVersion(R"({"name":"version"})"), "");
  EXPECT_EQ(PackageNoteVersion(R"({"version":"unterminated)"), "");
  EXPECT_EQ(PackageNoteVersion(""), "");
}

TEST(TargetLabelsTest, KubernetesPodFromCgroupAndEnvironment) {
  TargetFacts facts;
  facts.build_id_hex = "abcdef01";
  facts.package_version = "1.4.2";
  facts.container = {std::string(64, 'a'), "containerd", "8d0f2e3a-5b6c-4d7e-8f90-a1b2c3d4e5f6"};
  facts.environment = {{"HOSTNAME", "checkout-7d9f-x2"}, {"KUBERNETES_SERVICE_HOST", "10.0.0.1"}};
  facts.service_account_namespace = "shop";
  std::vector<std::string> warnings;
  const labels::LabelSet set = LabelsFromFacts(facts, &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(set, (labels::LabelSet{{"build_id", "abcdef01"},
                                   {"container_id", std::string(64, 'a')},
                                   {"container_runtime", "containerd"},
                                   {"namespace", "shop"},
                                   {"pod", "checkout-7d9f-x2"},
                                   {"pod_uid", "8d0f2e3a-5b6c-4d7e-8f90-a1b2c3d4e5f6"},
                                   {"version", "1.4.2"}}));
  // The downward API's variables win over the hostname and the service account.
  facts.environment.emplace_back("POD_NAME", "checkout-0");
  facts.environment.emplace_back("POD_NAMESPACE", "shop-eu");
  const labels::LabelSet named = LabelsFromFacts(facts, nullptr);
  EXPECT_EQ(labels::ValueOf(named, "pod"), "checkout-0");
  EXPECT_EQ(labels::ValueOf(named, "namespace"), "shop-eu");
}

TEST(TargetLabelsTest, StrataLabelsWinAndBadOnesAreLeftOut) {
  TargetFacts facts;
  facts.package_version = "1.4.2";
  facts.environment = {{"STRATA_LABELS", "version=1.4.3-canary,region=eu-west"}};
  std::vector<std::string> warnings;
  EXPECT_EQ(LabelsFromFacts(facts, &warnings),
            (labels::LabelSet{{"region", "eu-west"}, {"version", "1.4.3-canary"}}));
  EXPECT_TRUE(warnings.empty());
  // Outside a pod the hostname is the host's, not a pod name.
  facts.environment = {{"STRATA_LABELS", "region=eu,bad key=1"}, {"HOSTNAME", "web-1"}};
  warnings.clear();
  EXPECT_EQ(LabelsFromFacts(facts, &warnings), (labels::LabelSet{{"version", "1.4.2"}}));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("STRATA_LABELS"), std::string::npos);
  // Derived values that are not label syntax are skipped with a warning.
  facts = TargetFacts();
  facts.package_version = "1,0";
  warnings.clear();
  EXPECT_TRUE(LabelsFromFacts(facts, &warnings).empty());
  EXPECT_EQ(warnings.size(), 1u);
}

}  // namespace
}  // namespace strata::agent
