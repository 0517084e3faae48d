# One precompiled <telar/telar.hpp> shared by Telar's own tests and examples
# (not installed; a consumer's build is untouched). Parsing Telar, Kokkos and
# the standard headers costs every test and example about 4 s of CPU before
# it instantiates anything (g++ 12, -O3); with about 70 such translation units
# per CI pass that was several minutes of the CI budget (docs/design.md,
# "Compile time"). The header itself is compiled once, into the object
# library telar_pch; telar_reuse_pch(<target>) makes a target use it.
#
# The self-contained header check (tests/CMakeLists.txt) must not use it: it
# would hide a header's missing include. If the compiler cannot use the
# precompiled header (other flags or definitions), it reads telar.hpp as
# text instead: slower, never wrong. -DTELAR_PCH=OFF turns it off (ccache,
# include-what-you-use).
option(TELAR_PCH "Share one precompiled <telar/telar.hpp> among Telar's tests and examples" ON)
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
