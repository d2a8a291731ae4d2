// Prototype: one CTA computes HEADS consecutive query heads that share one KV head, reading
// each K/V block once for all of them. Per head, the arithmetic is stock's, in stock's order.
#pragma once
namespace vllm {

template <typename cache_t, int BYTES>
__device__ __forceinline__ void kvp_bulk_prefetch(const cache_t* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "n"(BYTES) : "memory");
#endif
}

// HALVES = 2: a CTA of 2 x NUM_THREADS threads, each half the stock kernel's 4 warps for its own
// HEADS heads (its own barrier, its own shared memory), both halves reading the same tiles (the
// second from L1 when they run together): more warps per CTA, each head's arithmetic unchanged.
template <int HALVES, int THREADS>
__device__ __forceinline__ void kvp_sync(int half) {
  if constexpr (HALVES == 1) {
    __syncthreads();
  } else {
    asm volatile("bar.sync %0, %1;" ::"r"(half + 1), "n"(THREADS) : "memory");
  }
}

// block_sum of the stock kernel, over the warps of one half
template <int NUM_WARPS, int HALVES>
__device__ __forceinline__ float kvp_block_sum(float* red_smem, float sum, int half) {
  const int warp = (threadIdx.x % (NUM_WARPS * WARP_SIZE)) / WARP_SIZE;
  const int lane = threadIdx.x % WARP_SIZE;
#pragma unroll
  for (int mask = WARP_SIZE / 2; mask >= 1; mask /= 2) sum += VLLM_SHFL_XOR_SYNC(sum, mask);
  if (lane == 0) red_smem[warp] = sum;
  kvp_sync<HALVES, NUM_WARPS * WARP_SIZE>(half);
  if (lane < NUM_WARPS) sum = red_smem[lane];
#pragma unroll
  for (int mask = NUM_WARPS / 2; mask >= 1; mask /= 2) sum += VLLM_SHFL_XOR_SYNC(sum, mask);
  return VLLM_SHFL_SYNC(sum, 0);
}

template <typename scalar_t, typename cache_t, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          vllm::Fp8KVCacheDataType KV_DTYPE, int HEADS, bool PREFETCH, int PARTITION_SIZE = 0, int HALVES = 1>
__device__ void kvp_grouped_attention(
    float* __restrict__ exp_sums, float* __restrict__ max_logits, scalar_t* __restrict__ out,
    const scalar_t* __restrict__ q, const cache_t* __restrict__ k_cache,
    const cache_t* __restrict__ v_cache, const int num_kv_heads, const int num_heads,
    const float scale, const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const int max_num_blocks_per_seq, const float* __restrict__ alibi_slopes, const int q_stride,
    const int kv_block_stride, const int kv_head_stride, const float* k_scale,
    const float* v_scale) {
  const int seq_idx = blockIdx.y;
  const int partition_idx = blockIdx.z;
  const int max_num_partitions = gridDim.z;
  constexpr bool USE_PARTITIONING = PARTITION_SIZE > 0;
  const int seq_len = seq_lens[seq_idx];
  if (USE_PARTITIONING && partition_idx * PARTITION_SIZE >= seq_len) return;

  const int num_seq_blocks = DIVIDE_ROUND_UP(seq_len, BLOCK_SIZE);
  const int num_blocks_per_partition = USE_PARTITIONING ? PARTITION_SIZE / BLOCK_SIZE : num_seq_blocks;
  const int start_block_idx = USE_PARTITIONING ? partition_idx * num_blocks_per_partition : 0;
  const int end_block_idx = MIN(start_block_idx + num_blocks_per_partition, num_seq_blocks);
  const int num_blocks = end_block_idx - start_block_idx;
  const int start_token_idx = start_block_idx * BLOCK_SIZE;
  const int end_token_idx = MIN(start_token_idx + num_blocks * BLOCK_SIZE, seq_len);
  const int num_tokens = end_token_idx - start_token_idx;

  constexpr int THREAD_GROUP_SIZE = MAX(WARP_SIZE / BLOCK_SIZE, 1);
  constexpr int NUM_THREAD_GROUPS = NUM_THREADS / THREAD_GROUP_SIZE;
  constexpr int NUM_TOKENS_PER_THREAD_GROUP = DIVIDE_ROUND_UP(BLOCK_SIZE, WARP_SIZE);
  constexpr int NUM_WARPS = NUM_THREADS / WARP_SIZE;
  const int half = HALVES > 1 ? threadIdx.x / NUM_THREADS : 0;
  const int thread_idx = threadIdx.x % NUM_THREADS;
  const int warp_idx = thread_idx / WARP_SIZE;
  const int lane = thread_idx % WARP_SIZE;

  const int first_head = (blockIdx.x * HALVES + half) * HEADS;
  const int kv_head_idx = first_head / (num_heads / num_kv_heads);
  float alibi[HEADS];
#pragma unroll
  for (int h = 0; h < HEADS; h++) alibi[h] = alibi_slopes == nullptr ? 0.f : alibi_slopes[first_head + h];

  constexpr int VEC_SIZE = MAX(16 / (THREAD_GROUP_SIZE * sizeof(scalar_t)), 1);
  using K_vec = typename Vec<scalar_t, VEC_SIZE>::Type;
  using Q_vec = typename Vec<scalar_t, VEC_SIZE>::Type;
  using Quant_vec = typename Vec<cache_t, VEC_SIZE>::Type;
  constexpr int NUM_ELEMS_PER_THREAD = HEAD_SIZE / THREAD_GROUP_SIZE;
  constexpr int NUM_VECS_PER_THREAD = NUM_ELEMS_PER_THREAD / VEC_SIZE;
  const int thread_group_idx = thread_idx / THREAD_GROUP_SIZE;
  const int thread_group_offset = thread_idx % THREAD_GROUP_SIZE;

  __shared__ Q_vec q_vecs_all[HALVES][HEADS][THREAD_GROUP_SIZE][NUM_VECS_PER_THREAD];
  auto& q_vecs = q_vecs_all[half];
#pragma unroll
  for (int h = 0; h < HEADS; h++) {
    const scalar_t* q_ptr = q + seq_idx * q_stride + (first_head + h) * HEAD_SIZE;
#pragma unroll
    for (int i = thread_group_idx; i < NUM_VECS_PER_THREAD; i += NUM_THREAD_GROUPS) {
      const int vec_idx = thread_group_offset + i * THREAD_GROUP_SIZE;
      q_vecs[h][thread_group_offset][i] = *reinterpret_cast<const Q_vec*>(q_ptr + vec_idx * VEC_SIZE);
    }
  }
  kvp_sync<HALVES, NUM_THREADS>(half);

  extern __shared__ char shared_mem[];
  // Each head's logits (and later its cross-warp output buffer) at logits + h * stride.
  const int stride = MAX(num_blocks * BLOCK_SIZE, (NUM_WARPS / 2) * HEAD_SIZE);
  float* logits = reinterpret_cast<float*>(shared_mem) + half * HEADS * stride;
  __shared__ float red_all[HALVES][HEADS][2 * NUM_WARPS];
  auto& red_smem = red_all[half];

  constexpr int x = 16 / sizeof(cache_t);
  float qk_max[HEADS];
#pragma unroll
  for (int h = 0; h < HEADS; h++) qk_max[h] = -FLT_MAX;
  const int* block_table = block_tables + seq_idx * max_num_blocks_per_seq;
  constexpr int KV_BYTES = HEAD_SIZE * BLOCK_SIZE * sizeof(cache_t);

  for (int block_idx = start_block_idx + warp_idx; block_idx < end_block_idx; block_idx += NUM_WARPS) {
    const int64_t physical_block_number = static_cast<int64_t>(block_table[block_idx]);
    if constexpr (PREFETCH) {
      const int next = block_idx + NUM_WARPS;
      if (lane == 0 && next < end_block_idx) {
        const int64_t nb = static_cast<int64_t>(block_table[next]);
        kvp_bulk_prefetch<cache_t, KV_BYTES>(k_cache + nb * kv_block_stride + kv_head_idx * kv_head_stride);
      }
    }
    for (int i = 0; i < NUM_TOKENS_PER_THREAD_GROUP; i++) {
      const int physical_block_offset = (thread_group_idx + i * WARP_SIZE) % BLOCK_SIZE;
      const int token_idx = block_idx * BLOCK_SIZE + physical_block_offset;
      K_vec k_vecs[NUM_VECS_PER_THREAD];
#pragma unroll
      for (int j = 0; j < NUM_VECS_PER_THREAD; j++) {
        const cache_t* k_ptr = k_cache + physical_block_number * kv_block_stride + kv_head_idx * kv_head_stride +
                               physical_block_offset * x;
        const int vec_idx = thread_group_offset + j * THREAD_GROUP_SIZE;
        const int offset1 = (vec_idx * VEC_SIZE) / x;
        const int offset2 = (vec_idx * VEC_SIZE) % x;
        if constexpr (KV_DTYPE == Fp8KVCacheDataType::kAuto) {
          k_vecs[j] = *reinterpret_cast<const K_vec*>(k_ptr + offset1 * BLOCK_SIZE * x + offset2);
        } else {
          Quant_vec k_vec_quant = *reinterpret_cast<const Quant_vec*>(k_ptr + offset1 * BLOCK_SIZE * x + offset2);
          k_vecs[j] = fp8::scaled_convert<K_vec, Quant_vec, KV_DTYPE>(k_vec_quant, *k_scale);
        }
      }
#pragma unroll
      for (int h = 0; h < HEADS; h++) {
        float qk = scale * Qk_dot<scalar_t, THREAD_GROUP_SIZE>::dot(q_vecs[h][thread_group_offset], k_vecs);
        qk += (alibi[h] != 0) ? alibi[h] * (token_idx - seq_len + 1) : 0;
        if (thread_group_offset == 0) {
          const bool mask = token_idx >= seq_len;
          logits[h * stride + token_idx - start_token_idx] = mask ? 0.f : qk;
          qk_max[h] = mask ? qk_max[h] : fmaxf(qk_max[h], qk);
        }
      }
    }
  }

#pragma unroll
  for (int h = 0; h < HEADS; h++) {
#pragma unroll
    for (int mask = WARP_SIZE / 2; mask >= THREAD_GROUP_SIZE; mask /= 2)
      qk_max[h] = fmaxf(qk_max[h], VLLM_SHFL_XOR_SYNC(qk_max[h], mask));
    if (lane == 0) red_smem[h][warp_idx] = qk_max[h];
  }
  kvp_sync<HALVES, NUM_THREADS>(half);

#pragma unroll
  for (int h = 0; h < HEADS; h++) {
    float m = lane < NUM_WARPS ? red_smem[h][lane] : -FLT_MAX;
#pragma unroll
    for (int mask = NUM_WARPS / 2; mask >= 1; mask /= 2) m = fmaxf(m, VLLM_SHFL_XOR_SYNC(m, mask));
    m = VLLM_SHFL_SYNC(m, 0);
    float* lg = logits + h * stride;
    float exp_sum = 0.f;
    for (int i = thread_idx; i < num_tokens; i += NUM_THREADS) {
      float val = __expf(lg[i] - m);
      lg[i] = val;
      exp_sum += val;
    }
    exp_sum = kvp_block_sum<NUM_WARPS, HALVES>(&red_smem[h][NUM_WARPS], exp_sum, half);
    const float inv_sum = __fdividef(1.f, exp_sum + 1e-6f);
    for (int i = thread_idx; i < num_tokens; i += NUM_THREADS) lg[i] *= inv_sum;
    if (USE_PARTITIONING && thread_idx == 0) {
      const int head_idx = first_head + h;
      max_logits[seq_idx * num_heads * max_num_partitions + head_idx * max_num_partitions + partition_idx] = m;
      exp_sums[seq_idx * num_heads * max_num_partitions + head_idx * max_num_partitions + partition_idx] = exp_sum;
    }
  }
  kvp_sync<HALVES, NUM_THREADS>(half);

  constexpr int V_VEC_SIZE = MIN(16 / sizeof(scalar_t), BLOCK_SIZE);
  using V_vec = typename Vec<scalar_t, V_VEC_SIZE>::Type;
  using L_vec = typename Vec<scalar_t, V_VEC_SIZE>::Type;
  using V_quant_vec = typename Vec<cache_t, V_VEC_SIZE>::Type;
  using Float_L_vec = typename FloatVec<L_vec>::Type;
  constexpr int NUM_V_VECS_PER_ROW = BLOCK_SIZE / V_VEC_SIZE;
  constexpr int NUM_ROWS_PER_ITER = WARP_SIZE / NUM_V_VECS_PER_ROW;
  constexpr int NUM_ROWS_PER_THREAD = DIVIDE_ROUND_UP(HEAD_SIZE, NUM_ROWS_PER_ITER);

  float accs[HEADS][NUM_ROWS_PER_THREAD];
#pragma unroll
  for (int h = 0; h < HEADS; h++)
#pragma unroll
    for (int i = 0; i < NUM_ROWS_PER_THREAD; i++) accs[h][i] = 0.f;

  scalar_t zero_value;
  zero(zero_value);
  for (int block_idx = start_block_idx + warp_idx; block_idx < end_block_idx; block_idx += NUM_WARPS) {
    const int64_t physical_block_number = static_cast<int64_t>(block_table[block_idx]);
    if constexpr (PREFETCH) {
      const int next = block_idx + NUM_WARPS;
      if (lane == 0 && next < end_block_idx) {
        const int64_t nb = static_cast<int64_t>(block_table[next]);
        kvp_bulk_prefetch<cache_t, KV_BYTES>(v_cache + nb * kv_block_stride + kv_head_idx * kv_head_stride);
      }
    }
    const int physical_block_offset = (lane % NUM_V_VECS_PER_ROW) * V_VEC_SIZE;
    const int token_idx = block_idx * BLOCK_SIZE + physical_block_offset;
    L_vec logits_vec[HEADS];
#pragma unroll
    for (int h = 0; h < HEADS; h++)
      from_float(logits_vec[h], *reinterpret_cast<Float_L_vec*>(logits + h * stride + token_idx - start_token_idx));
    const cache_t* v_ptr = v_cache + physical_block_number * kv_block_stride + kv_head_idx * kv_head_stride;
#pragma unroll
    for (int i = 0; i < NUM_ROWS_PER_THREAD; i++) {
      const int row_idx = lane / NUM_V_VECS_PER_ROW + i * NUM_ROWS_PER_ITER;
      if (row_idx < HEAD_SIZE) {
        const int offset = row_idx * BLOCK_SIZE + physical_block_offset;
        V_vec v_vec;
        if constexpr (KV_DTYPE == Fp8KVCacheDataType::kAuto) {
          v_vec = *reinterpret_cast<const V_vec*>(v_ptr + offset);
        } else {
          V_quant_vec v_quant_vec = *reinterpret_cast<const V_quant_vec*>(v_ptr + offset);
          v_vec = fp8::scaled_convert<V_vec, V_quant_vec, KV_DTYPE>(v_quant_vec, *v_scale);
        }
        if (block_idx == num_seq_blocks - 1) {
          scalar_t* v_vec_ptr = reinterpret_cast<scalar_t*>(&v_vec);
#pragma unroll
          for (int j = 0; j < V_VEC_SIZE; j++) v_vec_ptr[j] = token_idx + j < seq_len ? v_vec_ptr[j] : zero_value;
        }
#pragma unroll
        for (int h = 0; h < HEADS; h++) accs[h][i] += dot(logits_vec[h], v_vec);
      }
    }
  }

#pragma unroll
  for (int h = 0; h < HEADS; h++)
#pragma unroll
    for (int i = 0; i < NUM_ROWS_PER_THREAD; i++) {
      float acc = accs[h][i];
#pragma unroll
      for (int mask = NUM_V_VECS_PER_ROW / 2; mask >= 1; mask /= 2) acc += VLLM_SHFL_XOR_SYNC(acc, mask);
      accs[h][i] = acc;
    }
  kvp_sync<HALVES, NUM_THREADS>(half);

#pragma unroll
  for (int w = NUM_WARPS; w > 1; w /= 2) {
    const int mid = w / 2;
    if (warp_idx >= mid && warp_idx < w) {
#pragma unroll
      for (int h = 0; h < HEADS; h++) {
        float* dst = logits + h * stride + (warp_idx - mid) * HEAD_SIZE;
#pragma unroll
        for (int i = 0; i < NUM_ROWS_PER_THREAD; i++) {
          const int row_idx = lane / NUM_V_VECS_PER_ROW + i * NUM_ROWS_PER_ITER;
          if (row_idx < HEAD_SIZE && lane % NUM_V_VECS_PER_ROW == 0) dst[row_idx] = accs[h][i];
        }
      }
    }
    kvp_sync<HALVES, NUM_THREADS>(half);
    if (warp_idx < mid) {
#pragma unroll
      for (int h = 0; h < HEADS; h++) {
        const float* src = logits + h * stride + warp_idx * HEAD_SIZE;
#pragma unroll
        for (int i = 0; i < NUM_ROWS_PER_THREAD; i++) {
          const int row_idx = lane / NUM_V_VECS_PER_ROW + i * NUM_ROWS_PER_ITER;
          if (row_idx < HEAD_SIZE && lane % NUM_V_VECS_PER_ROW == 0) accs[h][i] += src[row_idx];
        }
      }
    }
    kvp_sync<HALVES, NUM_THREADS>(half);
  }

  if (warp_idx == 0) {
#pragma unroll
    for (int h = 0; h < HEADS; h++) {
      scalar_t* out_ptr = out + seq_idx * num_heads * max_num_partitions * HEAD_SIZE +
                          (first_head + h) * max_num_partitions * HEAD_SIZE + partition_idx * HEAD_SIZE;
#pragma unroll
      for (int i = 0; i < NUM_ROWS_PER_THREAD; i++) {
        const int row_idx = lane / NUM_V_VECS_PER_ROW + i * NUM_ROWS_PER_ITER;
        if (row_idx < HEAD_SIZE && lane % NUM_V_VECS_PER_ROW == 0) from_float(*(out_ptr + row_idx), accs[h][i]);
      }
    }
  }
}

template <typename scalar_t, typename cache_t, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          vllm::Fp8KVCacheDataType KV_DTYPE, int HEADS, bool PREFETCH, int HALVES = 1>
__global__ void kvp_grouped_v1_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ q,
                                      const cache_t* __restrict__ k_cache, const cache_t* __restrict__ v_cache,
                                      const int num_kv_heads, const int num_heads, const float scale,
                                      const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
                                      const int max_num_blocks_per_seq, const float* __restrict__ alibi_slopes,
                                      const int q_stride, const int kv_block_stride, const int kv_head_stride,
                                      const float* k_scale, const float* v_scale) {
  kvp_grouped_attention<scalar_t, cache_t, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, KV_DTYPE, HEADS, PREFETCH, 0, HALVES>(
      nullptr, nullptr, out, q, k_cache, v_cache, num_kv_heads, num_heads, scale, block_tables, seq_lens,
      max_num_blocks_per_seq, alibi_slopes, q_stride, kv_block_stride, kv_head_stride, k_scale, v_scale);
}

template <typename scalar_t, typename cache_t, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          vllm::Fp8KVCacheDataType KV_DTYPE, int HEADS, bool PREFETCH, int PARTITION_SIZE, int HALVES = 1>
__global__ void kvp_grouped_v2_kernel(float* __restrict__ exp_sums, float* __restrict__ max_logits,
                                      scalar_t* __restrict__ tmp_out, const scalar_t* __restrict__ q,
                                      const cache_t* __restrict__ k_cache, const cache_t* __restrict__ v_cache,
                                      const int num_kv_heads, const int num_heads, const float scale,
                                      const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
                                      const int max_num_blocks_per_seq, const float* __restrict__ alibi_slopes,
                                      const int q_stride, const int kv_block_stride, const int kv_head_stride,
                                      const float* k_scale, const float* v_scale) {
  kvp_grouped_attention<scalar_t, cache_t, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, KV_DTYPE, HEADS, PREFETCH,
                        PARTITION_SIZE, HALVES>(exp_sums, max_logits, tmp_out, q, k_cache, v_cache, num_kv_heads, num_heads,
                                        scale, block_tables, seq_lens, max_num_blocks_per_seq, alibi_slopes, q_stride,
                                        kv_block_stride, kv_head_stride, k_scale, v_scale);
}

}  // namespace vllm
