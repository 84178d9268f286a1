#pragma once
// A trie over token ids: which prefix of a new request is already cached (context reuse), and
// a token-level LRU prefix cache simulator built on it. An inference engine with prefix
// caching (vLLM's automatic prefix caching, SGLang's radix attention) skips the prefill of the
// longest cached prefix of a request; the trie answers "how long is it" and, with a capacity,
// models which prefixes survive, so a batch order can be scored before it is run.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvsift/core/error.hpp"

namespace kvsift {

using token_id = std::uint32_t;

/// Trie of cached token sequences with LRU eviction of whole leaf tokens. One node = one cached
/// token (the KV of one position), so `size()` is the cache occupancy in tokens.
/// Eviction removes the least recently used leaf first: a prefix is used whenever a longer
/// sequence through it is, so evicting leaves in LRU order is exact LRU over prefixes.
/// Thread safety: const members safe concurrently; `access` mutates.
class prefix_trie {
 public:
  static constexpr std::size_t unlimited = std::numeric_limits<std::size_t>::max();

  /// @param capacity cached tokens kept (unlimited: never evict).
  /// @throw invalid_argument if capacity == 0.
  explicit prefix_trie(std::size_t capacity = unlimited) : capacity_(capacity) {
    detail::require(capacity > 0, "prefix_trie: expected capacity > 0 tokens, got 0");
    nodes_.push_back({});  // root: the empty prefix, never counted or evicted
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

  /// Length of the longest cached prefix of `tokens`. O(len) expected.
  [[nodiscard]] std::size_t longest_prefix(std::span<const token_id> tokens) const {
    std::uint32_t cur = 0;
    std::size_t len = 0;
    for (token_id t : tokens) {
      auto it = edges_.find(edge(cur, t));
      if (it == edges_.end()) break;
      cur = it->second;
      ++len;
    }
    return len;
  }

  /// Serves a request: returns its longest cached prefix (the tokens whose prefill is
  /// skipped), then caches the whole sequence as most recently used and evicts LRU leaves
  /// until size() <= capacity(). O(len + evictions * log size) expected.
  std::size_t access(std::span<const token_id> tokens) {
    const std::uint64_t now = ++clock_;
    std::uint32_t cur = 0;
    std::size_t hits = 0;
    bool matching = true;
    for (token_id t : tokens) {
      if (nodes_[cur].children == 0 && cur != 0) leaves_.erase({nodes_[cur].last_used, cur});
      nodes_[cur].last_used = now;
      auto it = matching ? edges_.find(edge(cur, t)) : edges_.end();
      if (it != edges_.end()) {
        cur = it->second;
        ++hits;
        continue;
      }
      matching = false;
      const std::uint32_t child = new_node(cur, t);
      ++nodes_[cur].children;
      edges_.emplace(edge(cur, t), child);
      cur = child;
    }
    if (cur != 0) {
      if (nodes_[cur].children == 0) leaves_.erase({nodes_[cur].last_used, cur});
      nodes_[cur].last_used = now;
      if (nodes_[cur].children == 0) leaves_.insert({now, cur});
    }
    while (size_ > capacity_) evict_one();
    return hits;
  }

 private:
  struct node {
    std::uint32_t parent = 0;
    token_id token = 0;
    std::uint32_t children = 0;
    std::uint64_t last_used = 0;
  };

  static std::uint64_t edge(std::uint32_t parent, token_id t) noexcept {
    return (static_cast<std::uint64_t>(parent) << 32) | t;
  }

  std::uint32_t new_node(std::uint32_t parent, token_id t) {
    ++size_;
    node n{parent, t, 0, 0};
    if (!free_.empty()) {
      const std::uint32_t id = free_.back();
      free_.pop_back();
      nodes_[id] = n;
      return id;
    }
    detail::require(nodes_.size() < std::numeric_limits<std::uint32_t>::max(),
                    "prefix_trie: more than 2^32 - 1 cached tokens");
    nodes_.push_back(n);
    return static_cast<std::uint32_t>(nodes_.size() - 1);
  }

  void evict_one() {
    const std::uint32_t id = leaves_.begin()->second;
    leaves_.erase(leaves_.begin());
    const node n = nodes_[id];
    edges_.erase(edge(n.parent, n.token));
    free_.push_back(id);
    --size_;
    if (n.parent != 0 && --nodes_[n.parent].children == 0) {
      leaves_.insert({nodes_[n.parent].last_used, n.parent});
    } else if (n.parent == 0) {
      --nodes_[0].children;
    }
  }

  std::size_t capacity_;
  std::size_t size_ = 0;
  std::uint64_t clock_ = 0;
  std::vector<node> nodes_;
  std::vector<std::uint32_t> free_;
  std::unordered_map<std::uint64_t, std::uint32_t> edges_;
  std::set<std::pair<std::uint64_t, std::uint32_t>> leaves_;  // (last_used, node)
};

/// Estimated token hit rate of serving `requests` in order through an LRU prefix cache.
struct hit_rate_estimate {
  std::size_t hit_tokens = 0;    ///< prefill tokens skipped (longest cached prefix)
  std::size_t total_tokens = 0;  ///< all prefill tokens
  [[nodiscard]] double rate() const noexcept {
    return total_tokens == 0 ? 0.0
                             : static_cast<double>(hit_tokens) / static_cast<double>(total_tokens);
  }
};

/// Serves `requests` in order through a prefix_trie of `capacity` tokens.
/// Complexity O(total tokens * log cache size). Thread safety: pure function.
/// @throw invalid_argument if capacity == 0.
template <class Requests>
[[nodiscard]] hit_rate_estimate estimate_hit_rate(const Requests& requests,
                                                  std::size_t capacity = prefix_trie::unlimited) {
  prefix_trie cache(capacity);
  hit_rate_estimate e;
  for (const auto& r : requests) {
    e.hit_tokens += cache.access(std::span<const token_id>(r.data(), r.size()));
    e.total_tokens += r.size();
  }
  return e;
}

}  // namespace kvsift
