#include "rdmaring/post.hpp"

#include <arpa/inet.h>

namespace rdmaring {
namespace {

void fill_inline(ibv_send_wr& wr, ibv_sge& sge, std::span<const std::byte> bytes, std::uint64_t addr,
                 std::uint32_t rkey) {
  // Inline: the bytes are copied at post time, so a stack buffer is fine and needs no MR.
  sge.addr = reinterpret_cast<std::uintptr_t>(bytes.data());
  sge.length = static_cast<std::uint32_t>(bytes.size());
  sge.lkey = 0;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags |= IBV_SEND_INLINE;
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
}

void fill_slot(ibv_send_wr& wr, const SendQueueBudget::Slot& slot) {
  wr.wr_id = slot.wr_id;
  wr.send_flags = slot.signaled ? IBV_SEND_SIGNALED : 0;
}

}  // namespace

Result<void> post_chain(verbs::QueuePair& qp, std::span<const WorkRequest> wrs, const WriteTarget& target) {
  std::array<ibv_send_wr, PostBatch{}.wrs.size()> out{};
  std::array<ibv_sge, PostBatch{}.wrs.size()> sges{};
  for (std::size_t i = 0; i < wrs.size(); ++i) {
    const WorkRequest& w = wrs[i];
    ibv_send_wr& wr = out[i];
    fill_slot(wr, w.slot);
    if (i + 1 < wrs.size()) wr.next = &out[i + 1];
    if (w.kind == WorkRequest::Kind::write_tail) {
      fill_inline(wr, sges[i], w.tail, target.remote.tail_addr, target.remote.tail_rkey);
      continue;
    }
    sges[i] = ibv_sge{reinterpret_cast<std::uintptr_t>(target.local_base + w.local_offset), w.length, target.lkey};
    wr.sg_list = &sges[i];
    wr.num_sge = w.length == 0 ? 0 : 1;
    wr.wr.rdma.remote_addr = target.remote.ring_addr + w.remote_offset;
    wr.wr.rdma.rkey = target.remote.ring_rkey;
    wr.opcode = w.kind == WorkRequest::Kind::write_with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    if (w.kind == WorkRequest::Kind::write_with_imm) wr.imm_data = htonl(w.imm);
  }
  return qp.post_send(out[0]);
}

Result<void> post_inline_write(verbs::QueuePair& qp, std::span<const std::byte> bytes, std::uint64_t addr,
                               std::uint32_t rkey, const SendQueueBudget::Slot& slot, bool notify) {
  ibv_send_wr wr{};
  ibv_sge sge{};
  fill_slot(wr, slot);
  fill_inline(wr, sge, bytes, addr, rkey);
  if (notify) {
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = 0;
  }
  return qp.post_send(wr);
}

}  // namespace rdmaring
