#pragma once
// Batch planning for LLM requests built from table rows ("Optimizing LLM queries in
// relational workloads"): one request per row, its fields serialised in some column order.
// A prefix cache only helps when consecutive requests share a prefix, so the plan
// - orders columns by score = average field length x rows / distinct values: long fields with
//   few distinct values first, as they make the longest shared prefixes;
// - sorts rows lexicographically by the ordered field values, so equal prefixes are adjacent;
// - collapses exact duplicate rows into one request, with a map back to every original row.
// `estimate_hit_rate` (prefix_trie.hpp) scores the resulting request order.
//
// The functions are templates with one defaulted, unused parameter (call them as plain
// functions): their bodies, heavy in hash maps, sets and stable sorts, are then compiled only
// where they are called, not in every translation unit that includes kvsift (0.1 s of the
// umbrella header's compile time; docs/architecture.md, "Compile cost").

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <numeric>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvsift/core/error.hpp"
#include "kvsift/reorder/prefix_trie.hpp"

namespace kvsift {

/// A table: rows of string fields, every row the same width.
using table_rows = std::vector<std::vector<std::string>>;

/// Throws unless every row has the width of row 0. O(rows).
/// @throw invalid_argument naming the first ragged row, its width and the expected one.
template <class = void>
void validate_table(const table_rows& rows) {
  for (std::size_t r = 1; r < rows.size(); ++r) {
    detail::require(rows[r].size() == rows[0].size(), "table: ragged rows: expected ",
                    rows[0].size(), " fields (as row 0), got ", rows[r].size(), " in row ", r);
  }
}

/// Splits text into words at whitespace and ASCII punctuation (the separators are dropped):
/// the token model of the reorder estimates. O(len).
template <class = void>
[[nodiscard]] std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  auto is_sep = [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 128 && (std::isspace(u) || std::ispunct(u));
  };
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || is_sep(text[i])) {
      if (i > start) out.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

/// Maps words to dense token ids, assigning new ids on first sight.
/// Thread safety: not thread-safe (encode mutates).
class token_vocab {
 public:
  /// Appends the token ids of `text` (split_words) to `out`. O(len) expected.
  template <class = void>
  void encode(std::string_view text, std::vector<token_id>& out) {
    for (auto w : split_words(text)) {
      auto [it, added] = ids_.try_emplace(std::string(w), static_cast<token_id>(ids_.size()));
      out.push_back(it->second);
    }
  }
  [[nodiscard]] std::size_t size() const noexcept { return ids_.size(); }

 private:
  std::unordered_map<std::string, token_id> ids_;
};

/// Per-column statistics behind the column order.
struct column_score {
  std::size_t column = 0;
  double avg_tokens = 0;     ///< mean split_words count of the field
  std::size_t distinct = 0;  ///< distinct values
  double score = 0;          ///< avg_tokens * rows / distinct
};

/// Scores of every column, in column order. O(rows * row length).
/// @throw invalid_argument for ragged rows.
template <class = void>
[[nodiscard]] std::vector<column_score> column_scores(const table_rows& rows) {
  validate_table(rows);
  const std::size_t cols = rows.empty() ? 0 : rows[0].size();
  std::vector<column_score> out(cols);
  for (std::size_t c = 0; c < cols; ++c) {
    std::set<std::string_view> values;
    double tokens = 0;
    for (const auto& r : rows) {
      values.insert(r[c]);
      tokens += static_cast<double>(split_words(r[c]).size());
    }
    const double n = static_cast<double>(rows.size());
    out[c] = {c, tokens / n, values.size(), tokens / n * n / static_cast<double>(values.size())};
  }
  return out;
}

/// What to apply when planning a batch; all on by default.
struct batch_plan_params {
  bool reorder_columns = true;
  bool sort_rows = true;
  bool dedup = true;
};

/// A batch plan: serialise fields in `columns` order and send `requests` in order; original
/// row i takes the answer of request `request_of_row[i]`.
struct batch_plan {
  std::vector<std::size_t> columns;         ///< field order (a permutation of the columns)
  std::vector<std::size_t> requests;        ///< original row index of each request, in order
  std::vector<std::size_t> request_of_row;  ///< per original row: index into requests
};

/// Plans a batch. Column ties keep the original column order; row sort is stable.
/// Complexity O(rows log rows * row length). Thread safety: pure function.
/// @throw invalid_argument for ragged rows.
template <class = void>
[[nodiscard]] batch_plan plan_batch(const table_rows& rows, const batch_plan_params& p = {}) {
  const auto scores = column_scores(rows);  // validates
  batch_plan plan;
  plan.columns.resize(scores.size());
  std::iota(plan.columns.begin(), plan.columns.end(), std::size_t{0});
  if (p.reorder_columns) {
    std::stable_sort(plan.columns.begin(), plan.columns.end(), [&](std::size_t a, std::size_t b) {
      return scores[a].score > scores[b].score;
    });
  }
  std::vector<std::size_t> order(rows.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  auto less = [&](std::size_t a, std::size_t b) {
    for (std::size_t c : plan.columns) {
      if (rows[a][c] != rows[b][c]) return rows[a][c] < rows[b][c];
    }
    return false;
  };
  if (p.sort_rows) std::stable_sort(order.begin(), order.end(), less);
  plan.request_of_row.assign(rows.size(), 0);
  if (p.dedup) {
    // Hashing the whole row finds duplicates whether or not the rows were sorted.
    std::unordered_map<std::string, std::size_t> seen;
    for (std::size_t r : order) {
      std::string key;
      for (const auto& f : rows[r]) {
        key += std::to_string(f.size());
        key += ':';
        key += f;
      }
      auto [it, added] = seen.try_emplace(std::move(key), plan.requests.size());
      if (added) plan.requests.push_back(r);
      plan.request_of_row[r] = it->second;
    }
  } else {
    plan.requests = order;
    for (std::size_t i = 0; i < order.size(); ++i) plan.request_of_row[order[i]] = i;
  }
  return plan;
}

/// Token sequences of the plan's requests: for each column in plan order, the words of
/// `header[column]` (when a header is given) then of the field. O(total text).
/// @throw invalid_argument for ragged rows, a header of the wrong width, or a plan whose
///        columns or requests do not fit the table.
template <class = void>
[[nodiscard]] std::vector<std::vector<token_id>> request_tokens(
    const table_rows& rows, const batch_plan& plan, token_vocab& vocab,
    const std::vector<std::string>& header = {}) {
  validate_table(rows);
  const std::size_t cols = rows.empty() ? 0 : rows[0].size();
  detail::require(header.empty() || header.size() == cols, "request_tokens: expected a header of ",
                  cols, " names, got ", header.size());
  for (std::size_t c : plan.columns) {
    detail::require(c < cols, "request_tokens: plan column ", c, " is not below ", cols);
  }
  for (std::size_t r : plan.requests) {
    detail::require(r < rows.size(), "request_tokens: plan row ", r, " is not below ", rows.size());
  }
  std::vector<std::vector<token_id>> out(plan.requests.size());
  for (std::size_t i = 0; i < plan.requests.size(); ++i) {
    for (std::size_t c : plan.columns) {
      if (!header.empty()) vocab.encode(header[c], out[i]);
      vocab.encode(rows[plan.requests[i]][c], out[i]);
    }
  }
  return out;
}

}  // namespace kvsift
