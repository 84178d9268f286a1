#pragma once
// Vector stores: how an index reads the vectors it was built over. An index never owns the
// vectors; an engine hands it a borrowed view of its KV memory (`view_store`), or a user who
// wants self-contained ownership uses `owning_store`.

#include <concepts>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/element.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/matrix_view.hpp"

namespace kvsift {

/// Random access to `size()` vectors of dimension `dim()` and element type `value_type`.
/// `row(i)` must be valid for i < size() and stay valid while the index uses the store.
template <class S>
concept VectorStore = requires(const S& s, std::size_t i) {
  typename S::value_type;
  requires Element<typename S::value_type>;
  { s.size() } -> std::convertible_to<std::size_t>;
  { s.dim() } -> std::convertible_to<std::size_t>;
  { s.row(i) } -> std::same_as<const typename S::value_type*>;
};

/// A store whose vectors are one strided matrix: lets builders and flat scans use GEMM.
template <class S>
concept MatrixStore = VectorStore<S> && requires(const S& s) {
  { s.view() } -> std::same_as<matrix_view<const typename S::value_type>>;
};

/// Borrowed store over a strided matrix. Trivially copyable; the caller keeps the memory
/// alive. Thread safety: all members const and safe to call concurrently.
template <Element T>
class view_store {
 public:
  using value_type = std::remove_const_t<T>;

  view_store() = default;
  /// @throw invalid_argument for rows of dimension 0 (`require_vector_dim`). O(1).
  explicit view_store(matrix_view<const value_type> v) : view_(v) {
    require_vector_dim(v.rows(), v.cols(), "view_store");
  }

  [[nodiscard]] std::size_t size() const noexcept { return view_.rows(); }
  [[nodiscard]] std::size_t dim() const noexcept { return view_.cols(); }
  [[nodiscard]] const value_type* row(std::size_t i) const noexcept { return view_.row(i); }
  [[nodiscard]] matrix_view<const value_type> view() const noexcept { return view_; }

 private:
  matrix_view<const value_type> view_;
};

template <Element T>
view_store(matrix_view<T>) -> view_store<std::remove_const_t<T>>;

/// Owning contiguous store (copies the vectors once at construction).
/// Thread safety: const members safe concurrently.
template <Element T>
class owning_store {
 public:
  using value_type = T;

  owning_store() = default;

  /// Copies `v`. O(rows * cols).
  /// @throw invalid_argument for rows of dimension 0 (they would be dropped: size() would be 0).
  explicit owning_store(matrix_view<const T> v)
      : dim_(v.cols()),
        data_((require_vector_dim(v.rows(), v.cols(), "owning_store"),
               checked_mul(v.rows(), v.cols(), "owning_store: elements"))) {
    for (std::size_t i = 0; i < v.rows(); ++i) {
      std::copy(v.row(i), v.row(i) + dim_, data_.begin() + static_cast<std::ptrdiff_t>(i * dim_));
    }
  }

  /// Takes `data` (rows * dim elements, row-major).
  /// @throw dimension_mismatch if data.size() is not a multiple of dim, or dim == 0 with data.
  owning_store(std::vector<T> data, std::size_t dim) : dim_(dim), data_(std::move(data)) {
    detail::require<dimension_mismatch>(
        (dim_ == 0 && data_.empty()) || (dim_ != 0 && data_.size() % dim_ == 0),
        "owning_store: expected a multiple of dim ", dim_, " elements, got ", data_.size());
  }

  [[nodiscard]] std::size_t size() const noexcept { return dim_ == 0 ? 0 : data_.size() / dim_; }
  [[nodiscard]] std::size_t dim() const noexcept { return dim_; }
  [[nodiscard]] const T* row(std::size_t i) const noexcept { return data_.data() + i * dim_; }
  [[nodiscard]] matrix_view<const T> view() const noexcept {
    return matrix_view<const T>(data_.data(), size(), dim_, dim_ == 0 ? 1 : dim_);
  }

 private:
  std::size_t dim_ = 0;
  std::vector<T> data_;
};

static_assert(MatrixStore<view_store<float>>);
static_assert(MatrixStore<view_store<half>>);
static_assert(MatrixStore<owning_store<bfloat16>>);

}  // namespace kvsift
