// The CPU kernel of the window slot dot products (the 'cpp' formulation of window_slots.py).
//
//   out[r, j] = scale * a[r, :] . table[columns[r, j], :]
//
// for every row r (a (sample, head, query) triple) and slot j: one small dot product per slot, whose key row is
// read from anywhere in the table. Each product is memory-latency bound, so the kernel prefetches the key row
// PREFETCH_DISTANCE slots ahead, and on x86 processors with AVX2 and FMA sums eight channels per instruction with
// the query's channels held in registers (checked once at run time, for 8, 16, 32 and 64 channels; elsewhere a
// portable loop with eight partial sums). Rows are split across torch's intra-op threads.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <atomic>
#include <string>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define CMT_AQR_X86 1
#endif

namespace {

constexpr int64_t PREFETCH_DISTANCE = 16;

struct SlotDotArgs {
  const float* a;
  const float* table;
  int64_t table_stride;
  int64_t table_rows;
  const int64_t* columns;
  float* out;
  int64_t length;
  int64_t dim;
  float scale;
};

// Each loop below copies the arguments into locals first: read through the struct, they would be reloaded after
// every store to `out` (measured 3x slower).

// a prefetch never faults, so a column outside the table (caught where it is read) needs no check here
inline void prefetch_row(const float* table, int64_t stride, const int64_t* columns, int64_t slot, int64_t length) {
  if (slot < length) {
    const char* row = reinterpret_cast<const char*>(table + columns[slot] * stride);
    __builtin_prefetch(row);
    __builtin_prefetch(row + 64);
  }
}

// Returns false at the first column outside [0, table_rows).
bool dot_rows_portable(const SlotDotArgs& args, int64_t begin, int64_t end) {
  const float* table = args.table;
  const int64_t stride = args.table_stride, length = args.length, dim = args.dim;
  const uint64_t rows = static_cast<uint64_t>(args.table_rows);
  const float scale = args.scale;
  for (int64_t r = begin; r < end; ++r) {
    const float* query = args.a + r * dim;
    const int64_t* columns = args.columns + r * length;
    float* out = args.out + r * length;
    for (int64_t j = 0; j < length; ++j) {
      prefetch_row(table, stride, columns, j + PREFETCH_DISTANCE, length);
      if (static_cast<uint64_t>(columns[j]) >= rows) return false;
      const float* key = table + columns[j] * stride;
      float partial[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      int64_t c = 0;
      for (; c + 8 <= dim; c += 8)
        for (int u = 0; u < 8; ++u) partial[u] += query[c + u] * key[c + u];
      float sum = ((partial[0] + partial[4]) + (partial[1] + partial[5])) +
                  ((partial[2] + partial[6]) + (partial[3] + partial[7]));
      for (; c < dim; ++c) sum += query[c] * key[c];
      out[j] = sum * scale;
    }
  }
  return true;
}

#ifdef CMT_AQR_X86
// CHUNKS eight-channel chunks per row (dim = 8 * CHUNKS), the query's chunks held in registers for the whole row.
template <int CHUNKS>
__attribute__((target("avx2,fma"))) bool dot_rows_avx2(const SlotDotArgs& args, int64_t begin, int64_t end) {
  const float* table = args.table;
  const int64_t stride = args.table_stride, length = args.length;
  const uint64_t rows = static_cast<uint64_t>(args.table_rows);
  const float scale = args.scale;
  for (int64_t r = begin; r < end; ++r) {
    const float* query = args.a + r * 8 * CHUNKS;
    const int64_t* columns = args.columns + r * length;
    float* out = args.out + r * length;
    __m256 query8[CHUNKS];
    for (int c = 0; c < CHUNKS; ++c) query8[c] = _mm256_loadu_ps(query + 8 * c);
    for (int64_t j = 0; j < length; ++j) {
      prefetch_row(table, stride, columns, j + PREFETCH_DISTANCE, length);
      if (static_cast<uint64_t>(columns[j]) >= rows) return false;
      const float* key = table + columns[j] * stride;
      __m256 sum8 = _mm256_mul_ps(query8[0], _mm256_loadu_ps(key));
      for (int c = 1; c < CHUNKS; ++c) sum8 = _mm256_fmadd_ps(query8[c], _mm256_loadu_ps(key + 8 * c), sum8);
      __m128 sum4 = _mm_add_ps(_mm256_castps256_ps128(sum8), _mm256_extractf128_ps(sum8, 1));
      sum4 = _mm_add_ps(sum4, _mm_movehl_ps(sum4, sum4));
      sum4 = _mm_add_ss(sum4, _mm_shuffle_ps(sum4, sum4, 1));
      out[j] = _mm_cvtss_f32(sum4) * scale;
    }
  }
  return true;
}

bool cpu_has_avx2_fma() {
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
}
#endif

using RowsKernel = bool (*)(const SlotDotArgs&, int64_t, int64_t);

// the loop for `dim` channels: AVX2 with the query in registers for 8, 16, 32 and 64 channels where the processor
// has AVX2 and FMA, the portable loop otherwise
RowsKernel rows_kernel(int64_t dim, const char** name) {
#ifdef CMT_AQR_X86
  if (cpu_has_avx2_fma()) {
    *name = "avx2";
    switch (dim) {
      case 8: return dot_rows_avx2<1>;
      case 16: return dot_rows_avx2<2>;
      case 32: return dot_rows_avx2<4>;
      case 64: return dot_rows_avx2<8>;
      default: break;
    }
  }
#endif
  *name = "portable";
  return dot_rows_portable;
}

}  // namespace

// a [R, d] float32 contiguous; table [T, d] float32 with unit channel stride; columns [R, L] int64 contiguous.
torch::Tensor slot_dot(const torch::Tensor& a, const torch::Tensor& table, const torch::Tensor& columns,
                       double scale) {
  TORCH_CHECK(a.device().is_cpu() && table.device().is_cpu() && columns.device().is_cpu(),
              "slot_dot: the C++ slot kernel takes CPU tensors");
  TORCH_CHECK(a.scalar_type() == torch::kFloat32 && table.scalar_type() == torch::kFloat32,
              "slot_dot: a and table must be float32, got ", a.scalar_type(), " and ", table.scalar_type());
  TORCH_CHECK(columns.scalar_type() == torch::kInt64, "slot_dot: columns must be int64, got ",
              columns.scalar_type());
  TORCH_CHECK(a.dim() == 2 && table.dim() == 2 && columns.dim() == 2,
              "slot_dot: expected a [R, d], table [T, d] and columns [R, L], got ", a.sizes(), ", ", table.sizes(),
              " and ", columns.sizes());
  TORCH_CHECK(a.size(1) == table.size(1), "slot_dot: a has ", a.size(1), " channels but the table ", table.size(1));
  TORCH_CHECK(a.size(0) == columns.size(0), "slot_dot: a has ", a.size(0), " rows but columns ", columns.size(0));
  TORCH_CHECK(a.is_contiguous() && columns.is_contiguous() && (table.size(0) == 0 || table.stride(1) == 1),
              "slot_dot: a and columns must be contiguous and the table's channels adjacent");
  auto out = torch::empty({columns.size(0), columns.size(1)}, a.options());
  const SlotDotArgs args{a.data_ptr<float>(), table.data_ptr<float>(), table.stride(0), table.size(0),
                         columns.data_ptr<int64_t>(), out.data_ptr<float>(), columns.size(1), a.size(1),
                         static_cast<float>(scale)};
  const char* name = nullptr;
  const RowsKernel kernel = rows_kernel(args.dim, &name);
  std::atomic<bool> in_range{true};
  at::parallel_for(0, columns.size(0), 8, [&](int64_t begin, int64_t end) {
    if (!kernel(args, begin, end)) in_range = false;
  });
  TORCH_CHECK(in_range, "slot_dot: a column is outside the table's ", table.size(0), " rows");
  return out;
}

// which code path slot_dot takes for `dim` channels on this processor (setup's message, the tests)
std::string slot_dot_path(int64_t dim) {
  const char* name = nullptr;
  rows_kernel(dim, &name);
  return name;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("slot_dot", &slot_dot, "scale * a[r] . table[columns[r, j]] for every row r and slot j");
  m.def("slot_dot_path", &slot_dot_path, "the code path slot_dot takes for dim channels on this processor");
}
