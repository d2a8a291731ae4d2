// Prototype bench: stock vs kvpatch's shipped patched kernel vs grouped (one CTA per H query heads of a KV group).
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <random>
#include <string>
#include "args.h"
int kvs_stock(const Args&, int, bool);
int kvs_grouped(const Args&, int, bool, int, bool);
int kvs_grouped_halves(const Args&, int, bool, int);
int kvp_stock(const Args&, int, bool);
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)

struct Arm { std::string name; int kind; int H; bool pf; };  // kind 0 stock, 1 patched, 2 grouped, 3 two halves

static int run_arm(const Arm& arm, const Args& a, int dt, bool v1) {
  if (arm.kind == 0) return kvs_stock(a, dt, v1);
  if (arm.kind == 1) return kvp_stock(a, dt, v1);
  if (arm.kind == 3) return kvs_grouped_halves(a, dt, v1, arm.H);
  return kvs_grouped(a, dt, v1, arm.H, arm.pf);
}

int main(int argc, char** argv) {
  int reps = 10, rounds = 7;
  cudaStream_t st; CK(cudaStreamCreate(&st));
  // copy bandwidth, same run
  size_t cb = size_t(2) << 30; void *c0, *c1; CK(cudaMalloc(&c0, cb)); CK(cudaMalloc(&c1, cb));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> ct;
  for (int r = 0; r < 7; r++) { cudaEventRecord(e0, st); CK(cudaMemcpyAsync(c1, c0, cb, cudaMemcpyDeviceToDevice, st)); cudaEventRecord(e1, st); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); ct.push_back(ms); }
  std::sort(ct.begin(), ct.end()); double copy_bw = 2.0 * cb / (ct[3] * 1e-3) / 1e12;
  printf("copy_bw_TBps %.3f\n", copy_bw);
  CK(cudaFree(c0)); CK(cudaFree(c1));

  const int nh = 32;
  std::vector<int> gqas = {4, 8, 1};
  std::vector<int> heads = {128, 64, 256};
  std::vector<int> batches = {1, 8, 16, 32, 64};
  std::vector<int> ctxs = {1024, 4096, 16384};
  if (argc > 1 && !strcmp(argv[1], "quick")) { heads = {128}; gqas = {4}; }
  const size_t max_kv_bytes = size_t(64) * 16384 * 32 * 128 * 2;  // per K (or V): worst case bf16 GQA1 h128
  void *K, *V; CK(cudaMalloc(&K, max_kv_bytes)); CK(cudaMalloc(&V, max_kv_bytes));
  // random-ish fill once (values in a small range)
  {
    std::vector<uint16_t> h(size_t(64) << 20);
    std::mt19937 g(1);
    for (auto& x : h) { float f = std::uniform_real_distribution<float>(-1, 1)(g); uint32_t u; memcpy(&u, &f, 4); x = (uint16_t)(u >> 16); }
    size_t hb = h.size() * 2;
    for (size_t o = 0; o < max_kv_bytes; o += hb) { size_t n = std::min(hb, max_kv_bytes - o); CK(cudaMemcpy((char*)K + o, h.data(), n, cudaMemcpyHostToDevice)); CK(cudaMemcpy((char*)V + o, h.data() + 7, n - 16, cudaMemcpyHostToDevice)); }
  }
  float *scales; CK(cudaMalloc(&scales, 8)); float one[2] = {1.f, 1.f}; CK(cudaMemcpy(scales, one, 8, cudaMemcpyHostToDevice));
  printf("dtype head gqa batch ctx kernel arm us_median us_min us_max ratio_vs_stock ratio_lo ratio_hi kv_frac_copy identical\n");
  for (int dt = 1; dt >= 0; dt--)
  for (int hs : heads) for (int gq : gqas) for (int b : batches) for (int ctx : ctxs) {
    const int nkv = nh / gq;
    const int bs = 16, max_blocks = ctx / bs;
    const size_t block_elems = size_t(nkv) * hs * bs;
    const size_t pool_blocks = max_kv_bytes / 2 / block_elems;
    const size_t need = size_t(b) * max_blocks;
    if (need > pool_blocks) continue;
    std::vector<int> bt(need); std::vector<int> perm(pool_blocks);
    for (size_t i = 0; i < pool_blocks; i++) perm[i] = (int)i;
    std::mt19937 g(b * 131 + ctx); std::shuffle(perm.begin(), perm.end(), g);
    for (size_t i = 0; i < need; i++) bt[i] = perm[i];
    std::vector<int> sl(b);
    for (int i = 0; i < b; i++) sl[i] = ctx - (i * 37) % 97;  // ragged, last block partial
    int max_seq = *std::max_element(sl.begin(), sl.end());
    int *dbt, *dsl; CK(cudaMalloc(&dbt, need * 4)); CK(cudaMalloc(&dsl, b * 4));
    CK(cudaMemcpy(dbt, bt.data(), need * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dsl, sl.data(), b * 4, cudaMemcpyHostToDevice));
    void *q, *out, *tmp; float *es, *ml;
    const int parts = (max_seq + 511) / 512;
    CK(cudaMalloc(&q, size_t(b) * nh * hs * 2)); CK(cudaMemcpy(q, K, size_t(b) * nh * hs * 2, cudaMemcpyDeviceToDevice));
    CK(cudaMalloc(&out, size_t(b) * nh * hs * 2)); CK(cudaMalloc(&tmp, size_t(b) * nh * parts * hs * 2));
    CK(cudaMalloc(&es, size_t(b) * nh * parts * 4)); CK(cudaMalloc(&ml, size_t(b) * nh * parts * 4));
    Args a{out, tmp, es, ml, q, K, V, b, nh, nkv, hs, 0.0883883f, dbt, dsl, max_blocks, max_seq, nh * hs,
           int(block_elems), hs * bs, scales, scales + 1, st};
    const bool v1 = max_seq <= 8192 && (parts == 1 || b * nh > 512);
    std::vector<Arm> arms = {{"stock", 0, 1, false}, {"patched", 1, 1, false}, {"stock_AA", 0, 1, false}};
    for (int H : {gq, 2, 4}) if (H <= gq && gq % H == 0 && (H > 1)) for (bool pf : {false, true}) {
      bool dup = false; for (auto& x : arms) if (x.kind == 2 && x.H == H && x.pf == pf) dup = true;
      if (!dup) arms.push_back({"grouped_H" + std::to_string(H) + (pf ? "_pf" : ""), 2, H, pf});
    }
    // two halves of 4 warps per CTA (2H heads per CTA), H heads each, with the prefetch
    for (int H : {1, 2, 4}) if (2 * H <= gq && gq % (2 * H) == 0) arms.push_back({"grouped_H" + std::to_string(H) + "x2_pf", 3, H, true});
    // reference + identity
    const size_t ob = size_t(b) * nh * hs * 2;
    std::vector<char> ref(ob), got(ob);
    std::vector<int> ok(arms.size(), 1);
    for (size_t i = 0; i < arms.size(); i++) {
      CK(cudaMemset(out, 0xff, ob)); CK(cudaMemset(tmp, 0xff, size_t(b) * nh * parts * hs * 2));
      int rc = run_arm(arms[i], a, dt, v1); CK(cudaStreamSynchronize(st));
      if (rc != 0) { ok[i] = -rc; continue; }
      CK(cudaMemcpy(i == 0 ? ref.data() : got.data(), out, ob, cudaMemcpyDeviceToHost));
      if (i > 0) ok[i] = memcmp(ref.data(), got.data(), ob) == 0;
    }
    std::vector<std::vector<float>> t(arms.size());
    for (int r = 0; r < rounds; r++) for (size_t i = 0; i < arms.size(); i++) {
      if (ok[i] < 0) continue;
      size_t j = (i + r) % arms.size(); if (ok[j] < 0) continue;
      run_arm(arms[j], a, dt, v1);
      cudaEventRecord(e0, st); for (int k = 0; k < reps; k++) run_arm(arms[j], a, dt, v1); cudaEventRecord(e1, st);
      cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); t[j].push_back(ms * 1000 / reps);
    }
    double kvb = 0; for (int s : sl) kvb += double(s) * nkv * hs * 2 * 2;
    std::vector<float> base = t[0];
    for (size_t i = 0; i < arms.size(); i++) {
      if (ok[i] < 0) { printf("%s %d %d %d %d %s %s failed %d\n", dt ? "bf16" : "fp16", hs, gq, b, ctx, v1 ? "v1" : "v2", arms[i].name.c_str(), -ok[i]); continue; }
      std::vector<float> s = t[i]; std::sort(s.begin(), s.end());
      std::vector<float> rr; for (size_t r = 0; r < s.size(); r++) rr.push_back(base[r] / t[i][r]);
      std::sort(rr.begin(), rr.end());
      float med = s[s.size() / 2];
      printf("%s %d %d %d %d %s %s %.2f %.2f %.2f %.3f %.3f %.3f %.3f %d\n", dt ? "bf16" : "fp16", hs, gq, b, ctx, v1 ? "v1" : "v2",
             arms[i].name.c_str(), med, s.front(), s.back(), rr[rr.size() / 2], rr.front(), rr.back(),
             kvb / (med * 1e-6) / 1e12 / copy_bw, ok[i]);
    }
    // ALiBi: the grouped form against stock with random slopes (the launcher in kvpatch never
    // groups an ALiBi launch; this says whether it could)
    if (hs == 128 && b == 8 && ctx != 16384) {
      std::vector<float> slopes(nh);
      std::mt19937 sg(ctx + dt);
      for (auto& x : slopes) x = std::normal_distribution<float>(0.f, 1.f)(sg);
      float* ds; CK(cudaMalloc(&ds, nh * 4)); CK(cudaMemcpy(ds, slopes.data(), nh * 4, cudaMemcpyHostToDevice));
      a.alibi = ds;
      for (size_t i = 0; i < arms.size(); i++) {
        if (ok[i] < 0 || arms[i].name == "stock_AA") continue;
        CK(cudaMemset(out, 0xff, ob));
        if (run_arm(arms[i], a, dt, v1) != 0) continue;
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(i == 0 ? ref.data() : got.data(), out, ob, cudaMemcpyDeviceToHost));
        if (i > 0) printf("alibi %s %d %d %d %d %s %s identical %d\n", dt ? "bf16" : "fp16", hs, gq, b, ctx, v1 ? "v1" : "v2",
                          arms[i].name.c_str(), memcmp(ref.data(), got.data(), ob) == 0);
      }
      a.alibi = nullptr;
      cudaFree(ds);
    }
    fflush(stdout);
    cudaFree(dbt); cudaFree(dsl); cudaFree(q); cudaFree(out); cudaFree(tmp); cudaFree(es); cudaFree(ml);
  }
  return 0;
}
