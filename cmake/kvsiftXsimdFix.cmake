# Debian 12's libxsimd-dev (8.1.0-7) exports target `xsimd` with INTERFACE_LINK_LIBRARIES "xtl"
# but neither finds xtl nor depends on xtl-dev, so every consumer fails to link with
# "cannot find -lxtl". xtl is only needed for XSIMD_ENABLE_XTL_COMPLEX, which kvsift does not use:
# use xtl's target if it can be found, otherwise drop the dangling name.
# Included right after find_package(xsimd) by CMakeLists.txt (xsimd is an optional peer of the
# benchmarks; the installed package does not need it).
if(TARGET xsimd AND NOT TARGET xtl)
  get_target_property(_kvsift_xsimd_libs xsimd INTERFACE_LINK_LIBRARIES)
  if(_kvsift_xsimd_libs AND "xtl" IN_LIST _kvsift_xsimd_libs)
    find_package(xtl QUIET)
    if(NOT TARGET xtl)
      list(REMOVE_ITEM _kvsift_xsimd_libs xtl)
      set_property(TARGET xsimd PROPERTY INTERFACE_LINK_LIBRARIES "${_kvsift_xsimd_libs}")
    endif()
  endif()
  unset(_kvsift_xsimd_libs)
endif()
