//===- ArtifactReaderFuzzer.cpp - libFuzzer target for the .kiln reader ----===//
//
// Feeds arbitrary bytes to parseArtifact. A random mutation almost never
// keeps the header's checksum right, which would stop every input at the
// first check, so for most inputs the target writes the correct checksum
// (and payload size) into the header first: the FlatBuffer verifier and the
// cross-reference checks behind it then see the mutations. What parses is
// walked (every buffer's size, every op's operands) and must serialise and
// parse again. Built and run by utils/fuzz.sh.
//
//===----------------------------------------------------------------------===//
#include "artifact/Artifact.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace kiln::artifact;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  // One input in 8 goes in untouched, so the header checks are fuzzed too.
  if (bytes.size() >= kHeaderBytes && (size == 0 || data[size - 1] % 8 != 0)) {
    uint64_t payload = bytes.size() - kHeaderBytes;
    uint64_t sum = checksum(std::span<const uint8_t>(bytes).subspan(kHeaderBytes));
    for (int i = 0; i < 8; ++i) {
      bytes[16 + i] = uint8_t(payload >> (8 * i));
      bytes[24 + i] = uint8_t(sum >> (8 * i));
    }
  }
  kiln::Expected<Artifact> a = parseArtifact(bytes, "fuzz");
  if (!a)
    return 0;
  uint64_t total = 0;
  for (const RankPlan &plan : a->rankPlans)
    for (const Step &step : plan.steps) {
      for (const Buffer &b : step.buffers)
        if (b.kind != BufferKind::Weight)
          total += b.bytes();
      for (const Op &op : step.ops) {
        for (int32_t v : op.ins())
          total += step.buffers.at(size_t(v)).name.size();
        for (int32_t v : op.outs())
          total += step.buffers.at(size_t(v)).name.size();
      }
    }
  // What parsed must round-trip.
  kiln::Expected<std::vector<uint8_t>> again = serialize(*a);
  if (!again || !parseArtifact(*again, "fuzz round trip"))
    std::abort();
  return total == 0xdeadbeef; // keep `total` alive
}
