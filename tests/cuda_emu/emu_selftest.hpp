#pragma once
// emu_selftest.cpp: deliberately wrong kernels run on the emulator; each returns the error it raised
// ("" when none).
#include <cstdint>
#include <string>
#include <vector>

namespace emu_selftest {

std::string barrier_in_divergent_code();
std::string shuffle_after_early_exit();
bool missing_barrier_changes_with_order();  // a race: the two thread orders give different results
std::string smem_without_optin();           // 64 KiB of dynamic shared memory, no cudaFuncSetAttribute
std::string smem_with_optin();              // the same after the opt-in: no error
bool optin_above_limit_refused();           // 228 KiB > an H100's 227 KiB
std::string too_many_threads();             // 2048 threads per block
// The blocks of a launch in the order they ran, under a schedule seed (emu::set_schedule).
std::vector<int> block_order(uint64_t schedule, int blocks);
// A float sum by atomicAdd from 64 x 128 threads, under a schedule seed.
float atomic_sum(uint64_t schedule);
// D = A B by one emulated mma.sync m16n8k16 with bf16 (or f16) operands and f32 accumulation, A [16, 16]
// and B [16, 8] row-major (values exact in the operand type). Each lane fills its registers from PTX's
// fragment tables as the kernel writes them out, apart from emu.hpp's own reading of those tables; D
// [16, 8] row-major from the lanes' accumulator fragments.
std::vector<float> mma_m16n8k16(bool bf16, const std::vector<float>& a, const std::vector<float>& b);
// ldmatrix.x4 (trans or not) by one warp from a [16, 24] tile of 16-bit values in shared memory, lane L
// giving the row address at element offset rows[L]: the 4 registers of each lane, lane by lane.
std::vector<uint32_t> ldmatrix_x4(bool trans, const std::vector<uint16_t>& tile, const std::vector<int>& rows);
std::string ldmatrix_unaligned();  // a row address 8 bytes into a row
// cp.async by 64 threads per block (emu_selftest.cu, cp_async_probe): each thread's 16 bytes (4 ints,
// src[i] = i) through shared memory, read back by its neighbour after wait_group 0 and a barrier (mode
// 0), after the barrier only (1), or a slot's old contents (-2) read while a neighbour's copy into it
// is issued (2). out, 4 ints per thread.
std::vector<int> cp_async(int mode, int blocks);
std::string cp_async_unaligned();  // a source 4 bytes off 16-byte alignment

}  // namespace emu_selftest
