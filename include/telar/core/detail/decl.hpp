#pragma once
// TELAR_DECL marks Telar's functions that are not templates. Their
// definitions live in X.ipp beside the header X.hpp that declares them. In the
// header-only build (the default) each header includes its .ipp and the
// functions are inline. A program that links Telar::telar built with
// TELAR_COMPILED_LIBRARY (the default) gets
// TELAR_SEPARATE_COMPILATION: the headers leave their .ipp out and the
// library holds the one compiled copy, so that each of the program's files
// does not generate them again (docs/design.md, "Compile time").
#if defined(TELAR_SEPARATE_COMPILATION)
#define TELAR_DECL
#else
#define TELAR_DECL inline
#endif
