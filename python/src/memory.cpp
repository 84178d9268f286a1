// KV memory management in the Python module: BufferElasticity (Spin's page budget shared by
// the active requests) and its per-pair page limits, which kvsift.cuda.OffloadedKV.attend
// takes as `limits`.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "common.hpp"
#include "kvsift/memory/buffer_elasticity.hpp"

namespace kvsift_python {
namespace {

std::size_t count_of(std::int64_t v, const char* what) {
  return non_negative(v, "BufferElasticity", what);
}

std::uint64_t request_of(std::int64_t v) { return count_of(v, "a request id"); }

py::list taken_list(const std::vector<kvsift::reclaimed_pages>& taken) {
  py::list out;
  for (const auto& t : taken) out.append(py::make_tuple(t.request, t.pages));
  return out;
}

}  // namespace

void bind_memory(py::module_& m) {
  using kvsift::buffer_elasticity;
  py::class_<buffer_elasticity>(
      m, "BufferElasticity",
      "Spin's buffer elasticity: a GPU page budget shared by the active requests. A request\n"
      "holds mandatory pages (what this step's selection needs) and buffering pages (kept to\n"
      "raise the hit ratio); mandatory growth takes free pages, then the request's own buffer,\n"
      "then the other requests' buffers in proportion to their length. pair_limits turns the\n"
      "allocations into per-(request, KV head) page limits for kvsift.cuda.OffloadedKV.attend.\n"
      "Not thread-safe: one caller at a time.")
      .def(py::init([](std::int64_t total_pages) {
             return buffer_elasticity(count_of(total_pages, "total_pages"));
           }),
           py::arg("total_pages"))
      .def_property_readonly("total_pages", &buffer_elasticity::total_pages)
      .def_property_readonly("free_pages", &buffer_elasticity::free_pages)
      .def_property_readonly("active", &buffer_elasticity::active)
      .def(
          "allocation",
          [](const buffer_elasticity& b, std::int64_t request) {
            const auto& a = b.allocation_of(request_of(request));
            return py::make_tuple(a.length, a.mandatory, a.buffer);
          },
          py::arg("request"),
          "(length, mandatory, buffer) of an active request; OutOfRange if it is not active.")
      .def(
          "admit",
          [](buffer_elasticity& b, std::int64_t request, std::int64_t length,
             std::int64_t mandatory, std::int64_t buffer) {
            return b.admit(request_of(request), count_of(length, "length"),
                           count_of(mandatory, "mandatory"), count_of(buffer, "buffer"));
          },
          py::arg("request"), py::arg("length"), py::arg("mandatory"), py::arg("buffer"),
          "Admits the request if mandatory + buffer pages are free; False (nothing changes)\n"
          "otherwise. ValueError for an active request or length 0.")
      .def(
          "set_mandatory",
          [](buffer_elasticity& b, std::int64_t request, std::int64_t length,
             std::int64_t mandatory) {
            std::vector<kvsift::reclaimed_pages> taken;
            b.set_mandatory(request_of(request), count_of(length, "length"),
                            count_of(mandatory, "mandatory"), taken);
            return taken_list(taken);
          },
          py::arg("request"), py::arg("length"), py::arg("mandatory"),
          "Sets this step's mandatory pages; returns [(request, pages)] taken from other\n"
          "requests' buffers. ValueError (nothing changes) when free and buffering pages\n"
          "cannot cover the demand.")
      .def(
          "reclaim",
          [](buffer_elasticity& b, std::int64_t pages) {
            std::vector<kvsift::reclaimed_pages> taken;
            b.reclaim(count_of(pages, "pages"), taken);
            return taken_list(taken);
          },
          py::arg("pages"),
          "Frees `pages` buffering pages, taken in proportion to length; returns [(request,\n"
          "pages)].")
      .def(
          "distribute_free",
          [](buffer_elasticity& b) {
            std::vector<kvsift::reclaimed_pages> given;
            b.distribute_free(given);
            return taken_list(given);
          },
          "Lends every free page to the active requests as buffering pages, in proportion to\n"
          "their length; returns [(request, pages)]. Call it once per step after set_mandatory.")
      .def(
          "release",
          [](buffer_elasticity& b, std::int64_t request) { b.release(request_of(request)); },
          py::arg("request"))
      .def(
          "pair_limits",
          [](const buffer_elasticity& b, const std::vector<std::int64_t>& requests,
             const std::vector<std::int64_t>& pair_mandatory) {
            std::vector<std::uint64_t> reqs;
            reqs.reserve(requests.size());
            for (const auto r : requests) reqs.push_back(request_of(r));
            std::vector<std::size_t> mand;
            mand.reserve(pair_mandatory.size());
            for (const auto v : pair_mandatory) mand.push_back(count_of(v, "pair_mandatory"));
            std::vector<std::uint32_t> limits(mand.size());
            kvsift::pair_page_limits(b, reqs, mand, limits);
            py::array_t<std::int32_t> out(static_cast<py::ssize_t>(limits.size()));
            auto* o = out.mutable_data();
            for (std::size_t i = 0; i < limits.size(); ++i) {
              require(
                  limits[i] <= static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max()),
                  "BufferElasticity.pair_limits: pair ", i, "'s limit of ", limits[i],
                  " pages does not fit int32");
              o[i] = static_cast<std::int32_t>(limits[i]);
            }
            return out;
          },
          py::arg("requests"), py::arg("pair_mandatory"),
          "Per-pair page limits (int32 numpy array, requests x KV heads): pair (i, h) gets its\n"
          "mandatory pages plus an equal share of request i's buffering pages. Call\n"
          "set_mandatory(request, length, sum of its pairs' mandatory pages) first; ValueError\n"
          "if the sums disagree or the shapes do not match.");
}

}  // namespace kvsift_python
