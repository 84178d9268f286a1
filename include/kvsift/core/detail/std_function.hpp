#pragma once
// std::function without the rest of <functional>. In libstdc++ 12, <functional> also brings
// std::bind, the searchers and <unordered_map>, which cost every includer about 0.1 s of
// compile time (tools/compile_time.py) for nothing kvsift uses; libstdc++ defines
// std::function alone in <bits/std_function.h>. Other standard libraries: <functional>.

#include <cstddef>  // defines __GLIBCXX__ when the standard library is libstdc++

#if defined(__GLIBCXX__) && __has_include(<bits/std_function.h>)
#include <bits/std_function.h>
#else
#include <functional>
#endif
