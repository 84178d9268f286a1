#pragma once
// Non-owning, row-major, strided view of a matrix of vectors (one vector per row).

#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>

#include "kvsift/core/element.hpp"
#include "kvsift/core/error.hpp"

namespace kvsift {

/// Row-major strided view. `T` may be const-qualified; `stride` is in elements and >= cols.
/// Trivially copyable; never owns memory. Thread safety: as safe as the memory it views.
template <Element T>
class matrix_view {
 public:
  using element_type = T;
  using value_type = std::remove_const_t<T>;

  constexpr matrix_view() = default;

  /// @throw invalid_argument if stride < cols, or data is null for a non-empty shape.
  matrix_view(T* data, std::size_t rows, std::size_t cols, std::size_t stride = 0)
      : data_(data), rows_(rows), cols_(cols), stride_(stride == 0 ? cols : stride) {
    detail::require(stride_ >= cols_, "matrix_view: stride must be >= cols (", cols_, "), got ",
                    stride_);
    detail::require(data_ != nullptr || rows_ == 0 || cols_ == 0, "matrix_view: null data for a ",
                    rows_, " x ", cols_, " view");
  }

  /// Implicit conversion to the view of const elements of the same type (never to another
  /// element type: a f16 view must not pass where f32 rows are expected).
  // NOLINTNEXTLINE(google-explicit-constructor)
  operator matrix_view<const value_type>() const noexcept requires(!std::is_const_v<T>) {
    return matrix_view<const value_type>(data_, rows_, cols_, stride_);
  }

  [[nodiscard]] constexpr std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] constexpr std::size_t cols() const noexcept { return cols_; }
  [[nodiscard]] constexpr std::size_t stride() const noexcept { return stride_; }
  [[nodiscard]] constexpr bool empty() const noexcept { return rows_ == 0; }
  [[nodiscard]] constexpr T* data() const noexcept { return data_; }
  [[nodiscard]] constexpr bool contiguous() const noexcept { return stride_ == cols_; }

  /// Pointer to row i. No bounds check (hot path); use `at` for a checked access.
  [[nodiscard]] constexpr T* row(std::size_t i) const noexcept { return data_ + i * stride_; }
  [[nodiscard]] std::span<T> row_span(std::size_t i) const noexcept { return {row(i), cols_}; }
  [[nodiscard]] constexpr T& operator()(std::size_t i, std::size_t j) const noexcept {
    return data_[i * stride_ + j];
  }

  /// Rows [first, first + count).
  /// @throw out_of_range if the range exceeds rows().
  [[nodiscard]] matrix_view row_range(std::size_t first, std::size_t count) const {
    detail::require<out_of_range>(first <= rows_ && count <= rows_ - first,
                                  "matrix_view::row_range: rows [", first, ", ", first + count,
                                  ") exceed ", rows_, " rows");
    return matrix_view(data_ + first * stride_, count, cols_, stride_);
  }

 private:
  T* data_ = nullptr;
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  std::size_t stride_ = 0;
};

template <Element T>
matrix_view(T*, std::size_t, std::size_t, std::size_t) -> matrix_view<T>;
template <Element T>
matrix_view(T*, std::size_t, std::size_t) -> matrix_view<T>;

/// Throws `non_finite_value` naming the first NaN/Inf element found (row, col), e.g. before a
/// build mutates anything. O(rows * cols).
template <Element T>
void require_finite(matrix_view<T> m, const char* what) {
  for (std::size_t i = 0; i < m.rows(); ++i) {
    const T* r = m.row(i);
    for (std::size_t j = 0; j < m.cols(); ++j) {
      if (!std::isfinite(to_float(r[j]))) [[unlikely]] {
        detail::fail<non_finite_value>(what, ": expected finite values, got ", to_float(r[j]),
                                       " at row ", i, ", column ", j);
      }
    }
  }
}

/// Throws `invalid_argument` if a non-empty set of `rows` vectors has dimension 0: a 0-dim
/// vector has no data, so a store of them would hand out null rows (memcpy(nullptr) in the
/// kernels) and a file of them would describe billions of phantom rows. O(1).
inline void require_vector_dim(std::size_t rows, std::size_t cols, const char* what) {
  detail::require(rows == 0 || cols > 0, what, ": expected vectors of dimension > 0, got ", rows,
                  " x ", cols);
}

/// Throws `dimension_mismatch` unless `actual == expected`.
inline void require_dim(std::size_t expected, std::size_t actual, const char* what) {
  detail::require<dimension_mismatch>(expected == actual, what, ": expected dimension ", expected,
                                      ", got ", actual);
}

}  // namespace kvsift
