#pragma once
#include <cuda_runtime.h>
struct Args {
  void *out, *tmp_out; float *exp_sums, *max_logits;
  const void *q, *k, *v;
  int num_seqs, num_heads, num_kv_heads, head_size; float scale;
  const int* block_tables; const int* seq_lens; int max_blocks, max_seq_len;
  int q_stride, kv_block_stride, kv_head_stride;
  const float *k_scale, *v_scale; cudaStream_t stream;
  const float* alibi = nullptr;  // ALiBi slopes [num_heads], or none
};
