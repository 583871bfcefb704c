// The measurement behind "no fixed-order GEMM for the towers" (README.md of this folder): a fixed-order
// sgemm — each C element beta*c, then + alpha*a*b for p = 0..k-1 in turn, every multiply and add rounded
// on its own, so any x86-64 CPU gives the same bits — tiled 4x8 in SSE registers (GCC vector
// extensions), against OpenBLAS's sgemm, on one tower's GEMMs of the main job's MLP (64 examples:
// forward, weight gradients, input gradients). A record, not part of the build:
//   g++ -O3 fixed_order_gemm_prototype.cpp -lopenblas && OPENBLAS_CORETYPE=Haswell ./a.out
#include <cblas.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include <algorithm>
// C[m x n] = alpha * A[m x k] * B[k x n] + beta*C, row-major, B contiguous rows (transpose packed before)
static void fixed_gemm_nn(int m, int n, int k, float alpha, const float* a, int lda_row, int lda_col, const float* b, int ldb,
                          float beta, float* c, int ldc) {
  // a(i,p) = a[i*lda_row + p*lda_col]
  int i = 0;
  for (; i + 4 <= m; i += 4) {
    int j = 0;
    for (; j + 8 <= n; j += 8) {
      typedef float v4 __attribute__((vector_size(16)));
      v4 acc[4][2];
      for (int r = 0; r < 4; ++r) for (int q = 0; q < 2; ++q) {
        v4 cv; std::memcpy(&cv, c + (i + r) * ldc + j + 4 * q, 16);
        acc[r][q] = beta == 0.0f ? v4{0, 0, 0, 0} : beta * cv;
      }
      for (int p = 0; p < k; ++p) {
        const float* bp = b + p * ldb + j;
        v4 b0, b1; std::memcpy(&b0, bp, 16); std::memcpy(&b1, bp + 4, 16);
        for (int r = 0; r < 4; ++r) {
          const float s = alpha * a[(i + r) * lda_row + p * lda_col];
          acc[r][0] += s * b0;
          acc[r][1] += s * b1;
        }
      }
      for (int r = 0; r < 4; ++r) for (int q = 0; q < 2; ++q) std::memcpy(c + (i + r) * ldc + j + 4 * q, &acc[r][q], 16);
    }
    for (; j < n; ++j) for (int r = 0; r < 4; ++r) {
      float acc = beta == 0.0f ? 0.0f : beta * c[(i + r) * ldc + j];
      for (int p = 0; p < k; ++p) acc += alpha * a[(i + r) * lda_row + p * lda_col] * b[p * ldb + j];
      c[(i + r) * ldc + j] = acc;
    }
  }
  for (; i < m; ++i) for (int j = 0; j < n; ++j) {
    float acc = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    for (int p = 0; p < k; ++p) acc += alpha * a[i * lda_row + p * lda_col] * b[p * ldb + j];
    c[i * ldc + j] = acc;
  }
}
static std::vector<float> packed;
static void fixed_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  const float* bb = b; int ld = ldb;
  if (tb) { packed.resize((size_t)k * n); for (int j = 0; j < n; ++j) for (int p = 0; p < k; ++p) packed[(size_t)p * n + j] = b[(size_t)j * ldb + p]; bb = packed.data(); ld = n; }
  if (ta) fixed_gemm_nn(m, n, k, alpha, a, 1, lda, bb, ld, beta, c, ldc);
  else fixed_gemm_nn(m, n, k, alpha, a, lda, 1, bb, ld, beta, c, ldc);
}
int main() {
  openblas_set_num_threads(1);
  const int B = 64; const int L[4] = {784, 256, 128, 10};
  std::vector<float> x(B * 784), W[3], out[4], d[4], g[3];
  for (auto& v : x) v = (rand() % 1000) / 1000.0f;
  for (int l = 0; l < 3; ++l) { W[l].resize(L[l + 1] * L[l]); for (auto& v : W[l]) v = (rand() % 1000 - 500) / 5000.0f; g[l].resize(W[l].size()); }
  for (int l = 0; l < 4; ++l) { out[l].resize(B * L[l]); d[l].resize(B * L[l]); for (auto& v : d[l]) v = (rand() % 1000 - 500) / 500.0f; }
  out[0] = x;
  auto step = [&](auto gemm) {
    for (int l = 0; l < 3; ++l) gemm(false, true, B, L[l + 1], L[l], 1.0f, out[l].data(), L[l], W[l].data(), L[l], 0.0f, out[l + 1].data(), L[l + 1]);
    for (int l = 2; l >= 0; --l) {
      gemm(true, false, L[l + 1], L[l], B, 1.0f / B, d[l + 1].data(), L[l + 1], out[l].data(), L[l], 0.0f, g[l].data(), L[l]);
      if (l > 0) gemm(false, false, B, L[l], L[l + 1], 1.0f, d[l + 1].data(), L[l + 1], W[l].data(), L[l], 0.0f, d[l].data(), L[l]);
    }
  };
  auto blas = [](bool ta, bool tb, int m, int n, int k, float al, const float* a, int lda, const float* b, int ldb, float be, float* c, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, al, a, lda, b, ldb, be, c, ldc); };
  auto fixed = [](bool ta, bool tb, int m, int n, int k, float al, const float* a, int lda, const float* b, int ldb, float be, float* c, int ldc) {
    fixed_gemm(ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc); };
  // check: same shapes, compare results
  for (int round = 0; round < 5; ++round) {
    double tb_ = 1e9, tf = 1e9;
    for (int r = 0; r < 50; ++r) {
      auto t0 = std::chrono::steady_clock::now(); step(blas); auto t1 = std::chrono::steady_clock::now(); step(fixed); auto t2 = std::chrono::steady_clock::now();
      tb_ = std::min(tb_, std::chrono::duration<double>(t1 - t0).count()); tf = std::min(tf, std::chrono::duration<double>(t2 - t1).count());
    }
    double flops = 0; for (int l = 0; l < 3; ++l) flops += 2.0 * B * L[l] * L[l + 1] * (l > 0 ? 3 : 2);
    std::printf("openblas %.3f ms (%.1f GFLOP/s), fixed-order %.3f ms (%.1f GFLOP/s), ratio %.2f\n", tb_ * 1e3, flops / tb_ / 1e9, tf * 1e3, flops / tf / 1e9, tf / tb_);
  }
}
