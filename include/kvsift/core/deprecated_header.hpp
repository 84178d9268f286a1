#pragma once
// KVSIFT_DEPRECATED_HEADER("message"): what a header kept at an old path for one release says
// when it is included. C++ has no [[deprecated]] for headers, so it is a compiler warning
// (`#pragma GCC warning`, understood by GCC and Clang) naming the path to include instead.
// Define KVSIFT_NO_DEPRECATED_HEADER_WARNINGS before including kvsift to silence it.

// The message must be one string literal (GCC prints only the first of adjacent ones): keep it
// short enough that clang-format does not split it.
#define KVSIFT_DETAIL_PRAGMA(x) _Pragma(#x)
#if defined(KVSIFT_NO_DEPRECATED_HEADER_WARNINGS) || !(defined(__GNUC__) || defined(__clang__))
#define KVSIFT_DEPRECATED_HEADER(message)
#else
#define KVSIFT_DEPRECATED_HEADER(message) KVSIFT_DETAIL_PRAGMA(GCC warning message)
#endif
