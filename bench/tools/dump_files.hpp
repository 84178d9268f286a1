#pragma once
// Argument and file helpers shared by the measurement tools that read real dumps
// (bench/data/dump_qk.py layout: L<l>_k0.fbin, L<l>_q<h>.fbin).
#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include <kvsift/io/vector_io.hpp>

namespace kvsift_tools {

/// "a,b,c" -> {a, b, c}. @throw std::invalid_argument / std::out_of_range (std::stoul).
inline std::vector<std::size_t> parse_list(const std::string& s) {
  std::vector<std::size_t> v;
  std::size_t p = 0;
  while (p < s.size()) {
    std::size_t c = s.find(',', p);
    if (c == std::string::npos) c = s.size();
    v.push_back(std::stoul(s.substr(p, c - p)));
    p = c + 1;
  }
  return v;
}

/// Every query head of layer `layer` in `dir`: L<layer>_q0.fbin, L<layer>_q1.fbin, ... up to
/// the first missing file. @throw kvsift::io_error as kvsift::read_fbin.
inline std::vector<kvsift::dense_matrix<float>> read_query_heads(const std::string& dir,
                                                                 const std::string& layer) {
  auto file = [&](int h) { return dir + "/L" + layer + "_q" + std::to_string(h) + ".fbin"; };
  std::vector<kvsift::dense_matrix<float>> out;
  for (int h = 0; std::filesystem::exists(file(h)); ++h) {
    out.push_back(kvsift::read_fbin(kvsift::file_path(file(h))));
  }
  return out;
}

/// The training queries of a GQA-shared build: every head's query at positions 1, 1 + stride,
/// ... below `end`, heads interleaved per position, as one row-major (rows x d) buffer.
inline std::vector<float> strided_queries(const std::vector<kvsift::dense_matrix<float>>& heads,
                                          std::size_t end, std::size_t stride) {
  std::vector<float> out;
  for (std::size_t i = 1; i < end; i += stride) {
    for (const auto& q : heads) out.insert(out.end(), q.view().row(i), q.view().row(i) + q.cols());
  }
  return out;
}

}  // namespace kvsift_tools
