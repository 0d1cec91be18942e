// strata-snapshot-record: records an unwinding snapshot of a running process.
//   strata-snapshot-record PID SECONDS OUT_FILE [HZ]
#include <cstdio>
#include <cstdlib>

#include "tests/snapshot/snapshot.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s PID SECONDS OUT_FILE [HZ]\n", argv[0]);
    return 2;
  }
  strata::snapshot::RecordOptions options;
  options.seconds = std::atof(argv[2]);
  if (argc > 4) options.frequency_hz = static_cast<uint32_t>(std::atoi(argv[4]));
  auto stats = strata::snapshot::Record(std::atoi(argv[1]), options, argv[3]);
  if (!stats.ok()) {
    std::fprintf(stderr, "%s\n", stats.status().ToString().c_str());
    return 1;
  }
  std::printf("%zu samples, %zu threads, %zu mapping sets, %llu lost\n", stats->samples,
              stats->threads, stats->mapping_sets, static_cast<unsigned long long>(stats->lost));
  return 0;
}
