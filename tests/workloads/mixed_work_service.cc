// mixed_work_service: the Go workload's work (tests/e2e/golang/workload: hashWorker and
// sortAndEncode) in C++, so that what the agent pays per sample of a Go target can be set
// against a C++ target running the same kind of code: many functions and leaf addresses
// (a hash's unrolled rounds, a sort, a JSON encoder and parser working by reflection), not
// the demo's three tight loops.
//
//   hash thread:  8 x SHA-256 of a 16 KiB buffer (OpenSSL), again and again
//   sort thread:  4096 random integers sorted, 64 records encoded as JSON and parsed back
//                 (protobuf's JSON support over google.protobuf.Struct), then 1 ms of sleep
//
//   mixed_work_service [--seconds N]   (N default 3600)
//
// Prints "ready" once both threads are started; after N seconds or at SIGTERM/SIGINT, stops
// and prints "done: H hashes, J round trips" (buffers hashed, JSON round trips completed).
// Built like the other workloads: -O2, no frame pointers, with debug information.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <openssl/sha.h>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace {

std::atomic<bool> g_stop{false};
std::atomic<uint64_t> g_hashes{0}, g_round_trips{0};
volatile uint64_t g_sink;

void OnSignal(int) { g_stop.store(true); }

__attribute__((noinline)) void HashWorker() {
  std::vector<unsigned char> buffer(16 << 10);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<unsigned char>(i);
  unsigned char digest[SHA256_DIGEST_LENGTH];
  while (!g_stop.load(std::memory_order_relaxed)) {
    for (int i = 0; i < 8; ++i) {
      SHA256(buffer.data(), buffer.size(), digest);
      g_sink = g_sink ^ digest[0];
    }
    g_hashes.fetch_add(8, std::memory_order_relaxed);
  }
}

__attribute__((noinline)) void SortAndEncode() {
  std::mt19937_64 random(1);
  std::vector<int64_t> xs(4096);
  std::string json;
  while (!g_stop.load(std::memory_order_relaxed)) {
    for (int64_t& x : xs) x = static_cast<int64_t>(random() >> 1);
    std::sort(xs.begin(), xs.end());
    google::protobuf::Struct document;
    google::protobuf::ListValue* records = (*document.mutable_fields())["records"]
                                               .mutable_list_value();
    for (int i = 0; i < 64; ++i) {
      google::protobuf::Struct* record = records->add_values()->mutable_struct_value();
      auto& fields = *record->mutable_fields();
      fields["id"].set_number_value(i);
      fields["name"].set_string_value("record-" + std::to_string(i));
      google::protobuf::ListValue* values = fields["values"].mutable_list_value();
      for (int j = 0; j < 16; ++j) {
        values->add_values()->set_number_value(static_cast<double>(xs[i + j] >> 11));
      }
      google::protobuf::ListValue* tags = fields["tags"].mutable_list_value();
      for (const char* tag : {"a", "b", "c"}) tags->add_values()->set_string_value(tag);
    }
    json.clear();
    if (!google::protobuf::util::MessageToJsonString(document, &json).ok()) std::abort();
    google::protobuf::Struct parsed;
    if (!google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) std::abort();
    if (parsed.fields().at("records").list_value().values_size() != 64) std::abort();
    g_round_trips.fetch_add(1, std::memory_order_relaxed);
    // Less CPU than the hashing thread, as in the Go workload.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3600;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: mixed_work_service [--seconds N]\n");
      return 2;
    }
  }
  if (!(seconds > 0)) {
    std::fprintf(stderr, "mixed_work_service: --seconds must be positive\n");
    return 2;
  }
  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);
  std::vector<std::thread> workers;
  workers.emplace_back(HashWorker);
  workers.emplace_back(SortAndEncode);
  std::printf("ready\n");
  std::fflush(stdout);
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(seconds));
  while (!g_stop.load() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  g_stop.store(true);
  for (std::thread& t : workers) t.join();
  std::printf("done: %llu hashes, %llu round trips\n",
              static_cast<unsigned long long>(g_hashes.load()),
              static_cast<unsigned long long>(g_round_trips.load()));
  return 0;
}
