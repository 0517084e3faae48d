# One precompiled <telar/telar.hpp> shared by Telar's examples (not installed;
# a consumer's build is untouched). Every example includes nearly all of
# Telar (examples/common), and Fashion-MNIST is split over six files
# (examples/01_fashion_mnist/fashion_mnist.hpp): parsing telar.hpp costs each
# file 5.5 s of CPU, loading the precompiled header 2.4 s (g++ 12, -O3, load
# 11; docs/design.md, "Compile time"). The tests do not use it: most include
# a few headers, and for those loading all of Telar is slower than parsing
# what they include (test_lr_schedule.cpp: 0.8 s CPU without, 2.2 s with).
# The header itself is compiled once, into the object library telar_pch;
# telar_reuse_pch(<target>) makes a target use it. If the compiler cannot use
# it (other flags or definitions), it reads telar.hpp as text instead: slower,
# never wrong. -DTELAR_PCH=OFF turns it off (ccache, include-what-you-use).
option(TELAR_PCH "Share one precompiled <telar/telar.hpp> among Telar's examples" ON)
if(TELAR_PCH)
  file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/telar_pch.cpp
       CONTENT "// The object library that owns the shared precompiled header (cmake/TelarPch.cmake).\n")
  add_library(telar_pch OBJECT ${PROJECT_BINARY_DIR}/telar_pch.cpp)
  target_link_libraries(telar_pch PRIVATE Telar::telar)
  target_precompile_headers(telar_pch PRIVATE <telar/telar.hpp>)
endif()

# telar_reuse_pch(<target>): <target> (linked to Telar::telar) compiles with
# the shared precompiled header when there is one.
function(telar_reuse_pch target)
  if(TARGET telar_pch)
    target_precompile_headers(${target} REUSE_FROM telar_pch)
  endif()
endfunction()
