// Names kept for one release after the `*_ref` rename (device handles are `*_ref`, STYLE.md)
// still name the same entities. Using them warns by design; this file silences the warning
// (it is built with -Werror) to check that the aliases exist and are exact.
#include <catch2/catch.hpp>

#include <type_traits>

#include "kvsift/memory/page_table.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

static_assert(std::is_same_v<kvsift::page_table_view, kvsift::page_table_ref>);

TEST_CASE("page_table::view() is the former name of ref()", "[memory][deprecated]") {
  kvsift::page_table t({.requests = 1,
                        .layers = 1,
                        .heads = 1,
                        .pages_per_head = 8,
                        .segment_pages = 4,
                        .pool_segments = 2});
  t.map({0, 0, 0, 5}, 3);
  const kvsift::page_table_view old_name = t.view();
  const kvsift::page_table_ref ref = t.ref();
  CHECK(old_name.directory == ref.directory);
  CHECK(old_name.pool == ref.pool);
  CHECK(old_name.lookup({0, 0, 0, 5}) == 3);
}

#pragma GCC diagnostic pop
