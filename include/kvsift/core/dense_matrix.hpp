#pragma once
// Owning, row-major, contiguous matrix of vectors (one vector per row).
//
// The index never owns the vectors it searches (it reads them through a VectorStore); this
// type exists for the places that must own them: data loaded from files, converted copies,
// test fixtures. Everything that consumes vectors takes a `matrix_view`, to which a
// dense_matrix converts implicitly.

#include <cstddef>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvsift/core/element.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/matrix_view.hpp"

namespace kvsift {

namespace detail {

/// rows * cols, or throws `E` if the product does not fit in size_t (it would otherwise wrap
/// and let a too-small buffer pass a size check).
template <class E = invalid_argument>
std::size_t checked_element_count(std::size_t rows, std::size_t cols, const char* what) {
  require<E>(cols == 0 || rows <= std::numeric_limits<std::size_t>::max() / cols, what, ": shape ",
             rows, " x ", cols, " overflows size_t");
  return rows * cols;
}

}  // namespace detail

/// Owning row-major matrix with contiguous storage (stride == cols).
///
/// Thread safety: const member functions may be called concurrently; anything that mutates
/// (non-const access included, if the caller writes through it) needs external
/// synchronisation. Views obtained from a matrix dangle once it is destroyed or moved from.
template <Element T>
class dense_matrix {
  static_assert(!std::is_const_v<T>, "dense_matrix owns its elements; use a non-const T");

 public:
  using value_type = T;

  /// An empty 0 x 0 matrix. O(1), noexcept.
  dense_matrix() noexcept = default;

  /// A rows x cols matrix of zeros.
  /// Complexity: O(rows * cols).
  /// @throw invalid_argument if rows * cols overflows size_t; std::bad_alloc on allocation.
  dense_matrix(std::size_t rows, std::size_t cols)
      : data_(detail::checked_element_count(rows, cols, "dense_matrix")),
        rows_(rows),
        cols_(cols) {}

  /// A rows x cols matrix taking ownership of `data` (row-major, size rows * cols).
  /// Complexity: O(1) (the buffer is moved, not copied).
  /// @throw dimension_mismatch if data.size() != rows * cols; invalid_argument if
  ///        rows * cols overflows size_t.
  dense_matrix(std::size_t rows, std::size_t cols, std::vector<T> data)
      : data_(std::move(data)), rows_(rows), cols_(cols) {
    const std::size_t expected = detail::checked_element_count(rows, cols, "dense_matrix");
    detail::require<dimension_mismatch>(data_.size() == expected, "dense_matrix: expected ", rows,
                                        " x ", cols, " = ", expected, " elements, got ",
                                        data_.size());
  }

  dense_matrix(const dense_matrix&) = default;
  dense_matrix& operator=(const dense_matrix&) = default;

  // Hand-written so that a moved-from matrix is a consistent 0 x 0 matrix rather than one
  // whose shape still describes the storage it no longer has.
  dense_matrix(dense_matrix&& other) noexcept
      : data_(std::move(other.data_)),
        rows_(std::exchange(other.rows_, 0)),
        cols_(std::exchange(other.cols_, 0)) {
    other.data_.clear();
  }
  dense_matrix& operator=(dense_matrix&& other) noexcept {
    if (this != &other) {
      data_ = std::move(other.data_);
      other.data_.clear();
      rows_ = std::exchange(other.rows_, 0);
      cols_ = std::exchange(other.cols_, 0);
    }
    return *this;
  }
  ~dense_matrix() = default;

  /// Shape accessors. O(1), noexcept.
  [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::size_t cols() const noexcept { return cols_; }
  /// rows() * cols().
  [[nodiscard]] std::size_t size() const noexcept { return data_.size(); }
  [[nodiscard]] bool empty() const noexcept { return rows_ == 0; }

  /// Pointer to the first element (row-major, stride cols()). May be null when size() == 0.
  /// O(1), noexcept.
  [[nodiscard]] T* data() noexcept { return data_.data(); }
  [[nodiscard]] const T* data() const noexcept { return data_.data(); }

  /// Views of the whole matrix. O(1), noexcept.
  [[nodiscard]] matrix_view<T> view() noexcept { return {data_.data(), rows_, cols_, cols_}; }
  [[nodiscard]] matrix_view<const T> view() const noexcept { return cview(); }
  [[nodiscard]] matrix_view<const T> cview() const noexcept {
    return {data_.data(), rows_, cols_, cols_};
  }

  /// Implicit, so a dense_matrix can be passed wherever a read-only view is taken.
  /// O(1), noexcept. The view must not outlive the matrix.
  operator matrix_view<const T>() const noexcept {  // NOLINT(google-explicit-constructor)
    return cview();
  }

  /// Pointer to row i. Unchecked (hot path): i < rows() is the caller's contract.
  /// O(1), noexcept.
  [[nodiscard]] T* row(std::size_t i) noexcept { return data_.data() + i * cols_; }
  [[nodiscard]] const T* row(std::size_t i) const noexcept { return data_.data() + i * cols_; }

  /// Element (i, j). Unchecked: i < rows() and j < cols() is the caller's contract.
  /// O(1), noexcept.
  [[nodiscard]] T& operator()(std::size_t i, std::size_t j) noexcept {
    return data_[i * cols_ + j];
  }
  [[nodiscard]] const T& operator()(std::size_t i, std::size_t j) const noexcept {
    return data_[i * cols_ + j];
  }

 private:
  std::vector<T> data_;
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
};

/// Copies `src` into a new contiguous matrix of element type `To`, converting through f32
/// (exact for every source type; rounds to nearest even when `To` is 16-bit, with overflow
/// to +-Inf and NaN kept a NaN). Strided views are accepted.
/// Complexity: O(rows * cols). Thread safety: reads `src` only; safe to call concurrently
/// as long as nobody writes the viewed memory.
/// @throw std::bad_alloc on allocation failure.
template <Element To, Element From>
dense_matrix<To> convert(matrix_view<const From> src) {
  dense_matrix<To> out(src.rows(), src.cols());
  for (std::size_t i = 0; i < src.rows(); ++i) {
    const From* in = src.row(i);
    To* dst = out.row(i);
    if constexpr (std::is_same_v<To, From>) {
      if (src.cols() != 0) std::memcpy(dst, in, src.cols() * sizeof(To));
    } else {
      for (std::size_t j = 0; j < src.cols(); ++j) dst[j] = from_float<To>(to_float(in[j]));
    }
  }
  return out;
}

/// Overload for a view of mutable elements (template deduction does not apply the implicit
/// const conversion). Same complexity, thread safety and exceptions.
template <Element To, Element From>
requires(!std::is_const_v<From>) dense_matrix<To> convert(matrix_view<From> src) {
  return convert<To, From>(matrix_view<const From>(src));
}

/// Overload for an owning matrix. Same complexity, thread safety and exceptions.
template <Element To, Element From>
dense_matrix<To> convert(const dense_matrix<From>& src) {
  return convert<To, From>(src.cview());
}

}  // namespace kvsift
