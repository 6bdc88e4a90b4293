// y[M, O] = x[M, I] @ dequant(q)[I, O] for 8-bit weights stored [O, I] (or 4-bit, two a byte: [O, I / 2]) in
// groups of J consecutive inputs, each group with a float scale s and offset z (w = q * s + z), read as bytes
// inside the product: the decoding matmul
// of jaxlab.generate.quant.QKernel on XLA:CPU, where a fused dequantize-and-reduce is not vectorized and a
// dequantized dot reads four bytes a weight. The bytes are widened to float32 in registers (AVX-512 where the
// compiler targets it, else loops it vectorizes); output rows are split over XLA's intra-op thread pool.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kLanes = 16;
constexpr int kMaxRows = 16;
constexpr int64_t kRowsPerTask = 64;

struct Args {
  const float *x, *s, *z;
  const uint8_t* q;
  float* y;
  int64_t m, in, group, out, bits;
  const float* xsum;  // [M, G]: each activation row's sum over each group (the offsets' term)
};

// The offsets' term, sum_g z[o, g] xsum[r, g], for every activation row.
template <int M>
void Offsets(const Args& a, int64_t o, float* zacc) {
  const int64_t groups = a.in / a.group;
  for (int r = 0; r < M; ++r) {
    float t = 0.f;
    for (int64_t g = 0; g < groups; ++g) t += a.z[o * groups + g] * a.xsum[r * groups + g];
    zacc[r] = t;
  }
}

// y[r, o] = sum_g s[o, g] (q[o, g, :] . x[r, g, :]) + offsets; each group's dot product is a vector of lane sums,
// scaled into one accumulator per activation row and reduced once. A step reads 16 inputs' weights: 16 bytes
// (8 bits), or the low or high nibbles of a 32-input block's 16 bytes (4 bits: byte k holds input k in its low
// nibble and input k + 16 in its high one, GGML's Q4_1 order).
template <int Bits, int M>
void Row(const Args& a, int64_t o) {
  constexpr int64_t kStep = Bits == 8 ? kLanes : 2 * kLanes;  // inputs per 16 bytes
  const int64_t groups = a.in / a.group;
  const uint8_t* q = a.q + o * (a.in * Bits / 8);
  float zacc[M];
  Offsets<M>(a, o, zacc);
#if defined(__AVX512F__)
  const __m128i low = _mm_set1_epi8(0x0F);
  __m512 acc[M];
  for (int r = 0; r < M; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 dot[M];
    for (int r = 0; r < M; ++r) dot[r] = _mm512_setzero_ps();
    for (int64_t j = g * a.group; j < (g + 1) * a.group; j += kStep) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + j * Bits / 8));
      for (int h = 0; h < kStep / kLanes; ++h) {  // 8 bits: the bytes; 4 bits: low nibbles, then high ones
        const __m128i v = Bits == 8 ? b : _mm_and_si128(h ? _mm_srli_epi16(b, 4) : b, low);
        const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
        for (int r = 0; r < M; ++r) {
          dot[r] = _mm512_fmadd_ps(w, _mm512_loadu_ps(a.x + r * a.in + j + h * kLanes), dot[r]);
        }
      }
    }
    const __m512 sg = _mm512_set1_ps(a.s[o * groups + g]);
    for (int r = 0; r < M; ++r) acc[r] = _mm512_fmadd_ps(dot[r], sg, acc[r]);
  }
  for (int r = 0; r < M; ++r) a.y[r * a.out + o] = _mm512_reduce_add_ps(acc[r]) + zacc[r];
#else
  float acc[M][kLanes] = {};
  for (int64_t g = 0; g < groups; ++g) {
    float dot[M][kLanes] = {};
    for (int64_t j = g * a.group; j < (g + 1) * a.group; j += kStep) {
      for (int h = 0; h < kStep / kLanes; ++h) {
        for (int r = 0; r < M; ++r) {
          for (int l = 0; l < kLanes; ++l) {
            const uint8_t b = q[j * Bits / 8 + (Bits == 8 ? h * kLanes : 0) + l];
            const uint8_t w = Bits == 8 ? b : (h ? b >> 4 : b & 0x0F);
            dot[r][l] += static_cast<float>(w) * a.x[r * a.in + j + h * kLanes + l];
          }
        }
      }
    }
    for (int r = 0; r < M; ++r) {
      for (int l = 0; l < kLanes; ++l) acc[r][l] += dot[r][l] * a.s[o * groups + g];
    }
  }
  for (int r = 0; r < M; ++r) {
    float t = 0.f;
    for (int l = 0; l < kLanes; ++l) t += acc[r][l];
    a.y[r * a.out + o] = t + zacc[r];
  }
#endif
}

template <int M>
void Rows(const Args& a, int64_t o0, int64_t o1) {
  for (int64_t o = o0; o < o1; ++o) {
    if (a.bits == 4) {
      Row<4, M>(a, o);
    } else {
      Row<8, M>(a, o);
    }
  }
}

using RowsFn = void (*)(const Args&, int64_t, int64_t);

template <int... Ms>
constexpr std::array<RowsFn, sizeof...(Ms)> RowsTable(std::integer_sequence<int, Ms...>) {
  return {&Rows<Ms + 1>...};
}

constexpr auto kRows = RowsTable(std::make_integer_sequence<int, kMaxRows>());

// One call's work, shared by the caller and the pool's tasks: chunks of output rows are claimed from `next`, so
// the caller finishes every chunk no task has claimed and never waits on a task that has not started; a late
// task finds nothing to claim (the shared pointer keeps the job alive for it).
struct Job {
  Args a;
  std::vector<float> xsum;
  int64_t chunks;
  std::atomic<int64_t> next{0}, done{0};

  void Drain() {
    for (int64_t c; (c = next.fetch_add(1)) < chunks;) {
      kRows[a.m - 1](a, c * kRowsPerTask, std::min(a.out, (c + 1) * kRowsPerTask));
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Each activation row's sum over each group.
void Prepare(Job& job) {
  Args& a = job.a;
  const int64_t groups = a.in / a.group;
  job.xsum.assign(a.m * groups, 0.f);
  for (int64_t r = 0; r < a.m; ++r) {
    for (int64_t j = 0; j < a.in; ++j) job.xsum[r * groups + j / a.group] += a.x[r * a.in + j];
  }
  a.xsum = job.xsum.data();
}

ffi::Error QMatmulU8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::U8> q, ffi::Buffer<ffi::F32> s,
                     ffi::Buffer<ffi::F32> z, ffi::ResultBuffer<ffi::F32> y, int32_t bits) {
  const auto xd = x.dimensions(), qd = q.dimensions(), sd = s.dimensions(), zd = z.dimensions();
  const int64_t block = bits == 4 ? 2 * kLanes : kLanes;
  if ((bits != 8 && bits != 4) || xd.size() != 2 || qd.size() != 2 || sd.size() != 2 || zd.size() != 2 ||
      xd[1] * bits != qd[1] * 8 || sd[0] != qd[0] || zd[0] != sd[0] || zd[1] != sd[1] || sd[1] < 1 ||
      xd[1] % sd[1] || (xd[1] / sd[1]) % block || xd[0] < 1 || xd[0] > kMaxRows) {
    return ffi::Error::InvalidArgument("jaxlab_qmatmul_u8: expected x [M<=16, I], q [O, I * bits / 8] (bits 8 or 4), "
                                       "s and z [O, G] with I / G a multiple of 16 (8 bits) or 32 (4 bits)");
  }
  auto job = std::make_shared<Job>();
  job->a = Args{x.typed_data(), s.typed_data(), z.typed_data(), q.typed_data(), y->typed_data(), xd[0], xd[1],
                xd[1] / sd[1], qd[0], bits, nullptr};
  Prepare(*job);
  job->chunks = (qd[0] + kRowsPerTask - 1) / kRowsPerTask;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), job->chunks) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([job] { job->Drain(); });
  job->Drain();
  while (job->done.load(std::memory_order_acquire) < job->chunks) {
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxlabQMatmulU8, QMatmulU8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("bits"));
