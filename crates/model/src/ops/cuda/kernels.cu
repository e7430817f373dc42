// hyperlens's fused CUDA kernels, compiled to PTX at build time by `crates/model/build.rs` (only
// with the crate feature `cuda`) and loaded by `crates/model/src/ops/cuda/` (docs there).
//
// - `hl_adamw_f32`: one AdamW update of every parameter of M models, in place.
// - `hl_mix_forward_f32`, `hl_mix_backward_f32`: the HYLA value network with its normalisation and
//   dropout (the second half of a mix), forward and backward: the CUDA form of the CPU kernel of
//   `crates/model/src/ops/fast/mix/` (`kernel.rs`, `rows.rs`), whose module docs give the formulas.
//
// Every kernel is float32. Sums run in a fixed order (no atomics), so a result does not depend on
// the launch.

#include <stdint.h>

// ------------------------------------------------------------------------------------------------
// AdamW
// ------------------------------------------------------------------------------------------------

// One AdamW update (optax.adamw: eps outside the square root, decay scaled by the learning rate)
// of the flat state of M models, `P` parameters each (model m's row at m * P), in place:
//   m = m b1 + g (1 - b1);  v = v b2 + g^2 (1 - b2)
//   u = (m scale_m) / (sqrt(v scale_v) + eps) [+ theta decay];  theta = theta - lr u
// with the same float32 operations, in the same order and each rounded once (the `_rn`
// intrinsics forbid contracting them into fused multiply-adds), as the composed candle update of
// `crates/train/src/optim.rs`, so that the two agree bit for bit.
//
// moments  [2, M, P]: the first moments, then the second moments (read and written)
// g        [M, P]: the gradients
// decay    [M, P], or null: the weight-decay coefficient of each element (0 where not decayed)
// scalars  [2 + M]: scale_m = 1 / (1 - b1^t), scale_v = 1 / (1 - b2^t), then each model's
//          learning rate: device scalars, rewritten in place before each update, so that the
//          kernel's arguments never change from one update to the next
// params   [n_slots]: the address of each parameter tensor (model m's `len` elements of slot s at
//          params[s] + m * len)
// offsets  [n_slots + 1]: the first element of each slot in a model's row, then P
extern "C" __global__ void hl_adamw_f32(
    float *__restrict__ moments,
    const float *__restrict__ g,
    const float *__restrict__ decay,
    const float *__restrict__ scalars,
    float *const *__restrict__ params,
    const uint32_t *__restrict__ offsets,
    uint32_t n_slots,
    uint32_t p,
    uint32_t models,
    float b1,
    float one_minus_b1,
    float b2,
    float one_minus_b2,
    float eps) {
  const size_t total = (size_t)p * models;
  const float scale_m = scalars[0];
  const float scale_v = scalars[1];
  for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x) {
    const uint32_t row = (uint32_t)(idx / p);
    const uint32_t i = (uint32_t)(idx % p);
    // The slot s with offsets[s] <= i < offsets[s + 1].
    uint32_t lo = 0, hi = n_slots;
    while (hi - lo > 1) {
      const uint32_t mid = (lo + hi) / 2;
      if (offsets[mid] <= i) lo = mid; else hi = mid;
    }
    const uint32_t len = offsets[lo + 1] - offsets[lo];
    float *theta = params[lo] + (size_t)row * len + (i - offsets[lo]);

    const float gi = g[idx];
    // `x * c` of a tensor by a number is candle's affine `x * c + 0`.
    const float m = __fadd_rn(__fadd_rn(__fmul_rn(moments[idx], b1), 0.0f),
                              __fadd_rn(__fmul_rn(gi, one_minus_b1), 0.0f));
    const float v = __fadd_rn(__fadd_rn(__fmul_rn(moments[total + idx], b2), 0.0f),
                              __fadd_rn(__fmul_rn(__fmul_rn(gi, gi), one_minus_b2), 0.0f));
    const float num = __fadd_rn(__fmul_rn(m, scale_m), 0.0f);
    const float den = __fadd_rn(__fsqrt_rn(__fadd_rn(__fmul_rn(v, scale_v), 0.0f)), eps);
    float u = __fdiv_rn(num, den);
    const float th = *theta;
    if (decay != nullptr) u = __fadd_rn(u, __fmul_rn(th, decay[idx]));
    *theta = __fsub_rn(th, __fmul_rn(u, scalars[2 + row]));
    moments[idx] = m;
    moments[total + idx] = v;
  }
}

// ------------------------------------------------------------------------------------------------
// The HYLA mix
// ------------------------------------------------------------------------------------------------
//
// Shapes (all contiguous): scores s [B, H, Q, K], values v [B, H, K, d], output o [B, Q, H, d],
// codes att [B, H, Q, K]; mask `u8 [Q, K]` (1 = visible) or null; dropout multipliers
// `[G, Q, K]`, problem n using mask n / per_mask, or null. `norm`: 0 RMSHead, 1 none, 2 softmax.

#define HL_NORM_RMS_HEAD 0
#define HL_NORM_NONE 1
#define HL_NORM_SOFTMAX 2

// The largest of a warp's values, and their sum (butterfly: every lane gets the result, the same
// on every lane).
__device__ __forceinline__ float hl_warp_max(float x) {
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float hl_warp_sum(float x) {
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// The codes of query i of problem n against every key, into a [H, K] (before dropout) and
// ad [H, K] (after), with the masked scores into m [H, K] and RMSHead's 1 / rms into r [K] when
// they are given (the backward pass). Ends with a barrier.
__device__ void hl_mix_codes(
    const float *__restrict__ s,  // this problem's scores [H, Q, K]
    const uint8_t *__restrict__ mask,
    const float *__restrict__ drop,  // this problem's dropout mask [Q, K] or null
    int h, int q, int k, int i, int norm, float rms_eps,
    float *a, float *ad, float *m, float *r) {
  const int tid = threadIdx.x, nt = blockDim.x;
  if (norm == HL_NORM_SOFTMAX) {
    // One warp per head row: the maximum and the sum over the visible keys.
    const int warp = tid / 32, lane = tid % 32, warps = nt / 32;
    for (int hh = warp; hh < h; hh += warps) {
      const float *row = s + ((size_t)hh * q + i) * k;
      float mx = -INFINITY;
      for (int j = lane; j < k; j += 32) {
        const bool on = mask == nullptr || mask[i * k + j] != 0;
        if (on && row[j] > mx) mx = row[j];
      }
      mx = hl_warp_max(mx);
      float *out = a + hh * k;
      if (mx == -INFINITY) {
        // No visible key: uniform, as the reference's fill with the lowest float gives.
        for (int j = lane; j < k; j += 32) out[j] = 1.0f / (float)k;
      } else {
        float sum = 0.0f;
        for (int j = lane; j < k; j += 32) {
          const bool on = mask == nullptr || mask[i * k + j] != 0;
          const float e = on ? expf(row[j] - mx) : 0.0f;
          out[j] = e;
          sum += e;
        }
        const float inv = 1.0f / hl_warp_sum(sum);
        for (int j = lane; j < k; j += 32) out[j] *= inv;
      }
    }
  } else {
    for (int j = tid; j < k; j += nt) {
      const bool on = mask == nullptr || mask[i * k + j] != 0;
      if (norm == HL_NORM_RMS_HEAD) {
        float ss = 0.0f;
        for (int hh = 0; hh < h; ++hh) {
          const float x = on ? s[((size_t)hh * q + i) * k + j] : 0.0f;
          ss += x * x;
        }
        const float rj = 1.0f / sqrtf(ss / (float)h + rms_eps);
        if (r != nullptr) r[j] = rj;
        for (int hh = 0; hh < h; ++hh) {
          const float x = on ? s[((size_t)hh * q + i) * k + j] : 0.0f;
          if (m != nullptr) m[hh * k + j] = x;
          a[hh * k + j] = x * rj;
        }
      } else {
        for (int hh = 0; hh < h; ++hh) {
          const float x = on ? s[((size_t)hh * q + i) * k + j] : 0.0f;
          if (m != nullptr) m[hh * k + j] = x;
          a[hh * k + j] = x;
        }
      }
    }
  }
  __syncthreads();
  for (int x = tid; x < h * k; x += nt) {
    const int j = x % k;
    ad[x] = drop == nullptr ? a[x] : a[x] * drop[i * k + j];
  }
  __syncthreads();
}

// The hidden units of one query, pre [d, K] (before the activation, when given) and hid [d, K],
// from its codes after dropout ad [H, K] and the problem's values v [H, K, d]. Ends with a barrier.
__device__ void hl_mix_hidden(
    const float *__restrict__ v, const float *ad, int h, int k, int d, int relu,
    float *pre, float *hid) {
  for (int x = threadIdx.x; x < d * k; x += blockDim.x) {
    const int e = x / k, j = x % k;
    float acc = 0.0f;
    for (int hh = 0; hh < h; ++hh) acc += ad[hh * k + j] * v[((size_t)hh * k + j) * d + e];
    if (pre != nullptr) pre[x] = acc;
    hid[x] = relu ? fmaxf(acc, 0.0f) : acc;
  }
  __syncthreads();
}

// Forward: one block per (problem, query), grid B * Q. Shared memory: 2 H K + d K floats.
extern "C" __global__ void hl_mix_forward_f32(
    const float *__restrict__ s,
    const float *__restrict__ v,
    const uint8_t *__restrict__ mask,
    const float *__restrict__ dropout,
    float *__restrict__ o,
    float *__restrict__ att,
    int h, int q, int k, int d, int norm, int relu, int per_mask, float rms_eps) {
  extern __shared__ float shared[];
  float *a = shared;          // [H, K]
  float *ad = a + h * k;      // [H, K]
  float *hid = ad + h * k;    // [d, K]
  const int n = blockIdx.x / q, i = blockIdx.x % q;
  const float *sn = s + (size_t)n * h * q * k;
  const float *vn = v + (size_t)n * h * k * d;
  const float *drop = dropout == nullptr ? nullptr : dropout + (size_t)(n / per_mask) * q * k;
  hl_mix_codes(sn, mask, drop, h, q, k, i, norm, rms_eps, a, ad, nullptr, nullptr);
  for (int x = threadIdx.x; x < h * k; x += blockDim.x) {
    const int hh = x / k, j = x % k;
    att[(((size_t)n * h + hh) * q + i) * k + j] = a[x];
  }
  hl_mix_hidden(vn, ad, h, k, d, relu, nullptr, hid);
  for (int x = threadIdx.x; x < h * d; x += blockDim.x) {
    const int hh = x / d, e = x % d;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc += ad[hh * k + j] * hid[e * k + j];
    o[(((size_t)n * q + i) * h + hh) * d + e] = acc;
  }
}

// Backward: one block per problem, grid B; the block runs over the queries in order and keeps the
// values' gradient, a sum over the queries, in shared memory. Shared memory:
// 4 H K + 2 K + 3 d K + H d + H + H K d floats.
extern "C" __global__ void hl_mix_backward_f32(
    const float *__restrict__ s,
    const float *__restrict__ v,
    const uint8_t *__restrict__ mask,
    const float *__restrict__ dropout,
    const float *__restrict__ go,  // [B, Q, H, d]
    float *__restrict__ gs,        // [B, H, Q, K]
    float *__restrict__ gv,        // [B, H, K, d]
    int h, int q, int k, int d, int norm, int relu, int per_mask, float rms_eps) {
  extern __shared__ float shared[];
  float *a = shared;           // [H, K] codes
  float *ad = a + h * k;       // [H, K] after dropout
  float *m = ad + h * k;       // [H, K] masked scores
  float *ga = m + h * k;       // [H, K] gradient of the codes
  float *r = ga + h * k;       // [K] RMSHead's 1 / rms
  float *c = r + k;            // [K] RMSHead's m r^3 factor
  float *pre = c + k;          // [d, K]
  float *hid = pre + d * k;    // [d, K]
  float *gpre = hid + d * k;   // [d, K]
  float *gq = gpre + d * k;    // [H, d] the output gradient of this query
  float *t = gq + h * d;       // [H] softmax: sum_j a ga per head
  float *gvs = t + h;          // [H, K, d] the values' gradient, summed over the queries
  const int tid = threadIdx.x, nt = blockDim.x;
  const int n = blockIdx.x;
  const float *sn = s + (size_t)n * h * q * k;
  const float *vn = v + (size_t)n * h * k * d;
  const float *drop = dropout == nullptr ? nullptr : dropout + (size_t)(n / per_mask) * q * k;
  for (int x = tid; x < h * k * d; x += nt) gvs[x] = 0.0f;
  for (int i = 0; i < q; ++i) {
    hl_mix_codes(sn, mask, drop, h, q, k, i, norm, rms_eps, a, ad, m, r);
    for (int x = tid; x < h * d; x += nt) gq[x] = go[(((size_t)n * q + i) * h) * d + x];
    hl_mix_hidden(vn, ad, h, k, d, relu, pre, hid);
    // g_pre[e, j] = sum_h go[h, e] ad[h, j], 0 where the ReLU is off.
    for (int x = tid; x < d * k; x += nt) {
      const int e = x / k, j = x % k;
      float acc = 0.0f;
      for (int hh = 0; hh < h; ++hh) acc += gq[hh * d + e] * ad[hh * k + j];
      gpre[x] = (relu && pre[x] <= 0.0f) ? 0.0f : acc;
    }
    __syncthreads();
    // g_a'[h, j] = sum_e go[h, e] hid[e, j] + g_pre[e, j] v[h, j, e]; g_v[h, j, e] += ad g_pre;
    // g_a = g_a' drop.
    for (int x = tid; x < h * k; x += nt) {
      const int hh = x / k, j = x % k;
      const float *vj = vn + ((size_t)hh * k + j) * d;
      float acc = 0.0f;
      for (int e = 0; e < d; ++e) {
        acc += gq[hh * d + e] * hid[e * k + j] + gpre[e * k + j] * vj[e];
        gvs[x * d + e] += ad[x] * gpre[e * k + j];
      }
      ga[x] = drop == nullptr ? acc : acc * drop[i * k + j];
    }
    __syncthreads();
    if (norm == HL_NORM_RMS_HEAD) {
      for (int j = tid; j < k; j += nt) {
        float acc = 0.0f;
        for (int hh = 0; hh < h; ++hh) acc += ga[hh * k + j] * m[hh * k + j];
        c[j] = acc / (float)h * r[j] * r[j] * r[j];
      }
    } else if (norm == HL_NORM_SOFTMAX) {
      for (int hh = tid; hh < h; hh += nt) {
        float acc = 0.0f;
        for (int j = 0; j < k; ++j) acc += a[hh * k + j] * ga[hh * k + j];
        t[hh] = acc;
      }
    }
    __syncthreads();
    for (int x = tid; x < h * k; x += nt) {
      const int hh = x / k, j = x % k;
      float y;
      if (norm == HL_NORM_RMS_HEAD) y = ga[x] * r[j] - m[x] * c[j];
      else if (norm == HL_NORM_SOFTMAX) y = a[x] * (ga[x] - t[hh]);
      else y = ga[x];
      if (mask != nullptr && mask[i * k + j] == 0) y = 0.0f;
      gs[(((size_t)n * h + hh) * q + i) * k + j] = y;
    }
    __syncthreads();
  }
  for (int x = tid; x < h * k * d; x += nt) gv[(size_t)n * h * k * d + x] = gvs[x];
}
