// What a test sees of the stand-in CUDA runtime (one thread; the GPU delivery's host side).
#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmaring::test::cuda_standin {

// While held, stream work (copies, event records) waits in its stream's queue, as behind a slow
// copy engine; run_held() runs it. cudaStreamSynchronize runs it whatever the hold.
void hold(bool on);
void run_held();
// Host ranges registered with cudaHostRegister now.
std::size_t registered_ranges();
// Host-to-device copies whose source lay outside every registered or pinned range (CUDA would
// stage them through a bounce buffer), or whose target was not device memory.
std::uint64_t unregistered_copies();

}  // namespace rdmaring::test::cuda_standin
